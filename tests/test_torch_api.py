"""alltoall, reducescatter, grouped ops, process sets and join, against NumPy on every rank,
with their gradients and errors, for 1 to 4 ranks."""

import pytest

from conftest import assert_all_ranks, launch


@pytest.mark.parametrize("np_", [1, 2, 3, 4])
def test_complete_collective_api(np_):
    result = launch(np_, "api_worker.py", env={"HOROVOD_DYNAMIC_PROCESS_SETS": "1"})
    assert_all_ranks(result, np_, "api OK")
