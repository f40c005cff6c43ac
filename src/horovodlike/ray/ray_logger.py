"""What a worker sends to the driver while its function runs: the values it logs reach the
`callbacks` of RayExecutor.run / execute and ElasticRayExecutor.run, each callback called on each
value in the driver as it arrives (Horovod's horovod.ray.ray_logger).

    from horovodlike.ray import ray_logger
    ray_logger.log({"epoch": epoch, "loss": loss})   # in the training function
"""

from __future__ import annotations

import os
import warnings

_queue = None  # a ray.util.queue.Queue while a call with callbacks runs in this worker
_warned = False


def configure(queue) -> None:
    """Where log() sends values; None when no call with callbacks is running."""
    global _queue
    _queue = queue


def log(info, chief_only: bool = True) -> None:
    """Sends `info` (anything picklable) to the driver's callbacks. With chief_only (the
    default) only rank 0's values are sent, the other ranks' calls do nothing."""
    global _warned
    if chief_only and _rank() != 0:
        return
    if _queue is None:
        if not _warned:
            _warned = True
            warnings.warn("ray_logger.log() was called but the running call has no callbacks; "
                          "pass callbacks= to run() or execute() to receive the values")
        return
    _queue.put(info)


def _rank() -> int:
    """This worker's rank: the runtime's once hvd.init() ran (it changes in elastic jobs), else
    the one the executor gave the worker."""
    from horovodlike import _core  # deferred: the module imports without the core
    if _core.is_initialized():
        return _core.rank()
    return int(os.environ.get("HOROVOD_RANK", "-1"))
