"""HorovodTrainer: Ray Train's trainer for Horovod-style training, on horovodlike.

Ray Train runs train_loop_per_worker on its workers and does what its other trainers do
(ray.train.report, get_checkpoint, get_context, get_dataset_shard, FailureConfig restarts);
HorovodConfig's backend makes the worker group a horovodlike job first. Ray 2.x has two trainer
implementations, chosen by RAY_TRAIN_V2_ENABLED when ray.train is first imported (V2 unless it
is "0"); HorovodTrainer builds on the one that is live, as Ray's own trainers do.
"""

from __future__ import annotations

from typing import Any, Callable

from horovodlike.ray.train_backend import HorovodConfig

try:
    from ray.train.v2._internal.constants import V2_ENABLED_ENV_VAR, is_v2_enabled
except ImportError:  # a Ray without Train V2: V1 is all there is
    V2_ENABLED_ENV_VAR = "RAY_TRAIN_V2_ENABLED"

    def is_v2_enabled() -> bool:
        return False

if is_v2_enabled():
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer
else:
    from ray.train.data_parallel_trainer import DataParallelTrainer


class HorovodTrainer(DataParallelTrainer):
    """Runs `train_loop_per_worker` (taking no argument, or `train_loop_config`) on
    `scaling_config.num_workers` Ray Train workers that form one horovodlike job: inside it,
    hvd.init() needs no argument, and hvd.rank() / hvd.size() / hvd.local_rank() are Ray
    Train's world rank, world size and local rank.

        trainer = HorovodTrainer(train_loop_per_worker, train_loop_config={"lr": 0.1},
                                 scaling_config=ray.train.ScalingConfig(num_workers=4))
        result = trainer.fit()   # result.metrics, result.checkpoint: the last report's

    `resume_from_checkpoint` and `metadata` exist under Ray Train V1 only
    (RAY_TRAIN_V2_ENABLED=0): V2 removed them from every trainer.
    """

    def __init__(self, train_loop_per_worker: Callable, *, train_loop_config: dict | None = None,
                 horovod_config: HorovodConfig | None = None, scaling_config=None,
                 run_config=None, datasets: dict | None = None, dataset_config=None,
                 resume_from_checkpoint=None, metadata: dict[str, Any] | None = None):
        if not callable(train_loop_per_worker):
            raise TypeError(f"train_loop_per_worker must be a function, got "
                            f"{type(train_loop_per_worker).__name__}")
        horovod_config = horovod_config if horovod_config is not None else HorovodConfig()
        if not isinstance(horovod_config, HorovodConfig):
            raise TypeError(f"horovod_config must be a horovodlike.ray.HorovodConfig, got "
                            f"{type(horovod_config).__name__}")
        _check_v1_only(resume_from_checkpoint=resume_from_checkpoint, metadata=metadata)
        optional = {name: value for name, value in (
            ("resume_from_checkpoint", resume_from_checkpoint), ("metadata", metadata))
            if value is not None}
        super().__init__(train_loop_per_worker, train_loop_config=train_loop_config,
                         backend_config=horovod_config, scaling_config=scaling_config,
                         run_config=run_config, datasets=datasets,
                         dataset_config=dataset_config, **optional)


def _check_v1_only(**arguments) -> None:
    """Ray Train V2 refuses these with a DeprecationWarning raised as an error; say what to do
    instead, before anything starts."""
    given = sorted(name for name, value in arguments.items() if value is not None)
    if given and is_v2_enabled():
        raise ValueError(
            f"HorovodTrainer: {', '.join(given)} exist(s) under Ray Train V1 only, and Ray "
            f"Train V2 is enabled. Pass the checkpoint or values in train_loop_config instead "
            f"(and load the checkpoint when ray.train.get_checkpoint() is None), or set "
            f"{V2_ENABLED_ENV_VAR}=0 before importing ray.train")
