"""The PYTHONPATH the benchmarks give their jobs: the caller's, then this checkout's source
tree when its core is built in place (src/horovodlike/_core*.so). A checkout whose core was
installed with pip instead is left off: its src/horovodlike, without a core, would hide the
installed package."""

from __future__ import annotations

import glob
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def jobs_pythonpath(environ=None) -> str:
    environ = os.environ if environ is None else environ
    source = os.path.join(REPO, "src")
    built = glob.glob(os.path.join(source, "horovodlike", "_core*.so"))
    return os.pathsep.join(filter(None, [environ.get("PYTHONPATH"), source if built else None]))


def horovodlike_in_use(environ=None) -> str:
    """Which horovodlike the jobs import (with jobs_pythonpath): "this checkout's build" or
    "installed", and its version; or why it does not load."""
    environ = dict(os.environ if environ is None else environ)
    environ["PYTHONPATH"] = jobs_pythonpath(environ)
    probe = subprocess.run([sys.executable, "-c",
                            "import os, horovodlike, horovodlike._core as c; "
                            "print(c.build_info()['version'], os.path.dirname(horovodlike.__file__))"],
                           env=environ, capture_output=True, text=True)
    if probe.returncode != 0:
        return "none: the core does not load (build it, or pip install the project)"
    version, folder = probe.stdout.split()[-2:]
    where = ("this checkout's build" if os.path.realpath(folder).startswith(
        os.path.realpath(os.path.join(REPO, "src"))) else "installed")
    return f"{version}, {where}"
