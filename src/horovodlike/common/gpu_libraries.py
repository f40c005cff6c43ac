"""Where NVIDIA's pip wheels keep the CUDA runtime and NCCL, told to the core once.

The core is compiled without CUDA and loads libcudart and libnccl when a CUDA tensor first
needs them. It looks, in order, at the files named by HOROVOD_CUDART_PATH / HOROVOD_NCCL_PATH,
at the libraries already loaded in the process (a CUDA build of PyTorch loads its own), at the
folders found here, then at the system's library path. This module finds the wheels' folders:

    nvidia-nccl-cu12 / -cu13         nvidia/nccl/lib
    nvidia-cuda-runtime-cu12         nvidia/cuda_runtime/lib
    CUDA 13's runtime wheel          nvidia/cu13/lib

The packages are found with ``importlib.util.find_spec`` and never imported (only their parent
``nvidia``, an empty or namespace package, is): some NCCL wheels have no ``__init__.py`` and so
no ``__file__``, and a package may be spread over several site-packages folders, so every
folder of ``submodule_search_locations`` counts.
"""

import importlib.util
import os
import sys

# The CUDA 12 runtime first: it runs on more drivers than CUDA 13's. A process whose framework
# already loaded a runtime uses that one whatever this order says.
CUDART_PACKAGES = ("nvidia.cuda_runtime", "nvidia.cu13")
NCCL_PACKAGES = ("nvidia.nccl",)

_registered = False


def package_folders(name):
    """The folders of package ``name`` (several for a namespace package), or [] when it is not
    installed; the package itself is not imported."""
    module = sys.modules.get(name)
    if module is not None:
        return list(getattr(module, "__path__", None) or [])
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError, AttributeError):
        # No parent package, a parent that is a plain module, or a broken entry in sys.modules.
        return []
    if spec is None or spec.submodule_search_locations is None:
        return []
    return list(spec.submodule_search_locations)


def library_folders(packages):
    """The existing ``lib`` folders of ``packages``, in order, each once."""
    folders = []
    for package in packages:
        for folder in package_folders(package):
            lib = os.path.join(folder, "lib")
            if os.path.isdir(lib) and lib not in folders:
                folders.append(lib)
    return folders


def cudart_folders():
    """Folders of NVIDIA's CUDA runtime wheels (CUDA 12's, then CUDA 13's)."""
    return library_folders(CUDART_PACKAGES)


def nccl_folders():
    """Folders of NVIDIA's NCCL wheels."""
    return library_folders(NCCL_PACKAGES)


def register_with_core():
    """Hands the wheels' folders to the core (``_core.set_gpu_library_dirs``), once per process,
    before anything can use CUDA. Does nothing when the core does not load (importing it again
    raises the real error where it is used)."""
    global _registered
    if _registered:
        return
    _registered = True
    try:
        from horovodlike import _core
    except ImportError:
        return
    _core.set_gpu_library_dirs(cudart_folders(), nccl_folders())
