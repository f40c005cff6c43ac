"""Collectives other than allreduce after a join fail at once on each rank (as in Horovod),
at 3 ranks, where the ranks that did not join first number their unnamed calls differently."""

from conftest import assert_all_ranks, launch


def test_an_allgather_after_a_join_fails_on_each_rank_that_calls_it():
    result = launch(3, "join_others_worker.py", timeout=120,
                    env={"HOROVOD_STALL_CHECK_TIME_SECONDS": "20"})
    assert_all_ranks(result, 3, "JOINS OK")
