"""horovodlike.ray.HorovodTrainer under Ray Train, on a real local Ray cluster that this module
starts (2 CPUs) and stops: 2 workers train with hvd.DistributedOptimizer on their shards of a
Ray Data dataset (each sample read once per epoch) to the weights of full-batch gradient
descent in NumPy, with Ray Train's report, checkpoints and context; a worker killed
mid-training is restarted by FailureConfig from the last reported checkpoint and ends with the
weights of the uninterrupted run; and the same under Ray Train V1, with
resume_from_checkpoint."""

import json
import os
import secrets
import subprocess
import sys

import numpy as np
import pytest

from conftest import WORKERS

import ray  # noqa: E402  (CI installs it: .[ray] brings ray[train])
import ray.train  # noqa: E402

sys.path.insert(0, str(WORKERS))
import cluster_jobs  # noqa: E402
import ray_train_loops  # noqa: E402
from test_ray import local_cluster  # noqa: E402

from horovodlike.ray import HorovodConfig, HorovodTrainer  # noqa: E402


@pytest.fixture(scope="module")
def local_ray():
    # Ray Train's controller takes in the workers' reports and sees failures at this interval
    # (2 s by default: most of these tests' time); the controller and workers inherit it.
    yield from local_cluster(2, RAY_TRAIN_HEALTH_CHECK_INTERVAL_S="0.2")


def fit(storage, name, config, max_failures=0, key=None):
    trainer = HorovodTrainer(
        ray_train_loops.linear_loop, train_loop_config=config,
        horovod_config=HorovodConfig(timeout_s=30, key=key),
        scaling_config=ray.train.ScalingConfig(num_workers=2),
        datasets={"train": ray_train_loops.linear_dataset()},
        run_config=ray.train.RunConfig(
            name=name, storage_path=str(storage),
            failure_config=ray.train.FailureConfig(max_failures=max_failures)))
    return trainer.fit()


def checkpoint_weights(result):
    with result.checkpoint.as_directory() as folder:
        return np.load(os.path.join(folder, "weights.npy")).ravel()


def check_placement(places):
    """Every rank's hvd rank, size and local rank are Ray Train's world rank, world size and
    local rank."""
    assert len(places) == 2, places
    for world_rank, world_size, local_rank, rank, size, hvd_local_rank in places:
        assert (rank, size, hvd_local_rank) == (world_rank, world_size, local_rank), places
    assert sorted(p[0] for p in places) == [0, 1], places


@pytest.fixture(scope="module")
def uninterrupted(local_ray, tmp_path_factory):
    key = secrets.token_hex(32)
    return fit(tmp_path_factory.mktemp("train"), "uninterrupted", {"key": key}, key=key)


def test_two_workers_train_to_full_batch_gradient_descent(uninterrupted):
    result = uninterrupted
    shards = result.metrics["shards"]
    assert len(shards) == cluster_jobs.STEPS, result.metrics
    np.testing.assert_allclose(checkpoint_weights(result), cluster_jobs.numpy_linear_weights(2),
                               rtol=1e-10)
    # The last report's metrics (rank 0's), with the checkpoint reported alongside them.
    assert result.metrics["step"] == cluster_jobs.STEPS, result.metrics
    assert result.metrics["starts"] == [0], result.metrics  # one attempt, from the start
    check_placement(result.metrics["placement"])
    # The loss rank 0 reported at the last step: over its shard, before that step's update.
    X, y = cluster_jobs.linear_data()
    before_last = cluster_jobs.numpy_linear_weights(2, cluster_jobs.STEPS - 1, shards)
    mine = shards[-1][0]
    expected_loss = np.mean((X[mine] @ before_last - y[mine]) ** 2)
    assert result.metrics["loss"] == pytest.approx(expected_loss, rel=1e-10)
    # HorovodConfig(key=...) is the job's secret on every rank.
    assert result.metrics["secret_is_key"] == [True, True], result.metrics


def test_dataset_is_sharded_over_the_workers(uninterrupted):
    """Each step was an epoch over the Ray dataset passed as datasets={"train": ...}: every
    rank read a part of it, and every sample was read once."""
    shards = uninterrupted.metrics["shards"]
    for step, per_rank in enumerate(shards):
        assert len(per_rank) == 2 and all(per_rank), (step, per_rank)
        assert sorted(i for ids in per_rank for i in ids) == list(range(cluster_jobs.N)), \
            (step, per_rank)
    # The weights follow from exactly these shards (so the training used them).
    np.testing.assert_allclose(
        checkpoint_weights(uninterrupted),
        cluster_jobs.numpy_linear_weights(2, shards_per_step=shards), rtol=1e-12)


def test_killed_worker_resumes_from_the_last_checkpoint(uninterrupted, tmp_path):
    marker = tmp_path / "killed"
    result = fit(tmp_path / "storage", "killed", {"kill_at": 3, "marker": str(marker)},
                 max_failures=1)
    assert marker.exists(), "the worker was never killed"
    # Rank 1 died at step 3 of the first attempt, after the report of step 3: the second
    # attempt started from the last checkpoint the trainer had taken in by then, not from the
    # beginning (V2 takes reports in when it polls the workers, so the last one or two before
    # a worker's death may not have reached it).
    first, second = result.metrics["starts"]
    assert first == 0 and 1 <= second <= 3, result.metrics
    assert result.metrics["step"] == cluster_jobs.STEPS, result.metrics
    check_placement(result.metrics["placement"])
    # Each rank reads its shard in id order: the same sums as the uninterrupted run's when Ray
    # Data splits the same way; the same up to rounding when it does not.
    np.testing.assert_allclose(checkpoint_weights(result), checkpoint_weights(uninterrupted),
                               rtol=1e-12)


def test_ray_train_v1_and_resume_from_checkpoint(uninterrupted, tmp_path):
    """Under Ray Train V1, in a driver process of its own on this module's cluster: a run
    started with resume_from_checkpoint (4 steps of gradient descent in NumPy) goes on from
    there to the uninterrupted run's weights."""
    env = dict(os.environ, RAY_ADDRESS=ray.get_runtime_context().gcs_address)
    done = subprocess.run([sys.executable, str(WORKERS / "ray_train_v1_driver.py"),
                           str(tmp_path)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["trainer_base"] == "ray.train.data_parallel_trainer", found
    assert found["metrics"]["step"] == cluster_jobs.STEPS, found
    assert found["metrics"]["starts"] == [0, 4], found
    check_placement(found["metrics"]["placement"])
    np.testing.assert_allclose(found["weights"], checkpoint_weights(uninterrupted), rtol=1e-12)


def test_bad_arguments_are_refused_before_anything_starts():
    with pytest.raises(TypeError, match="horovod_config must be a horovodlike.ray.HorovodConfig"):
        HorovodTrainer(ray_train_loops.linear_loop, horovod_config={"timeout_s": 5})
    with pytest.raises(TypeError, match="train_loop_per_worker must be a function"):
        HorovodTrainer("train.py")
    with pytest.raises(ValueError, match="timeout_s must be positive"):
        HorovodConfig(timeout_s=0)
    with pytest.raises(ValueError, match="one network interface"):
        HorovodConfig(nics={"eth0", "eth1"})
    with pytest.raises(ValueError, match="key must be a non-empty hex string"):
        HorovodConfig(key="not hex")
    # Ray Train V2 (the default, and this module's) has neither.
    with pytest.raises(ValueError, match="metadata exist.* RAY_TRAIN_V2_ENABLED=0"):
        HorovodTrainer(ray_train_loops.linear_loop, metadata={"a": 1})
    with pytest.raises(ValueError, match="resume_from_checkpoint exist.*train_loop_config"):
        HorovodTrainer(ray_train_loops.linear_loop,
                       resume_from_checkpoint=ray.train.Checkpoint("/nonexistent"))
