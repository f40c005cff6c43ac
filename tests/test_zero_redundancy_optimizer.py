"""ZeroRedundancyOptimizer (SGD with momentum, Adam) against the unsharded optimizer in one
process: parameters, per-rank state size, consolidated state dict, resuming from a state dict;
on the whole job (uneven shards) and on the dp sets of a pp x dp mesh."""

import pytest

from conftest import assert_all_ranks, launch


@pytest.mark.parametrize("mode,np", [("train", 3), ("mesh", 4)])
def test_zero_redundancy_optimizer(mode, np):
    result = launch(np, "zero_worker.py", mode)
    assert_all_ranks(result, np, f"zero {mode} OK")
