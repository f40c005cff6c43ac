"""`horovodlikerun --check-build`: which frameworks, controllers and tensor operations this
build has, in Horovod's layout."""

from __future__ import annotations

import importlib
import importlib.util
import sys

# (label, module) in the order they are listed.
FRAMEWORKS = (("PyTorch", "torch"), ("TensorFlow", "tensorflow"), ("Keras", "keras"))
# (label, build_info key)
CONTROLLERS = (("TCP", "tcp"), ("MPI", "mpi"), ("Gloo", "gloo"))
TENSOR_OPERATIONS = (("TCP", "tcp"), ("SHM", "shm"), ("MPI", "mpi"), ("Gloo", "gloo"),
                     ("NCCL", "nccl"))
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


def format_report(build_info: dict, frameworks: dict[str, bool]) -> str:
    def section(title: str, entries: list[tuple[str, bool]]) -> list[str]:
        return [f"{title}:"] + [f"    [{'X' if on else ' '}] {label}" for label, on in entries]

    lines = [f"horovodlike v{build_info.get('version', 'unknown')}:", ""]
    lines += section("Available Frameworks", [(label, frameworks.get(label, False))
                                              for label, _ in FRAMEWORKS])
    lines.append("")
    lines += section("Available Controllers", [(label, bool(build_info.get(key)))
                                               for label, key in CONTROLLERS])
    lines.append("")
    lines += section("Available Tensor Operations", [(label, bool(build_info.get(key)))
                                                     for label, key in TENSOR_OPERATIONS])
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
        build_info = dict(core.build_info())
    except Exception as error:  # ImportError, or a broken extension: either way, say so
        print(f"horovodlikerun: cannot load the horovodlike core (horovodlike._core): {error}\n"
              f"The C++ extension is missing or broken; reinstall with `pip install .` "
              f"from the source tree.", file=sys.stderr)
        return 1
    sys.stdout.write(format_report(build_info, detect_frameworks()))
    return 0
