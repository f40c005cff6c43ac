"""Every collective, op, dtype and size against NumPy on every rank, for 1 to 4 ranks and with
the response cache and fusion on, off and squeezed."""

import pytest

from conftest import assert_all_ranks, launch


@pytest.mark.parametrize("np_", [1, 2, 3, 4])
def test_collectives_match_numpy(np_):
    result = launch(np_, "collectives_worker.py")
    assert_all_ranks(result, np_, "604 allreduce checks passed; collectives OK")


def test_collectives_without_cache_or_fusion():
    env = {"HOROVOD_CACHE_CAPACITY": "0", "HOROVOD_FUSION_THRESHOLD": "0"}
    result = launch(3, "collectives_worker.py", env=env)
    assert_all_ranks(result, 3, "collectives OK")


def test_collectives_with_tiny_cache_evicting():
    result = launch(2, "collectives_worker.py", env={"HOROVOD_CACHE_CAPACITY": "4",
                                                      "HOROVOD_CYCLE_TIME": "0.2"})
    assert_all_ranks(result, 2, "collectives OK")


def test_launcher_tunable_flags_reach_the_core():
    result = launch(2, "collectives_worker.py",
                    launcher_args=["--fusion-threshold-mb", "0", "--disable-cache",
                                   "--cycle-time-ms", "2"])
    assert_all_ranks(result, 2, "collectives OK")


def test_allreduce_fast_path_of_plain_tensors():
    # _core.run_plain: every dtype summed against NumPy; anything not plain left alone and
    # reduced (or refused) by the general path; a name in flight; a mismatch's error.
    result = launch(2, "plain_tensor_worker.py")
    assert_all_ranks(result, 2, "plain tensor OK")
