"""Builds the stand-in CUDA runtime and NCCL (C sources next to this file) with gcc.

    build(out_dir=None) -> {"cudart": path, "nccl": path, "nccl_omit_allgather": path, "dir": dir}

Without out_dir the libraries go to a cache folder under the system temp dir named by a hash
of the sources (every file of SOURCES, headers included) and the flags, so many test processes
share one build: each builds in a temporary folder and renames it into place (a lock file keeps
them from all compiling at once, and a reader never sees half-built files).
`python -m tests.gpu_standins.build` or `python tests/gpu_standins/build.py [OUT_DIR]` prints
the paths.
"""

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
CUDART_SOURCES = ("cudart_device.c", "cudart_log.c", "cudart_memory.c", "cudart_streams.c",
                  "cudart_events.c", "cudart_kernels.c")
NCCL_SOURCES = ("nccl_settings.c", "nccl_comm.c", "nccl_mesh.c", "nccl_split.c",
                "nccl_collectives.c", "nccl_redop.c", "nccl_groups.c", "nccl_launch.c",
                "nccl_execute.c", "nccl_wire.c", "nccl_reduce.c")
HEADERS = ("cudart_internal.h", "nccl_internal.h", "nccl_wire.h")
SOURCES = (*CUDART_SOURCES, *NCCL_SOURCES, *HEADERS)
# Hidden by default: a library's symbols are its EXPORT functions, not what its sources share.
CFLAGS = ["-std=c11", "-O1", "-g", "-fPIC", "-shared", "-pthread", "-Wall", "-ffp-contract=off",
          "-fvisibility=hidden"]
CUDART = "libcudart.so.12"
NCCL = "libnccl.so.2"
OMIT_DIR = "omit_allgather"
STAMP = "build-stamp"


class BuildError(RuntimeError):
    """The compiler is missing or failed."""


def _compiler():
    return os.environ.get("CC") or "gcc"


def _key():
    h = hashlib.sha256()
    h.update(repr((_compiler(), CFLAGS, os.uname().machine)).encode())
    for name in (*SOURCES, Path(__file__).name):  # this file: the link flags
        h.update(name.encode())
        h.update((HERE / name).read_bytes())
    return h.hexdigest()


def _paths(folder):
    folder = Path(folder)
    return {"cudart": str(folder / CUDART), "nccl": str(folder / NCCL),
            "nccl_omit_allgather": str(folder / OMIT_DIR / NCCL), "dir": str(folder)}


def _complete(folder, key):
    try:
        stamp = (Path(folder) / STAMP).read_text()
    except OSError:
        return False
    return stamp == key and all(Path(p).is_file() for k, p in _paths(folder).items() if k != "dir")


def _run(*commands):
    """Runs the commands side by side; raises BuildError naming the first that failed."""
    procs = []
    try:
        for command in commands:
            procs.append((command, subprocess.Popen(command, stdout=subprocess.PIPE,
                                                    stderr=subprocess.STDOUT, text=True)))
    except FileNotFoundError as e:
        raise BuildError(f"compiler not found: {commands[0][0]} ({e})") from e
    finally:
        outputs = [(command, p, p.communicate()[0]) for command, p in procs]
    for command, p, output in outputs:
        if p.returncode != 0:
            raise BuildError(f"{' '.join(command)} failed ({p.returncode}):\n{output}")


def _compile_into(folder, key):
    """Compiles the three libraries into folder, writing the stamp last."""
    folder = Path(folder)
    (folder / OMIT_DIR).mkdir(parents=True, exist_ok=True)
    cc = _compiler()
    _run([cc, *CFLAGS, f"-Wl,-soname,{CUDART}", "-o", str(folder / CUDART),
          *(str(HERE / name) for name in CUDART_SOURCES)])
    nccl = [cc, *CFLAGS, f"-Wl,-soname,{NCCL}"]
    link = [f"-L{folder}", f"-l:{CUDART}", "-lm"]
    # The runtime is looked for next to the library, and where NVIDIA's wheels put it when
    # the library is copied into their layout (nvidia/nccl/lib, nvidia/cuda_runtime/lib); the
    # variant lies one folder down and finds it in its parent.
    sources = [str(HERE / name) for name in NCCL_SOURCES]
    _run([*nccl, "-o", str(folder / NCCL), *sources, *link,
          "-Wl,-rpath,$ORIGIN:$ORIGIN/../../cuda_runtime/lib"],
         [*nccl, "-DSTANDIN_NCCL_OMIT_ALLGATHER", "-o", str(folder / OMIT_DIR / NCCL),
          *sources, *link, "-Wl,-rpath,$ORIGIN/.."])
    (folder / STAMP).write_text(key)


class _Lock:
    """An exclusive lock on a file (shared by all processes building the same folder)."""

    def __init__(self, path):
        self.path = path

    def __enter__(self):
        self.file = open(self.path, "w")
        fcntl.flock(self.file, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.file, fcntl.LOCK_UN)
        self.file.close()


def _build_cache(final, key):
    """Builds into a temporary sibling of final and renames the folder into place."""
    final.parent.mkdir(parents=True, exist_ok=True)
    if _complete(final, key):
        return
    with _Lock(final.parent / f".{final.name}.lock"):
        if _complete(final, key):
            return
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
        try:
            _compile_into(tmp, key)
            if final.exists():  # left half-made by hand: no reader can be using it
                shutil.rmtree(final)
            os.rename(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def _build_into(folder, key):
    """Builds into a temporary folder inside folder, then moves each file into place."""
    folder.mkdir(parents=True, exist_ok=True)
    if _complete(folder, key):
        return
    with _Lock(folder / ".build.lock"):
        if _complete(folder, key):
            return
        tmp = Path(tempfile.mkdtemp(prefix=".build.", dir=folder))
        try:
            _compile_into(tmp, key)
            (folder / STAMP).unlink(missing_ok=True)
            (folder / OMIT_DIR).mkdir(exist_ok=True)
            for name in (CUDART, NCCL, f"{OMIT_DIR}/{NCCL}", STAMP):
                os.replace(tmp / name, folder / name)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def build(out_dir=None):
    """Builds (or reuses) the stand-ins; returns the paths of the libraries and their folder."""
    key = _key()
    if out_dir is None:
        final = Path(tempfile.gettempdir()) / f"hvdl-gpu-standins-{os.getuid()}" / key[:20]
        _build_cache(final, key)
    else:
        final = Path(out_dir).resolve()
        _build_into(final, key)
    return _paths(final)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    try:
        paths = build(argv[0] if argv else None)
    except BuildError as e:
        print(e, file=sys.stderr)
        return 1
    print(json.dumps(paths, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
