"""RayExecutor: a horovodlike job whose ranks are Ray actors, with Horovod's Ray API.

The driver (the process that calls start()) holds the job's rendezvous server and secret, as
horovodlikerun does; Ray places the actors, and their ranks follow the nodes Ray chose: ranks are
grouped by node, local and cross ranks as with a host list.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from horovodlike.runner.cluster_job import assign_by_host, rendezvous_address, start_rendezvous
from horovodlike.runner.environment import horovod_environment
from horovodlike.ray.callbacks import CallbackRelay, check_callbacks
from horovodlike.ray.placement import WorkerShape, reserve
from horovodlike.ray.worker import HorovodWorker

# After the first worker fails, how long the others have to fail because of it (they raise
# HorovodInternalError within seconds) before run() names the first one anyway.
FAILURE_GRACE_S = 10.0
# How often the driver hands the workers' logged values to the callbacks while a call runs.
CALLBACK_POLL_S = 0.05


@dataclass
class RaySettings:
    """What RayExecutor.create_settings returns. `timeout_s`: seconds the ranks have to find
    each other in hvd.init() (HOROVOD_START_TIMEOUT). `nics`: the one network interface the
    ranks communicate over. `ssh_identity_file` is kept for Horovod's signature: Ray starts the
    workers, no ssh is used."""

    timeout_s: float = 30
    ssh_identity_file: str | None = None
    placement_group_timeout_s: float = 100
    nics: set = field(default_factory=set)
    verbose: int = 1


def node_labels(nodes: list[tuple[str, str]]) -> list[str]:
    """A host name for each worker from its (node id, address): the address, unless several
    Ray nodes share it (nodes started on one machine), then the address and the node id."""
    ids_by_address: dict[str, set[str]] = {}
    for node_id, address in nodes:
        ids_by_address.setdefault(address, set()).add(node_id)
    return [address if len(ids_by_address[address]) == 1 else f"{address}-{node_id[:12]}"
            for node_id, address in nodes]


def visible_gpus(labels: list[str], nodes: list[dict], host: str) -> str:
    """Every GPU Ray gave the workers of `host`, in local rank order, so that
    hvd.local_rank() indexes this worker's own one (Ray would show each only its own)."""
    ids: list[str] = []  # in local rank order: worker order within the host
    for label, node in zip(labels, nodes):
        ids += [gpu for gpu in node["gpu_ids"] if label == host and gpu not in ids]
    return ",".join(ids)


def describe_failure(rank: int, host: str, error: BaseException) -> str:
    import ray.exceptions
    if isinstance(error, ray.exceptions.RayActorError):
        return f"rank {rank} (on {host}) died: its Ray actor is gone ({_first_line(error)})"
    if isinstance(error, ray.exceptions.RayTaskError):
        cause = error.cause if getattr(error, "cause", None) is not None else error
        return f"rank {rank} (on {host}) raised {type(cause).__name__}: {_first_line(cause)}"
    return f"rank {rank} (on {host}) failed: {type(error).__name__}: {_first_line(error)}"


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else "no message"


def gather(futures: list, hosts: list[str], on_failure: Callable[[str], None],
           relay: CallbackRelay | None = None) -> list:
    """The results of one call on every rank, in rank order. When a rank fails, waits
    FAILURE_GRACE_S for the others and raises RuntimeError naming the rank that failed first in
    cause: one that did not fail with HorovodInternalError (the others' consequence of it).
    With a relay, its callbacks get the workers' logged values while they run."""
    import ray
    # Deferred: the module imports without the core (which the exceptions' module needs).
    from horovodlike.common.exceptions import HorovodInternalError
    results: list[Any] = [None] * len(futures)
    failures: list[tuple[int, BaseException]] = []
    pending = {future: rank for rank, future in enumerate(futures)}
    deadline = None
    while pending:
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        if relay is not None:
            relay.deliver()
            timeout = CALLBACK_POLL_S if timeout is None else min(timeout, CALLBACK_POLL_S)
        done, _ = ray.wait(list(pending), num_returns=1, timeout=timeout)
        if not done:
            if relay is not None and (deadline is None or time.monotonic() < deadline):
                continue
            break  # the grace is over: some ranks still run
        for future in done:
            rank = pending.pop(future)
            try:
                results[rank] = ray.get(future)
            except Exception as error:  # the rank's failure, described below
                if not failures:
                    deadline = time.monotonic() + FAILURE_GRACE_S
                    on_failure(describe_failure(rank, hosts[rank], error))
                failures.append((rank, error))
    if not failures:
        return results
    primary = next(((r, e) for r, e in failures if not isinstance(e, HorovodInternalError)),
                   failures[0])
    message = describe_failure(primary[0], hosts[primary[0]], primary[1])
    others = sorted(r for r, _ in failures if r != primary[0])
    if others:
        message += f"; then rank{'s' if len(others) > 1 else ''} {', '.join(map(str, others))}"
        message += " failed too"
    if pending:
        message += f"; rank{'s' if len(pending) > 1 else ''} "
        message += f"{', '.join(str(r) for r in sorted(pending.values()))} still running"
    raise RuntimeError(message) from primary[1]


class RayExecutor:
    """Runs functions on a horovodlike job of Ray actors.

        settings = RayExecutor.create_settings(timeout_s=30)
        executor = RayExecutor(settings, num_workers=4, cpus_per_worker=1)
        executor.start()
        results = executor.run(train, args=[config])   # one result a rank, in rank order
        executor.shutdown()
    """

    @classmethod
    def create_settings(cls, timeout_s=30, ssh_identity_file=None, ssh_str=None,
                        placement_group_timeout_s=100, nics=None) -> RaySettings:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s!r}")
        if not placement_group_timeout_s > 0:
            raise ValueError(f"placement_group_timeout_s must be positive, got "
                             f"{placement_group_timeout_s!r}")
        nics = set(nics or ())
        if len(nics) > 1:
            raise ValueError(f"nics: give one network interface for the ranks, got "
                             f"{sorted(nics)}")
        return RaySettings(timeout_s=timeout_s, ssh_identity_file=ssh_identity_file,
                           placement_group_timeout_s=placement_group_timeout_s, nics=nics)

    def __init__(self, settings: RaySettings, num_workers: int | None = None,
                 num_hosts: int | None = None, num_workers_per_host: int = 1,
                 cpus_per_worker: float = 1, use_gpu: bool = False,
                 gpus_per_worker: float | None = None, use_current_placement_group: bool = True):
        if gpus_per_worker and not use_gpu:
            raise ValueError("gpus_per_worker is set but use_gpu is False; set use_gpu=True")
        self.settings = settings
        self.shape = WorkerShape(num_workers, num_hosts, num_workers_per_host, cpus_per_worker,
                                 (gpus_per_worker or 1) if use_gpu else 0)
        self.use_gpu = use_gpu
        self._use_current_placement_group = use_current_placement_group
        self._group = None
        self._owns_group = False
        self._server = None
        self.workers: list = []  # actor handles in rank order
        self.hosts: list[str] = []
        self.nodes: list[dict] = []  # where each actor runs, in start order
        self._failure: str | None = None

    @property
    def num_workers(self) -> int:
        return self.shape.total_workers

    def start(self, executable_cls: type | None = None, executable_args: list | None = None,
              executable_kwargs: dict | None = None,
              extra_env_vars: dict | None = None) -> None:
        """Places the workers, forms the job and, with `executable_cls`, creates one object of
        it in each worker (what execute() passes to its function)."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
        if self.workers:
            raise RuntimeError("RayExecutor.start() was called twice; call shutdown() first")
        if not ray.is_initialized():
            ray.init()
        try:
            self._group, self._owns_group = reserve(
                self.shape, self.settings.placement_group_timeout_s,
                self._use_current_placement_group)
            bundle_count = len(self._group.bundle_specs)
            actor_cls = ray.remote(HorovodWorker)
            actors = [actor_cls.options(
                num_cpus=self.shape.cpus_per_worker, num_gpus=self.shape.gpus_per_worker,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    self._group, placement_group_bundle_index=self.shape.bundle_of(
                        index, bundle_count))).remote()
                for index in range(self.num_workers)]
            self.workers = actors  # so that shutdown() finds them if what follows fails
            try:
                nodes = ray.get([actor.node.remote() for actor in actors],
                                timeout=self.settings.placement_group_timeout_s)
            except ray.exceptions.GetTimeoutError:
                raise TimeoutError(
                    f"the {self.num_workers} worker actors did not start within "
                    f"placement_group_timeout_s={self.settings.placement_group_timeout_s:g} s "
                    "although their placement group was ready; is the cluster overloaded?"
                ) from None
            self.nodes = nodes
            labels = node_labels([(node["node_id"], node["address"]) for node in nodes])
            assignments = assign_by_host(labels)
            address = rendezvous_address([node["address"] for node in nodes],
                                         ray.util.get_node_ip_address())
            interface = next(iter(self.settings.nics), None)
            self._server, job = start_rendezvous(address, float(self.settings.timeout_s),
                                                 network_interface=interface)
            order = sorted(range(len(actors)), key=lambda i: assignments[i].rank)
            self.workers = [actors[i] for i in order]
            self.hosts = [labels[i] for i in order]
            env_updates = []
            for i in order:
                env = {"PYTHONUNBUFFERED": "1", **horovod_environment(assignments[i], job)}
                if self.use_gpu:
                    env["CUDA_VISIBLE_DEVICES"] = visible_gpus(labels, nodes, labels[i])
                env.update(extra_env_vars or {})
                env_updates.append(actors[i].update_env_vars.remote(env))
            ray.get(env_updates)
            if executable_cls is not None:
                ray.get([w.start_executable.remote(executable_cls, executable_args,
                                                   executable_kwargs) for w in self.workers])
        except BaseException:
            self.shutdown()
            raise

    def run_remote(self, fn: Callable, args: list | None = None,
                   kwargs: dict | None = None) -> list:
        """fn(*args, **kwargs) on every worker; the ObjectRefs of the results, in rank order."""
        self._check_running()
        return [w.run.remote(fn, args, kwargs) for w in self.workers]

    def run(self, fn: Callable, args: list | None = None, kwargs: dict | None = None,
            callbacks: list | None = None) -> list:
        """fn(*args, **kwargs) on every worker; the results in rank order. A rank that fails
        fails the call, named in the RuntimeError raised here. `callbacks`: callables, each
        called here on every value the workers send with ray_logger.log() while fn runs."""
        self._check_running()
        return self._call(lambda worker, queue: worker.run.remote(fn, args, kwargs, queue),
                          callbacks)

    def execute(self, fn: Callable, callbacks: list | None = None) -> list:
        """fn(executable) on every worker (the object start() made of executable_cls, or None);
        the results in rank order. `callbacks` as for run()."""
        self._check_running()
        return self._call(lambda worker, queue: worker.execute.remote(fn, queue), callbacks)

    def execute_single(self, fn: Callable) -> Any:
        """fn(executable) on the worker of rank 0 only."""
        import ray
        self._check_running()
        return ray.get(self.workers[0].execute.remote(fn))

    def shutdown(self) -> None:
        """Kills every worker actor, frees the placement group this executor made and stops the
        rendezvous server. The executor can be started again."""
        import ray
        from ray.util.placement_group import remove_placement_group
        for actor in self.workers:
            ray.kill(actor, no_restart=True)
        self.workers, self.hosts = [], []
        if self._group is not None and self._owns_group:
            remove_placement_group(self._group)
        self._group, self._owns_group = None, False
        if self._server is not None:
            self._server.stop()
            self._server = None
        self._failure = None

    def _call(self, submit: Callable, callbacks: list | None) -> list:
        """submit(worker, queue) on every worker, gathered; with callbacks, through a relay
        that lives for this call only."""
        callbacks = check_callbacks(callbacks)
        if not callbacks:
            return self._gather([submit(w, None) for w in self.workers])
        relay = CallbackRelay(callbacks)
        try:
            results = self._gather([submit(w, relay.queue) for w in self.workers], relay)
        except BaseException:
            relay.queue.shutdown()
            raise
        relay.close()
        return results

    def _gather(self, futures: list, relay: CallbackRelay | None = None) -> list:
        def on_failure(message):
            self._failure = message
            # Ranks still waiting for their peers in hvd.init() learn it at once.
            self._server.abort(message)
        return gather(futures, self.hosts, on_failure, relay)

    def _check_running(self) -> None:
        if not self.workers:
            raise RuntimeError("the RayExecutor is not started; call start() first")
        if self._failure is not None:
            raise RuntimeError(f"this job failed ({self._failure}); call shutdown() and "
                               "start() to run another")
