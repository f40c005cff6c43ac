"""Ranks that diverge never hang the job: the stall inspector names the tensors and the ranks
that did not submit them, an error ends a deadlock on every rank, and signals interrupt every
blocking wait (synchronize, join, barrier, init) within about 100 ms."""

import json
import sys

from conftest import WORKERS
from test_faults import leftovers, run, tagged_env


def rank_reports(directory, ranks):
    return {r: json.loads((directory / f"rank{r}.json").read_text()) for r in ranks}


def test_rank_that_skips_a_collective_ends_with_an_error_naming_it(tmp_path):
    # Long enough that "at once" below stands apart from another stall check on a busy machine.
    stall_check = 3
    env = tagged_env({"HOROVOD_STALL_CHECK_TIME_SECONDS": str(stall_check)})
    result = run(2, [sys.executable, str(WORKERS / "divergence_worker.py"), "skip", tmp_path],
                 env)
    assert result.returncode == 0, result.output[-4000:]
    for rank, report in rank_reports(tmp_path, [0, 1]).items():
        steps = report["steps"]
        assert steps["type"] == "HorovodInternalError", report
        assert "ranks diverged" in steps["message"], report
        assert "'skipped' missing on rank 1" in steps["message"], report
        assert "'after' missing on rank 0" in steps["message"], report
        assert stall_check * 0.9 < steps["seconds"] < stall_check + 15, report
        # The runtime stopped: later collectives fail at once, not after another stall check.
        assert report["later"]["type"] == "HorovodInternalError", report
        assert report["later"]["seconds"] < stall_check - 1, report
    # Every rank says why on stderr.
    for rank in (0, 1):
        assert any(line.startswith(f"[{rank}]<stderr>:") and "ranks diverged" in line
                   for line in result.stderr.splitlines()), result.stderr[-4000:]
    assert leftovers(env["HOROVODLIKE_TEST_TAG"]) == []


def test_ranks_in_different_op_orders_end_with_an_error_naming_both(tmp_path):
    env = tagged_env({"HOROVOD_STALL_CHECK_TIME_SECONDS": "1"})
    result = run(2, [sys.executable, str(WORKERS / "divergence_worker.py"), "order", tmp_path],
                 env)
    assert result.returncode == 0, result.output[-4000:]
    for rank, report in rank_reports(tmp_path, [0, 1]).items():
        message = report["steps"].get("message", "")
        assert report["steps"]["type"] == "HorovodInternalError", report
        assert "'a' missing on rank 1" in message and "'b' missing on rank 0" in message, report
    assert leftovers(env["HOROVODLIKE_TEST_TAG"]) == []


def test_without_the_stall_check_signals_still_interrupt_every_wait(tmp_path):
    """HOROVOD_STALL_CHECK_DISABLE: no error ends the deadlock (else it would come after 0.5 s,
    before the signals at 1 s); SIGINT and SIGALRM interrupt synchronize, join and barrier."""
    env = tagged_env({"HOROVOD_STALL_CHECK_DISABLE": "1",
                      "HOROVOD_STALL_CHECK_TIME_SECONDS": "0.5"})
    seen = {}
    for mode in ("interrupt", "join"):
        (tmp_path / mode).mkdir()
        result = run(2, [sys.executable, str(WORKERS / "divergence_worker.py"), mode,
                         tmp_path / mode], env)
        assert result.returncode == 0, result.output[-4000:]
        assert "diverged" not in result.stderr
        assert leftovers(env["HOROVODLIKE_TEST_TAG"]) == []
        seen[mode] = rank_reports(tmp_path / mode, [0, 1])
    interrupted = [(seen["interrupt"][0]["synchronize"], "KeyboardInterrupt"),
                   (seen["interrupt"][1]["barrier"], "AlarmTimeout"),
                   (seen["join"][0]["join"], "AlarmTimeout")]
    for report, expected in interrupted:
        assert report["type"] == expected, seen
        # The signal came 1 s into the wait; it ended in slices of 100 ms (far less than the
        # bound, which leaves room for a busy machine).
        assert 0.9 < report["seconds"] < 10, seen
        assert any("raised while horovodlike waited for a collective" in note
                   for note in report["notes"]), seen


def test_signal_interrupts_init_waiting_for_a_rank_that_never_comes(tmp_path):
    start_timeout = 200  # far beyond the job's start-up on a busy machine
    env = tagged_env({"HOROVOD_START_TIMEOUT": str(start_timeout)})
    result = run(2, [sys.executable, str(WORKERS / "divergence_worker.py"), "init", tmp_path],
                 env, timeout=start_timeout + 60)
    assert result.returncode == 0, result.output[-4000:]
    report = rank_reports(tmp_path, [0])[0]["init"]
    assert report["type"] == "AlarmTimeout", report
    assert 0.9 < report["seconds"] < 10, report
    assert any("init()" in note for note in report["notes"]), report
    # Rank 0 did not wait for the rendezvous until its start timeout.
    assert result.elapsed < start_timeout / 2, result.output[-4000:]
    assert leftovers(env["HOROVODLIKE_TEST_TAG"]) == []


def test_whole_test_file_under_pytest_ends_with_failures_and_shows_why(tmp_path):
    """One rank fails an assertion and moves on to the next test's collective: the job ends,
    and the reason reaches the launcher's stderr although pytest captures the ranks' output."""
    env = tagged_env({"HOROVOD_STALL_CHECK_TIME_SECONDS": "1"})
    result = run(2, [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                     "--rootdir", str(tmp_path), str(WORKERS / "diverging_tests.py")], env,
                 timeout=120)
    assert result.returncode == 1, result.output[-4000:]
    for rank in (0, 1):
        summary = [line for line in result.stdout.splitlines()
                   if line.startswith(f"[{rank}]<stdout>:") and " in " in line and
                   "failed" in line]
        assert summary and "3 failed" in summary[-1], result.output[-4000:]
        diverged = [line for line in result.stderr.splitlines()
                    if line.startswith(f"[{rank}]<stderr>:[horovodlike ERROR")
                    and "ranks diverged" in line]
        assert diverged and "'one' missing on rank 1" in diverged[0] and \
            "'two' missing on rank 0" in diverged[0], result.stderr[-4000:]
    assert leftovers(env["HOROVODLIKE_TEST_TAG"]) == []
