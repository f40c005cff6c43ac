"""Point-to-point between real ranks: values against NumPy, ordering per tag, process sets,
bad input raised before sending, size mismatches on both ranks, and a killed peer."""

from conftest import assert_all_ranks, launch

DYNAMIC = {"HOROVOD_DYNAMIC_PROCESS_SETS": "1"}


def test_p2p_values_ordering_and_process_sets():
    result = launch(3, "p2p_worker.py", "correctness", env=DYNAMIC)
    assert_all_ranks(result, 3, "p2p OK")


def test_p2p_bad_input_mismatch_and_interrupted_wait():
    result = launch(3, "p2p_worker.py", "errors", env=DYNAMIC)
    assert_all_ranks(result, 3, "p2p errors OK")


def test_p2p_killed_peer_fails_the_waiting_rank(tmp_path):
    result = launch(2, "p2p_worker.py", "kill", tmp_path, timeout=60)
    assert result.returncode == 128 + 9, result.stdout + result.stderr
    report = (tmp_path / "rank0.txt").read_text().splitlines()
    assert report[0].startswith("HorovodInternalError after"), report
    assert "lost connection to rank 1" in report[0], report
    assert float(report[0].split()[2]) < 5.0, report
    assert report[1] == "HorovodInternalError", report
