"""horovodlike.torch.parallel.parallelize_module: a transformer written for one device split
by Megatron-style plans (2 ranks), and trained tp x dp on a 2-D ProcessMesh (4 ranks), against
the unsplit model; bad plans refused with errors that say what to change."""

import pytest

from conftest import assert_all_ranks, launch


@pytest.mark.parametrize("mode,np", [("plans", 2), ("mesh", 4)])
def test_parallelize_module(mode, np):
    # Dynamic process sets: the bad-plan checks register a set that leaves a rank out.
    result = launch(np, "parallelize_worker.py", mode,
                    env={"HOROVOD_DYNAMIC_PROCESS_SETS": "1"})
    assert_all_ranks(result, np, f"parallelize {mode} OK")
