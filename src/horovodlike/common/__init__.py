"""What every framework module shares. Importing it tells the core where NVIDIA's CUDA and NCCL
wheels are (gpu_libraries.py), before anything can use a GPU, and plugs the runtime's parts into
init() and shutdown(): basics.py is a leaf that the modules above it register with."""

from horovodlike.common import gpu_libraries as _gpu_libraries

_gpu_libraries.register_with_core()

try:
    from horovodlike import _core  # noqa: F401
except ImportError:
    # The launcher imports this package too, and reports a missing or broken core itself
    # (horovodlikerun --check-build); without the core there is nothing to plug in.
    pass
else:
    from horovodlike.common import (elastic, init_process_sets, launcher_watch,  # noqa: F401
                                    point_to_point)
