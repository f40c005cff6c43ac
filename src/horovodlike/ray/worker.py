"""The Ray actor that holds one rank: it takes the rank's HOROVOD_* variables before the user's
function calls hvd.init(), runs functions, and holds the user's executable object."""

from __future__ import annotations

import os
import socket

from horovodlike.ray import ray_logger


def describe_node() -> dict:
    """Where this process runs: Ray node id, node address, host name, process id, and the GPUs
    Ray gave it."""
    import ray
    return {"node_id": ray.get_runtime_context().get_node_id(),
            "address": ray.util.get_node_ip_address(), "hostname": socket.gethostname(),
            "pid": os.getpid(), "gpu_ids": [str(i) for i in ray.get_gpu_ids()]}


def update_env_vars(env: dict) -> None:
    os.environ.update({str(name): str(value) for name, value in env.items()})


def stop_runtime() -> None:
    """Shuts the core down in this process if it runs: its peers then fail with
    HorovodInternalError instead of waiting on a rank that will never send."""
    from horovodlike import _core  # deferred: the module imports without the core
    if _core.is_initialized():
        _core.shutdown()


class HorovodWorker:
    """One rank of a job started by RayExecutor or ElasticRayExecutor."""

    def __init__(self):
        self.executable = None

    def node(self) -> dict:
        return describe_node()

    def update_env_vars(self, env: dict) -> None:
        update_env_vars(env)

    def start_executable(self, executable_cls, args, kwargs) -> None:
        self.executable = executable_cls(*(args or ()), **(kwargs or {}))

    def execute(self, fn, queue=None):
        """fn(executable): Horovod's RayExecutor.execute. `queue`: where ray_logger.log sends
        values during the call (the driver's callbacks)."""
        return self._guarded(fn, (self.executable,), {}, queue)

    def run(self, fn, args, kwargs, queue=None):
        return self._guarded(fn, tuple(args or ()), dict(kwargs or {}), queue)

    def stop_runtime(self) -> None:
        stop_runtime()

    def _guarded(self, fn, args, kwargs, queue):
        ray_logger.configure(queue)
        try:
            return fn(*args, **kwargs)
        except BaseException:
            # The actor lives on after the exception; its runtime must not, or the other ranks
            # would wait in their collectives for this one until the peer timeout.
            stop_runtime()
            raise
        finally:
            ray_logger.configure(None)
