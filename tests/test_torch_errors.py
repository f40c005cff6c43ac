"""Mismatched and bad input: clear errors, on every rank, and the job goes on. A killed rank
makes the others raise HorovodInternalError at once, and the launcher names it."""

import time

from conftest import assert_all_ranks, launch


def test_mismatches_and_bad_input():
    result = launch(3, "errors_worker.py")
    assert_all_ranks(result, 3, "errors OK")


def test_killed_rank_fails_the_others_quickly(tmp_path):
    start = time.time()
    result = launch(3, "kill_worker.py", tmp_path, timeout=60)
    elapsed = time.time() - start
    assert result.returncode == 128 + 9, result.stdout + result.stderr
    assert "rank 1" in result.stderr and "SIGKILL" in result.stderr, result.stderr
    for rank in (0, 2):
        report = (tmp_path / f"rank{rank}.txt").read_text().splitlines()
        assert report[0].startswith("HorovodInternalError after"), report
        assert "lost connection to rank" in report[0], report
        # Detected within seconds, not a timeout.
        assert float(report[0].split()[2]) < 5.0, report
        assert report[1] == "HorovodInternalError", report
    # The job ended within seconds of the kill (start-up included), with no timeout.
    assert elapsed < 45, elapsed
