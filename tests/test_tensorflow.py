"""horovodlike.tensorflow through the launcher with real processes: every collective, dtype and
gradient against NumPy, eagerly and inside tf.function; DistributedGradientTape and
SyncBatchNormalization against a single-process run; broadcast_ and
broadcast_global_variables; errors; and examples/tensorflow2_digits.py."""

import pytest

pytest.importorskip("tensorflow")

from conftest import assert_all_ranks, launch  # noqa: E402
from tf_examples import check_same_weights, run_example  # noqa: E402

# TensorFlow takes a while to import on a busy machine, before the ranks can join.
SLOW_START = ["--start-timeout", "120"]


def test_collectives_match_numpy_eagerly_and_in_graphs():
    result = launch(3, "tf_collectives_worker.py", env={"HOROVOD_DYNAMIC_PROCESS_SETS": "1"},
                    launcher_args=SLOW_START, timeout=400)
    assert_all_ranks(result, 3, "tensorflow collectives OK")


def test_gradient_tape_matches_single_process_and_errors_are_clear():
    result = launch(2, "tf_training_worker.py", launcher_args=SLOW_START, timeout=400)
    assert_all_ranks(result, 2, "tensorflow training and errors OK")


@pytest.mark.parametrize("np_", [2, 3])
def test_sync_batch_norm_equals_one_process_and_broadcasts_assign_in_place(np_):
    result = launch(np_, "tf_sync_bn_worker.py", launcher_args=SLOW_START, timeout=300)
    assert_all_ranks(result, np_, "sync batch norm and broadcasts OK")


def test_tensorflow2_digits_example(tmp_path):
    # -np 2 with 16 per rank takes the same steps as -np 1 with 32, and reaches 95%.
    two = run_example("tensorflow2_digits.py", 2, "--batch-size", 16, "--save-weights",
                      tmp_path / "np2.npz")
    one = run_example("tensorflow2_digits.py", 1, "--batch-size", 32, "--save-weights",
                      tmp_path / "np1.npz")
    assert two[-1][2] >= 95.0, two
    assert two[-1][1] < two[0][1], two
    check_same_weights(tmp_path / "np1.npz", tmp_path / "np2.npz", one, two)


def test_gpu_device_strings_go_through_the_host():
    # tf.device("/GPU:0") and device_dense="/gpu:0" (docs/gpu.md): same values, no crash.
    result = launch(2, "tf_gpu_device_worker.py", launcher_args=SLOW_START, timeout=300)
    assert_all_ranks(result, 2, "tensorflow gpu device strings OK")
