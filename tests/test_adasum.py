"""op=hvd.Adasum for allreduce and DistributedOptimizer: against NumPy on 2 and 4 ranks, bit
-identical on every rank, and clear errors on every rank for 3 ranks and integer tensors."""

import pytest

from conftest import assert_all_ranks, launch


@pytest.mark.parametrize("np_", [2, 4, 3])
def test_adasum(np_):
    result = launch(np_, "adasum_worker.py")
    assert_all_ranks(result, np_, "adasum OK")
    if np_ in (2, 4):
        assert_all_ranks(result, np_, "26 Adasum checks passed")
