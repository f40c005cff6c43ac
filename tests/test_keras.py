"""horovodlike.keras (Keras 3) through the launcher with real processes: model.fit with
DistributedOptimizer against a single-process run, the callbacks, load_model, and
examples/keras_digits.py."""

import io
import zipfile

import numpy as np
import pytest

pytest.importorskip("keras")
h5py = pytest.importorskip("h5py")

from conftest import assert_all_ranks, launch  # noqa: E402
from tf_examples import check_same_weights, run_example  # noqa: E402


def test_fit_callbacks_and_load_model(tmp_path):
    result = launch(2, "keras_worker.py", tmp_path, launcher_args=["--start-timeout", "120"],
                    timeout=400)
    assert_all_ranks(result, 2, "keras OK")


def test_keras_digits_example(tmp_path):
    # Without warm-up (its ramp depends on the number of ranks), -np 2 with 16 per rank takes
    # the same steps as -np 1 with 32, and reaches 95%.
    common = ["--warmup-epochs", 0]
    two = run_example("keras_digits.py", 2, *common, "--batch-size", 16, "--save-weights",
                      tmp_path / "np2.npz", "--checkpoint-dir", tmp_path / "checkpoints")
    one = run_example("keras_digits.py", 1, *common, "--batch-size", 32, "--save-weights",
                      tmp_path / "np1.npz")
    assert two[-1][2] >= 95.0, two
    assert two[-1][1] < two[0][1], two
    check_same_weights(tmp_path / "np1.npz", tmp_path / "np2.npz", one, two)

    # Rank 0 saved a model after every epoch; the last one holds the final weights.
    saved = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert saved == sorted(f"checkpoint-{e}.keras" for e in range(1, len(two) + 1)), saved
    with zipfile.ZipFile(tmp_path / "checkpoints" / f"checkpoint-{len(two)}.keras") as archive:
        weights = h5py.File(io.BytesIO(archive.read("model.weights.h5")), "r")
        with np.load(tmp_path / "np2.npz") as final:
            for layer in ("dense", "dense_1"):
                assert np.array_equal(weights[f"layers/{layer}/vars/0"][()],
                                      final[f"sequential.{layer}.kernel"])
                assert np.array_equal(weights[f"layers/{layer}/vars/1"][()],
                                      final[f"sequential.{layer}.bias"])


def test_compute_gradients_aggregation_and_local_variables(tmp_path):
    result = launch(2, "keras_local_worker.py", launcher_args=["--start-timeout", "120"],
                    timeout=300)
    assert_all_ranks(result, 2, "keras local OK")
