"""Mismatched and bad input: clear errors, on every rank, and the job goes on. A killed rank
makes the others raise HorovodInternalError at once, and the launcher names it."""

from conftest import (JOB_ENDED_WITHIN_S, assert_all_ranks, assert_survivors_failed_fast, launch,
                      seconds_since_kill)


def test_mismatches_and_bad_input():
    result = launch(3, "errors_worker.py")
    assert_all_ranks(result, 3, "errors OK")


def test_inputs_the_core_cannot_send_raise_on_the_caller():
    # Meta tensors, null pointers, names over the wire's limit, process sets with ranks outside
    # the job: each raises on the rank that made the call, and the job goes on.
    result = launch(2, "input_checks_worker.py", env={"HOROVOD_DYNAMIC_PROCESS_SETS": "1"})
    assert_all_ranks(result, 2, "input checks OK")


def test_killed_rank_fails_the_others_quickly(tmp_path):
    result = launch(3, "kill_worker.py", tmp_path)
    assert_survivors_failed_fast(result, tmp_path, survivors=(0, 2))
    # The job ended within seconds of the kill, with no timeout.
    assert seconds_since_kill(tmp_path) < JOB_ENDED_WITHIN_S
