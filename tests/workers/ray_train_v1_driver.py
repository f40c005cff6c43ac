"""HorovodTrainer under Ray Train V1 (RAY_TRAIN_V2_ENABLED=0, read when ray.train is first
imported, hence a process of its own), as a driver joining the Ray cluster at RAY_ADDRESS:
ray_train_loops.linear_loop started with resume_from_checkpoint: a checkpoint of the weights of
4 steps of full-batch gradient descent in NumPy. Prints the run's last metrics and weights as
JSON on its last line.

usage: ray_train_v1_driver.py STORAGE_FOLDER"""

import json
import os
import sys

os.environ["RAY_TRAIN_V2_ENABLED"] = "0"

import numpy as np  # noqa: E402
import ray  # noqa: E402
import ray.train  # noqa: E402

import cluster_jobs  # noqa: E402
import ray_train_loops  # noqa: E402
from horovodlike.ray import HorovodConfig, HorovodTrainer  # noqa: E402


def numpy_checkpoint(folder, steps):
    """A checkpoint as linear_loop reports it, of `steps` steps of gradient descent in NumPy."""
    os.makedirs(folder)
    weights = cluster_jobs.numpy_linear_weights(2, steps=steps).reshape(1, -1)
    np.save(os.path.join(folder, "weights.npy"), weights)
    for name, text in (("step", str(steps)), ("starts", "[0]")):
        with open(os.path.join(folder, name), "w") as f:
            f.write(text)
    return ray.train.Checkpoint.from_directory(folder)


def fit(storage, name, config, **options):
    # V1's trainer is an actor of its own; with no CPU of its own, the 2 workers fit 2 CPUs.
    trainer = HorovodTrainer(
        ray_train_loops.linear_loop, train_loop_config=config,
        horovod_config=HorovodConfig(timeout_s=30),
        scaling_config=ray.train.ScalingConfig(num_workers=2, trainer_resources={"CPU": 0}),
        datasets={"train": ray_train_loops.linear_dataset()},
        run_config=ray.train.RunConfig(name=name, storage_path=storage,
                                       failure_config=ray.train.FailureConfig(max_failures=1)),
        **options)
    return trainer.fit()


def main(storage):
    # The workers read the variable too: their ray.train.report must be V1's.
    ray.init(runtime_env={"env_vars": {"RAY_TRAIN_V2_ENABLED": "0"}})
    result = fit(storage, "resumed", {},
                 resume_from_checkpoint=numpy_checkpoint(os.path.join(storage, "start"), 4))
    with result.checkpoint.as_directory() as folder:
        weights = np.load(os.path.join(folder, "weights.npy")).ravel().tolist()
    metrics = {name: result.metrics[name] for name in ("step", "starts", "placement")}
    print(json.dumps({"metrics": metrics, "weights": weights,
                      "trainer_base": HorovodTrainer.__mro__[1].__module__}))


if __name__ == "__main__":
    main(sys.argv[1])
