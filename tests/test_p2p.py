"""Point-to-point between real ranks: values against NumPy, ordering per tag, process sets,
bad input raised before sending, size mismatches on both ranks, a killed peer, and jobs that
mpirun started without the launcher."""

import os
import shutil
import subprocess
import sys

import pytest

from conftest import NOTICED_WITHIN_S, REPO, WORKERS, assert_all_ranks, job_env, launch
from horovodlike import _core

DYNAMIC = {"HOROVOD_DYNAMIC_PROCESS_SETS": "1"}
BUILD = _core.build_info()
# Where the environment installed MPI or Gloo (CI sets this), a build without it fails instead
# of skipping.
REQUIRED = os.environ.get("HOROVODLIKE_REQUIRE_TRANSPORTS", "").split(",")
MPI_REQUIRED = "mpi" in REQUIRED
needs_gloo = pytest.mark.skipif(not BUILD["gloo"] and "gloo" not in REQUIRED,
                                reason="this build has no Gloo")
needs_mpi = pytest.mark.skipif((not BUILD["mpi"] or shutil.which("mpirun") is None)
                               and not MPI_REQUIRED,
                               reason="this build has no MPI, or mpirun is not installed")


def test_p2p_values_ordering_and_process_sets():
    result = launch(3, "p2p_worker.py", "correctness", env=DYNAMIC)
    assert_all_ranks(result, 3, "p2p OK")


@pytest.mark.parametrize("link,flags,env,p2p_link", [
    ("shm", [], {}, "shm"),
    ("tcp", [], {"HOROVOD_SHM_DISABLE": "1"}, "tcp"),
    pytest.param("gloo", ["--gloo"], {}, "shm", marks=needs_gloo),
    pytest.param("mpi", ["--mpi"], {}, "mpi", marks=needs_mpi),
])
def test_p2p_over_every_transport(link, flags, env, p2p_link):
    # Whatever carries the collectives, messages (every dtype, ordering per tag, 12 MB, a shape
    # the sender decides) arrive beside collectives in flight. The messages themselves are the
    # job link's tagged messages: the shared segment's tagged rings between ranks of one host
    # (in a Gloo job too), the TCP mesh's tagged channel between hosts, MPI's own tagged
    # messages in an MPI job.
    result = launch(2, "p2p_worker.py", "transport", env={**DYNAMIC, **env},
                    launcher_args=flags, transport="tcp")
    assert_all_ranks(result, 2, f"transport={link} point_to_point={p2p_link} p2p OK")


def test_p2p_bad_input_mismatch_and_interrupted_wait():
    result = launch(3, "p2p_worker.py", "errors", env=DYNAMIC)
    assert_all_ranks(result, 3, "p2p errors OK")


@pytest.mark.parametrize("env", [{}, {"HOROVOD_SHM_DISABLE": "1"}], ids=["shm", "tcp"])
def test_p2p_message_sent_before_the_sender_shut_down_is_delivered(env):
    result = launch(2, "p2p_worker.py", "farewell", env=env)
    assert_all_ranks(result, 2, "p2p farewell OK")


def test_p2p_killed_peer_fails_the_waiting_rank(tmp_path):
    result = launch(2, "p2p_worker.py", "kill", tmp_path)
    assert result.returncode == 128 + 9, result.stdout + result.stderr
    report = (tmp_path / "rank0.txt").read_text().splitlines()
    assert report[0].startswith("HorovodInternalError after"), report
    assert "lost connection to rank 1" in report[0], report
    assert float(report[0].split()[2]) < NOTICED_WITHIN_S, report
    assert report[1] == "HorovodInternalError", report


@pytest.mark.skipif((not BUILD["mpi"] or shutil.which("mpirun") is None) and not MPI_REQUIRED,
                    reason="this build has no MPI, or mpirun is not installed")
@pytest.mark.parametrize("np_, script, args, marker", [
    (3, "p2p_worker.py", ["correctness"], "p2p OK"),
    (2, "pipeline_worker.py", ["train", "1f1b:1"], "pipelines OK")])
def test_p2p_in_a_job_that_mpirun_started_directly(np_, script, args, marker):
    # No horovodlikerun, so no rendezvous server: the point-to-point mesh's addresses travel
    # over MPI. Every rank must finish its exchanges and the pipeline replay.
    command = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(np_),
               sys.executable, str(WORKERS / script), *args]
    result = subprocess.run(command, env=job_env(DYNAMIC), capture_output=True, text=True,
                            timeout=240, cwd=REPO)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    for rank in range(np_):
        assert f"rank {rank}: {marker}" in result.stdout, output[-6000:]
