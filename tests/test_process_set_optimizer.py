"""A DistributedOptimizer for a process set that leaves some ranks out, built on every rank
(Horovod's test_optimizer_process_sets, which needs more than 2 ranks)."""

import pytest

from conftest import assert_all_ranks, launch


def test_an_optimizer_for_a_process_set_leaves_the_ranks_outside_it_alone():
    # Rank 1 is outside the set [0, 2] and steps on its own gradients.
    result = launch(3, "optimizer_outsider_worker.py", timeout=120)
    assert_all_ranks(result, 3, "OUTSIDER OK")


def test_a_tape_for_a_process_set_leaves_the_ranks_outside_it_alone():
    pytest.importorskip("tensorflow")
    result = launch(3, "tf_outsider_worker.py", timeout=180)
    assert_all_ranks(result, 3, "TF OUTSIDER OK")
