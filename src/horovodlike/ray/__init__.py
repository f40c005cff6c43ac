"""Horovod's Ray API: a horovodlike job whose ranks are Ray actors.

``RayExecutor`` runs a fixed number of workers placed by a placement group;
``ElasticRayExecutor`` follows the Ray cluster's live nodes with elastic training;
``HorovodTrainer`` (with ``HorovodConfig``) runs training under Ray Train.
Needs ``ray`` (``pip install "horovodlike[ray]"``); the trainer needs ``ray[train]``.
"""

from horovodlike.ray.executor import RayExecutor, RaySettings
from horovodlike.ray.elastic import ElasticRayExecutor, RayHostDiscovery

__all__ = ["RayExecutor", "RaySettings", "ElasticRayExecutor", "RayHostDiscovery",
           "HorovodTrainer", "HorovodConfig"]

# Imported when first used: ray.train brings pandas and pyarrow, which the executors do not need.
_TRAIN_NAMES = {"HorovodTrainer": "horovodlike.ray.trainer",
                "HorovodConfig": "horovodlike.ray.train_backend"}


def __getattr__(name):
    if name in _TRAIN_NAMES:
        import importlib
        return getattr(importlib.import_module(_TRAIN_NAMES[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
