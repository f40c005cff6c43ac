"""horovodlike.spark.TorchDistributor on a real local Spark session (test_spark.py's): a function
and a script with arguments on 2 ranks, on the driver's machine and as Spark tasks, their
allreduce against NumPy; a failing rank named in the error; bad arguments refused before
anything starts."""

import sys
import time

import numpy as np
import pytest

from conftest import WORKERS
from test_spark import spark  # noqa: F401  (the module's local Spark session)

sys.path.insert(0, str(WORKERS))
import cluster_jobs  # noqa: E402
import distributor_jobs  # noqa: E402

from horovodlike.spark import TorchDistributor  # noqa: E402

SCRIPT = str(WORKERS / "distributor_jobs.py")
MODES = pytest.mark.parametrize("local_mode", [True, False], ids=["driver", "executors"])


def numpy_sum(size, scale):
    return sum(distributor_jobs.contribution(rank, scale) for rank in range(size))


@MODES
def test_function_returns_rank_zeros_result(spark, local_mode):  # noqa: F811
    distributor = TorchDistributor(num_processes=2, local_mode=local_mode, use_gpu=False)
    result = distributor.run(distributor_jobs.allreduce_ranks, 0.5, label="weights")
    assert (result["label"], result["rank"], result["size"]) == ("weights", 0, 2)
    np.testing.assert_allclose(result["sum"], numpy_sum(2, 0.5), rtol=1e-12)


@MODES
def test_script_runs_with_its_arguments_on_every_rank(spark, local_mode, tmp_path):  # noqa: F811
    distributor = TorchDistributor(num_processes=2, local_mode=local_mode, use_gpu=False)
    assert distributor.run(SCRIPT, "--scale", 3, f"--out={tmp_path}") is None
    for rank in range(2):
        np.testing.assert_allclose(np.load(tmp_path / f"rank{rank}of2.npy"), numpy_sum(2, 3.0),
                                   rtol=1e-12)


@MODES
def test_a_failing_rank_is_named_with_its_error(spark, local_mode, tmp_path):  # noqa: F811
    distributor = TorchDistributor(num_processes=2, local_mode=local_mode, use_gpu=False)
    pattern = r"^rank 1 \(on [^)]+\) raised ValueError: rank 1 gives up"
    with pytest.raises(RuntimeError, match=pattern):
        distributor.run(cluster_jobs.fail_on_rank, 1, "raise", str(tmp_path))
    with pytest.raises(RuntimeError, match=pattern):
        distributor.run(SCRIPT, "--scale=1", f"--out={tmp_path}", "--fail-on-rank=1")


def test_bad_arguments_are_refused_before_anything_starts(spark, monkeypatch,  # noqa: F811
                                                          tmp_path):
    started = time.monotonic()
    for bad in (0, -2, 1.5, True, "2"):
        with pytest.raises(ValueError, match="num_processes must be a positive integer"):
            TorchDistributor(num_processes=bad, use_gpu=False)
    # Spark gives the tasks no GPU here: spark.task.resource.gpu.amount is unset.
    with pytest.raises(RuntimeError, match=r"set spark\.task\.resource\.gpu\.amount=1"):
        TorchDistributor(num_processes=2, local_mode=False, use_gpu=True)
    distributor = TorchDistributor(num_processes=2, use_gpu=False)
    with pytest.raises(FileNotFoundError, match="no script at .*missing.py"):
        distributor.run(str(tmp_path / "missing.py"), "--scale=1")
    with pytest.raises(ValueError, match="command-line arguments only"):
        distributor.run(SCRIPT, scale=1)
    with pytest.raises(TypeError, match="must be a function or the path"):
        distributor.run(42)
    assert time.monotonic() - started < 10
    # No GPU visible to the ranks' processes: use_gpu=True on the driver's machine is refused.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(RuntimeError, match=r"num_processes=1 ranks need a GPU each, but this "
                                           r"machine has 0.*pass use_gpu=False"):
        TorchDistributor(num_processes=1, local_mode=True)
