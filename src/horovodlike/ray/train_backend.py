"""HorovodConfig and its Backend: Ray Train's hooks that turn a Ray Train worker group into a
horovodlike job, so that hvd.init() inside train_loop_per_worker finds its peers.

Ray Train calls the Backend in the process that runs its trainer (the controller): on_start
gets where each worker runs, starts the job's rendezvous server there with a new secret, and
gives every worker its HOROVOD_* variables; on_shutdown stops the server. Each time Ray Train
restarts the workers after a failure, the new group is a new job.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import ray
from ray.train.backend import Backend, BackendConfig

from horovodlike.runner.cluster_job import assign_by_host, rendezvous_address, start_rendezvous
from horovodlike.runner.environment import horovod_environment
from horovodlike.ray.worker import describe_node, stop_runtime, update_env_vars


@contextlib.contextmanager
def runtime_per_call():
    """Around train_loop_per_worker on each worker: when it returns or raises, the core it
    started with hvd.init() is shut down, so that its peers fail at once instead of waiting for
    a rank that will never send, and the next attempt in this process starts a fresh job."""
    try:
        yield
    finally:
        stop_runtime()


def _is_hex(text) -> bool:
    try:
        return isinstance(text, str) and len(bytes.fromhex(text)) > 0
    except ValueError:
        return False


@dataclass
class HorovodConfig(BackendConfig):
    """How the workers form their horovodlike job, with the fields of Ray's HorovodConfig.

    `timeout_s`: seconds the ranks have to find each other in hvd.init()
    (HOROVOD_START_TIMEOUT). `nics`: the one network interface the ranks communicate over.
    `key`: the job's secret as a hex string (a new random one when None; a given key is used
    for every restart of the group). `verbose`, `ssh_port`, `ssh_identity_file`, `ssh_str`
    and `placement_group_timeout_s` are kept for Ray's signature: Ray Train places and starts
    the workers, no ssh is involved.
    """

    nics: set | None = None
    verbose: int = 1
    key: str | None = None
    ssh_port: int | None = None
    ssh_identity_file: str | None = None
    ssh_str: str | None = None
    timeout_s: int = 300
    placement_group_timeout_s: int = 100

    def __post_init__(self):
        if not self.timeout_s > 0:
            raise ValueError(f"HorovodConfig: timeout_s must be positive, got {self.timeout_s!r}")
        if self.nics is not None and len(set(self.nics)) > 1:
            raise ValueError(f"HorovodConfig: nics: give one network interface for the ranks, "
                             f"got {sorted(self.nics)}")
        if self.key is not None and not _is_hex(self.key):
            raise ValueError("HorovodConfig: key must be a non-empty hex string (e.g. "
                             "secrets.token_hex(32)), or None for a new one per job")

    @property
    def backend_cls(self):
        return HorovodBackend

    @property
    def train_func_context(self):
        return runtime_per_call

    @property
    def network_interface(self) -> str | None:
        return next(iter(self.nics), None) if self.nics else None


class HorovodBackend(Backend):
    """Sets up horovodlike on a Ray Train worker group (one object per process: Ray's Backend
    is a singleton, so it holds the running group's rendezvous server)."""

    # Each worker sees every GPU of its node's workers, in local rank order, as with
    # horovodlikerun: hvd.local_rank() indexes this worker's own one.
    share_cuda_visible_devices: bool = True

    _server = None

    def on_start(self, worker_group, backend_config: HorovodConfig) -> None:
        """Gives each worker, in Ray Train's world rank order, the HOROVOD_* variables of its
        rank: ranks grouped by node address as Ray Train groups them, so hvd.rank() and
        hvd.local_rank() are Ray Train's world and local ranks."""
        self._stop_server()  # one left by a group whose shutdown did not reach us
        nodes = worker_group.execute(describe_node)
        addresses = [node["address"] for node in nodes]
        assignments = assign_by_host(addresses)
        address = rendezvous_address(addresses, ray.util.get_node_ip_address())
        self._server, job = start_rendezvous(
            address, float(backend_config.timeout_s),
            network_interface=backend_config.network_interface, secret=backend_config.key)
        try:
            ray.get([worker_group.execute_single_async(
                index, update_env_vars,
                {"PYTHONUNBUFFERED": "1", **horovod_environment(assignment, job)})
                for index, assignment in enumerate(assignments)])
        except BaseException:
            self._stop_server()
            raise

    def on_shutdown(self, worker_group, backend_config: HorovodConfig) -> None:
        # The workers' cores were shut down when train_loop_per_worker ended (runtime_per_call),
        # or go with their processes; a dead worker must not keep the server from stopping.
        self._stop_server()

    def _stop_server(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None
