"""Process sets made from mpi4py communicators, with init(comm=...), under horovodlikerun --mpi
(tests/workers/multi_comm_worker.py)."""

import os
import shutil

import pytest

from conftest import assert_all_ranks, launch
from horovodlike import _core

needs_mpi = pytest.mark.skipif(
    (not _core.build_info()["mpi"] or shutil.which("mpirun") is None)
    and "mpi" not in os.environ.get("HOROVODLIKE_REQUIRE_TRANSPORTS", "").split(","),
    reason="this build has no MPI, or mpirun is not installed")


@needs_mpi
def test_process_sets_from_communicators():
    result = launch(3, "multi_comm_worker.py", launcher_args=["--mpi"])
    assert_all_ranks(result, 3, "multi-comm OK")
