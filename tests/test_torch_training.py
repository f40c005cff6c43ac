"""Autograd of the collectives, DistributedOptimizer against a single-process run on the global
batch, and broadcast of parameters and optimizer state."""

import pytest

from conftest import assert_all_ranks, launch


@pytest.mark.parametrize("np_", [2, 3])
def test_training_matches_single_process(np_):
    result = launch(np_, "training_worker.py")
    assert_all_ranks(result, np_, "training OK")


@pytest.mark.parametrize("np_", [2, 3])
def test_sync_batch_norm_and_optimizer_options_match_single_process(np_):
    result = launch(np_, "optimizer_worker.py", env={"HOROVOD_DYNAMIC_PROCESS_SETS": "1"})
    assert_all_ranks(result, np_, "optimizer OK")


def test_an_lr_scheduler_made_before_the_wrapping_keeps_the_allreduce():
    # The scheduler puts a step of its own on the optimizer object; the wrapper must not copy
    # it over (it would step the plain optimizer and skip the allreduce on every rank).
    result = launch(2, "lr_scheduler_worker.py")
    assert_all_ranks(result, 2, "lr scheduler ok")
