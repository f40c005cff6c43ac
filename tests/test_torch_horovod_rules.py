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
