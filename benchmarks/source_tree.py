"""The PYTHONPATH the benchmarks give their jobs: the caller's, then this checkout's source
tree when its core is built in place (src/horovodlike/_core*.so). A checkout whose core was
installed with pip instead is left off: its src/horovodlike, without a core, would hide the
installed package."""

from __future__ import annotations

import glob
import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def jobs_pythonpath(environ=None) -> str:
    environ = os.environ if environ is None else environ
    source = os.path.join(REPO, "src")
    built = glob.glob(os.path.join(source, "horovodlike", "_core*.so"))
    return os.pathsep.join(filter(None, [environ.get("PYTHONPATH"), source if built else None]))
