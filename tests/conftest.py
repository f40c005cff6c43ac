"""Runs worker scripts as real multi-process jobs through horovodlikerun."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# A checkout whose core was built in place (src/horovodlike/_core*.so) is tested as it stands;
# otherwise the installed package (`pip install .`) is.
_SOURCE = REPO / "src"
if any((_SOURCE / "horovodlike").glob("_core*.so")) and str(_SOURCE) not in sys.path:
    sys.path.insert(0, str(_SOURCE))

import horovodlike  # noqa: E402

WORKERS = REPO / "tests" / "workers"
# Ranks import the same horovodlike as this process, installed or from a source tree.
PACKAGE_PARENT = Path(horovodlike.__file__).resolve().parents[1]


def job_env(extra=None):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGE_PARENT),
                                                      env.get("PYTHONPATH")]))
    for key in [k for k in env if k.startswith("HOROVOD_")]:
        del env[key]
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra or {})
    return env


# HOROVODLIKE_TEST_TRANSPORT=gloo|mpi runs every launched job over that transport (default tcp).
TRANSPORT_FLAGS = {"tcp": [], "gloo": ["--gloo"], "mpi": ["--mpi"]}


def launch(np, script, *args, env=None, timeout=240, launcher_args=(), transport=None):
    """Runs `horovodlikerun -np N python script args` and returns the CompletedProcess.
    `transport` pins one for a test about it; by default HOROVODLIKE_TEST_TRANSPORT says."""
    transport = transport or os.environ.get("HOROVODLIKE_TEST_TRANSPORT", "tcp") or "tcp"
    if transport not in TRANSPORT_FLAGS:
        raise ValueError(f"HOROVODLIKE_TEST_TRANSPORT={transport!r}: use one of "
                         f"{', '.join(TRANSPORT_FLAGS)}")
    if not any(flag in launcher_args for flag in ("--gloo", "--mpi")):
        launcher_args = [*TRANSPORT_FLAGS[transport], *launcher_args]
    command = [sys.executable, "-m", "horovodlike.runner.launch", "-np", str(np),
               *launcher_args, sys.executable, str(WORKERS / script), *map(str, args)]
    return subprocess.run(command, env=job_env(env), capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


def assert_all_ranks(result, np, marker):
    """Every rank printed `marker` and the job exited 0; otherwise show what happened."""
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"job failed ({result.returncode}):\n{output[-6000:]}"
    for rank in range(np):
        prefix = f"[{rank}]<stdout>:rank {rank}: "
        assert any(line.startswith(prefix) and marker in line
                   for line in result.stdout.splitlines()), \
            f"rank {rank} did not report '{marker}':\n{output[-6000:]}"


@pytest.fixture
def run_job():
    return launch


# A killed rank's peers notice the lost connection within seconds of the kill (workers report
# the time from the kill itself, tests/workers/common.py: kill_self), where a silent peer
# would be given up on only after HOROVOD_PEER_TIMEOUT_SECONDS (300 by default). The margin is
# for a busy machine, where a survivor may wait for a core a while.
NOTICED_WITHIN_S = 10.0
# The launcher ends such a job within seconds of the kill too: it stops the other ranks, with
# SIGKILL 3 s after SIGTERM where they ignore it.
JOB_ENDED_WITHIN_S = 30.0


def seconds_since_kill(report_dir):
    """Seconds since the rank that tests/workers/common.py's kill_self() killed died."""
    return time.time() - float((report_dir / "killed_at").read_text())


def assert_survivors_failed_fast(result, report_dir, survivors):
    """tests/workers/kill_worker.py: rank 1 was SIGKILLed mid-collective; the launcher named it
    and exited with its signal, and every survivor raised HorovodInternalError, naming the lost
    connection, within seconds rather than after a timeout."""
    assert result.returncode == 128 + 9, result.stdout + result.stderr
    assert "rank 1" in result.stderr and "SIGKILL" in result.stderr, result.stderr
    for rank in survivors:
        report = (report_dir / f"rank{rank}.txt").read_text().splitlines()
        assert report[0].startswith("HorovodInternalError after"), report
        assert "lost connection to rank" in report[0], report
        assert float(report[0].split()[2]) < NOTICED_WITHIN_S, report
        assert report[1] == "HorovodInternalError", report


@pytest.fixture(scope="session")
def standins():
    """The stand-in CUDA runtime and NCCL that tests/gpu_standins/ builds (paths by name)."""
    from gpu_standins.build import build
    return build()


@pytest.fixture(scope="session")
def cuda(standins):
    """The stand-in CUDA runtime, driven from the test process (tests/gpu_standins/device.py)."""
    from gpu_standins.device import StandinCuda
    return StandinCuda(standins["cudart"])
