"""Multi-copy tensor parallelism (num_copies): the batch split into copies whose allreduces
overlap the next copy's compute gives the single-copy and the dense results, forward and
backward, for a Column/Row MLP pair and a transformer block split by parallelize_module (2
ranks); a batch the copies do not divide is refused before anything is sent."""

from conftest import assert_all_ranks, launch


def test_multi_copy():
    result = launch(2, "multi_copy_worker.py")
    assert_all_ranks(result, 2, "multi copy OK")
