"""`horovodlikerun --check-build`: which frameworks, controllers and tensor operations this
build has, in Horovod's layout."""

from __future__ import annotations

import importlib
import importlib.util
import sys

from horovodlike.runner.settings import GLOO, MPI, TCP

# (label, module) in the order they are listed.
FRAMEWORKS = (("PyTorch", "torch"), ("TensorFlow", "tensorflow"), ("Keras", "keras"))
# (label, build_info key)
CONTROLLERS = (("TCP", TCP), ("MPI", MPI), ("Gloo", GLOO))
TENSOR_OPERATIONS = (("TCP", TCP), ("SHM", "shm"), ("MPI", MPI), ("Gloo", GLOO), ("NCCL", "nccl"))
_KNOWN_KEYS = {"version"} | {key for _, key in CONTROLLERS + TENSOR_OPERATIONS}


def detect_frameworks() -> dict[str, bool]:
    """Whether each framework is installed, found without importing it (fast)."""
    found = {}
    for label, module in FRAMEWORKS:
        try:
            found[label] = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found[label] = False
    return found


def _cuda_version(version) -> str:
    """cudaRuntimeGetVersion's 12080 as "12.8"; any other form as given."""
    if isinstance(version, int) and not isinstance(version, bool):
        return f"{version // 1000}.{version % 1000 // 10}"
    return str(version)


def _nccl_version(version) -> str:
    """ncclGetVersion's 22305 as "2.23.5" (2.9 and later; 2708 as "2.7.8" before)."""
    if isinstance(version, int) and not isinstance(version, bool):
        scale = 10000 if version >= 20900 else 1000
        return f"{version // scale}.{version % scale // 100}.{version % 100}"
    return str(version)


def gpu_library_lines(gpu_info: dict) -> list[str]:
    """The CUDA runtime and NCCL the core found, with version and path, or why not (the
    core's error), and the folders it searched."""
    lines = ["GPU Libraries (loaded at run time):"]
    for label, key, version_text in (("CUDA runtime", "cuda", _cuda_version),
                                     ("NCCL", "nccl", _nccl_version)):
        entry = gpu_info.get(key) or {}
        if entry.get("found"):
            text = f"{label} {version_text(entry.get('version'))}: {entry.get('path')}"
            if key == "cuda" and entry.get("devices") is not None:
                text += f" ({entry['devices']} device{'' if entry['devices'] == 1 else 's'})"
            if entry.get("error"):  # found, but not usable as it stands (no device, say)
                text += f"; {entry['error']}"
            lines.append(f"    [X] {text}")
        else:
            lines.append(f"    [ ] {label}: {entry.get('error') or 'not found'}")
    search = list(gpu_info.get("search") or [])
    if len(search) == 2 and all(isinstance(s, (list, tuple)) for s in search):
        # (the CUDA runtime's folders, NCCL's folders)
        for label, folders in (("the CUDA runtime", search[0]), ("NCCL", search[1])):
            if folders:
                lines.append(f"    searched for {label}: " + ", ".join(map(str, folders)))
    elif search:
        lines.append("    searched: " + ", ".join(map(str, search)))
    return lines


def format_report(build_info: dict, frameworks: dict[str, bool],
                  gpu_info: dict | None = None) -> str:
    """The report; ``gpu_info`` (``_core.gpu_info()``, absent from a core built before GPU
    support) adds the GPU libraries and marks NCCL available when it was found."""
    def section(title: str, entries: list[tuple[str, bool]]) -> list[str]:
        return [f"{title}:"] + [f"    [{'X' if on else ' '}] {label}" for label, on in entries]

    nccl_found = bool(((gpu_info or {}).get("nccl") or {}).get("found"))

    lines = [f"horovodlike v{build_info.get('version', 'unknown')}:", ""]
    lines += section("Available Frameworks", [(label, frameworks.get(label, False))
                                              for label, _ in FRAMEWORKS])
    lines.append("")
    lines += section("Available Controllers", [(label, bool(build_info.get(key)))
                                               for label, key in CONTROLLERS])
    lines.append("")
    lines += section("Available Tensor Operations",
                     [(label, bool(build_info.get(key)) or (key == "nccl" and nccl_found))
                      for label, key in TENSOR_OPERATIONS])
    if gpu_info is not None:
        lines.append("")
        lines += gpu_library_lines(gpu_info)
    others = [(key, value) for key, value in build_info.items()
              if key not in _KNOWN_KEYS and isinstance(value, bool)]
    if others:
        lines.append("")
        lines += section("Other Features", others)
    # Which provider runs each collective, tried in order (the core's provider table).
    providers = build_info.get("providers_in_use") or build_info.get("providers") or []
    if providers:
        lines += ["", "Collective Providers (tried in order):"]
        lines += [f"    {op}: {names}" for op, names in providers]
    return "\n".join(lines) + "\n"


def check_build() -> int:
    try:
        core = importlib.import_module("horovodlike._core")
        # Hands the core NVIDIA's wheels' folders before anything (build_info too) loads CUDA.
        importlib.import_module("horovodlike.common")
        build_info = dict(core.build_info())
    except Exception as error:  # ImportError, or a broken extension: either way, say so
        print(f"horovodlikerun: cannot load the horovodlike core (horovodlike._core): {error}\n"
              f"The C++ extension is missing or broken; reinstall with `pip install .` "
              f"from the source tree.", file=sys.stderr)
        return 1
    sys.stdout.write(format_report(build_info, detect_frameworks(), _gpu_info(core)))
    return 0


def _gpu_info(core) -> dict | None:
    """``core.gpu_info()``: the CUDA runtime and NCCL found, or why not."""
    try:
        return dict(core.gpu_info())
    except Exception as error:  # the report goes on: the rest of the build is still worth seeing
        return {"cuda": {"found": False, "error": f"gpu_info() failed: {error}"},
                "nccl": {"found": False, "error": f"gpu_info() failed: {error}"}}
