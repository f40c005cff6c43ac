"""The links' tagged messages through the link API itself (isend/irecv and their requests) on
every link a job can have: shared memory, shared memory + TCP, TCP alone, Gloo (shared memory and its TCP mesh) and MPI (MPI's
own tags). Several tags and sizes per pair of ranks, received in another order than sent, the
bytes checked against NumPy; a receive of the wrong size fails on the receiving rank."""

import os
import shutil

import pytest

from conftest import assert_all_ranks, launch
from horovodlike import _core

BUILD = _core.build_info()
REQUIRED = os.environ.get("HOROVODLIKE_REQUIRE_TRANSPORTS", "").split(",")
needs_gloo = pytest.mark.skipif(not BUILD["gloo"] and "gloo" not in REQUIRED,
                                reason="this build has no Gloo")
needs_mpi = pytest.mark.skipif((not BUILD["mpi"] or shutil.which("mpirun") is None)
                               and "mpi" not in REQUIRED,
                               reason="this build has no MPI, or mpirun is not installed")


@pytest.mark.parametrize("flags,env,carrier", [
    ([], {}, "shm"),
    # Two emulated hosts (test_hierarchical.py): ranks 0 and 1 share memory, rank 2 is reached
    # over TCP, and each wait moves both.
    (["-H", "localhost:2,127.0.0.1:1"], {}, ["shm+tcp", "shm+tcp", "tcp"]),
    ([], {"HOROVOD_SHM_DISABLE": "1"}, "tcp"),
    pytest.param(["--gloo"], {}, "shm", marks=needs_gloo),
    pytest.param(["--mpi"], {}, "mpi", marks=needs_mpi),
], ids=["shm", "shm+tcp", "tcp", "gloo", "mpi"])
def test_tagged_messages_over_every_link(flags, env, carrier):
    result = launch(3, "link_tags_worker.py", env=env, launcher_args=flags, transport="tcp")
    assert_all_ranks(result, 3, "tagged OK")
    carriers = carrier if isinstance(carrier, list) else [carrier] * 3
    for rank, name in enumerate(carriers):
        assert f"[{rank}]<stdout>:rank {rank}: link={name} tagged OK" in result.stdout, \
            result.stdout


def test_a_host_peer_rings_a_rank_that_waits_in_poll_for_other_hosts_too():
    """Ranks 0 and 1 share memory, rank 2 is on another (emulated) host: a rank waiting for
    both sleeps in poll() on its TCP connections, and its host peer's messages ring its poll
    bell instead of waiting out the poll (links/shm/shm_bell.h)."""
    result = launch(3, "poll_bell_worker.py", launcher_args=["-H", "localhost:2,127.0.0.1:1"],
                    transport="tcp")
    assert_all_ranks(result, 3, "OK")
