"""Horovod's semantics that migrated torch code depends on: the gradients of the collectives
and the API's habits (tests/workers/gradient_rules_worker.py, horovod_habits_worker.py)."""

import pytest

from conftest import assert_all_ranks, launch


@pytest.mark.parametrize("np_", [2, 3])
def test_collective_gradients_follow_horovods_rules(np_):
    result = launch(np_, "gradient_rules_worker.py")
    assert_all_ranks(result, np_, "gradient rules OK")


def test_horovod_api_habits():
    result = launch(2, "horovod_habits_worker.py")
    assert_all_ranks(result, 2, "horovod habits OK")


def test_join_while_others_run_cached_collectives():
    # Without the fix the ranks that start a cached allgather, broadcast, barrier, alltoall or
    # reducescatter wait forever for the joined rank: the stall shutdown turns that into a
    # failure well before the job's timeout.
    result = launch(3, "join_cached_worker.py",
                    env={"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "60"})
    assert_all_ranks(result, 3, "join with cached collectives OK")
