"""ElasticRayExecutor: elastic training whose workers are Ray actors, with Horovod's API.

The launcher's elastic driver does the work (rounds, retired slots, host changes, the reset
limit); here a worker is a Ray actor on a node instead of a process on a host, and the hosts are
the Ray cluster's live nodes (RayHostDiscovery) or the user's discovery.
"""

from __future__ import annotations

import math
import signal
import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable

from horovodlike.runner.cluster_job import rendezvous_address, start_rendezvous
from horovodlike.runner.elastic_driver import ElasticDriver
from horovodlike.runner.environment import format_number, horovod_environment
from horovodlike.runner.hosts import HostSlots
from horovodlike.runner.output import Console
from horovodlike.runner.rank_process import ReportedRank
from horovodlike.ray.callbacks import CallbackRelay, check_callbacks
from horovodlike.ray.executor import CALLBACK_POLL_S, _first_line
from horovodlike.ray.worker import HorovodWorker

UNBOUNDED = 1 << 30


class RayHostDiscovery:
    """The hosts are the Ray cluster's live nodes (by address), each with as many slots as its
    CPUs (and GPUs, with use_gpu) hold workers."""

    def __init__(self, use_gpu: bool = False, cpus_per_slot: float = 1,
                 gpus_per_slot: float = 1):
        self.use_gpu = use_gpu
        self.cpus_per_slot = cpus_per_slot
        self.gpus_per_slot = gpus_per_slot

    def find_available_hosts_and_slots(self) -> dict[str, int]:
        import ray
        slots: dict[str, int] = {}
        for node in ray.nodes():
            if not node.get("Alive"):
                continue
            resources = node.get("Resources", {})
            count = math.floor(resources.get("CPU", 0) / self.cpus_per_slot + 1e-9)
            if self.use_gpu:
                count = min(count, math.floor(resources.get("GPU", 0) / self.gpus_per_slot
                                              + 1e-9))
            if count > 0:
                address = node["NodeManagerAddress"]
                slots[address] = slots.get(address, 0) + count
        return slots


@dataclass
class ElasticRaySettings:
    """What ElasticRayExecutor.create_settings returns; `discovery` is used when the executor
    is made with override_discovery=False (any object with find_available_hosts_and_slots()
    returning {node address: slots})."""

    min_num_proc: int = 1
    max_num_proc: int | None = None
    reset_limit: int | None = None
    elastic_timeout: float = 600
    timeout_s: float = 30
    ssh_identity_file: str | None = None
    nics: set | None = None
    verbose: int = 1
    discovery: Any = None


class RayWorkerProcess(ReportedRank):
    """One elastic worker as the elastic driver sees a process: it starts a Ray actor on its
    slot's node that runs the training function, and posts RankExited when that call ends
    (0 when it returned, 1 when it raised or the actor died). Stopping it kills the actor."""

    def __init__(self, assignment, env: dict[str, str], launch: Callable):
        super().__init__(assignment, env)  # Ray forwards the actors' output itself
        self.result = None
        self._launch = launch  # (host, env) -> (actor, ObjectRef of the training call)
        self._actor = None
        self._stopped = False  # by the driver, through signal_group

    def start(self, console: Console, events, output_dir) -> None:
        self._actor, future = self._launch(self.hostname, self.env)
        threading.Thread(target=self._wait_for, args=(future, console, events), daemon=True,
                         name=f"ray-worker{self.rank}").start()

    def _wait_for(self, future, console: Console, events) -> None:
        import ray
        import ray.exceptions
        worker = self.env.get("HOROVOD_ELASTIC_WORKER_ID", str(self.rank))
        try:
            self.result = ray.get(future)
            code = 0
        except ray.exceptions.RayActorError as error:
            if not self._stopped:  # the driver stopped it (its node left, the job ended)
                console.message(f"worker {worker}: its Ray actor died ({_first_line(error)})")
            code = 1
        except Exception as error:  # the training function raised
            cause = getattr(error, "cause", None) or error
            console.message(f"worker {worker} raised {type(cause).__name__}: "
                            f"{_first_line(cause)}")
            code = 1
        ray.kill(self._actor, no_restart=True)  # frees its slot for a new worker
        self.exited(code, events)

    def signal_group(self, signum: int) -> None:
        import ray
        if self._actor is not None and signum in (signal.SIGTERM, signal.SIGKILL):
            self._stopped = True
            ray.kill(self._actor, no_restart=True)

    def join_output(self, timeout: float) -> None:
        pass


class ElasticRayExecutor:
    """Elastic training on a Ray cluster.

        settings = ElasticRayExecutor.create_settings(min_num_proc=1, max_num_proc=4)
        executor = ElasticRayExecutor(settings, cpus_per_slot=1)
        executor.start()
        results = executor.run(train)   # train() uses hvd.elastic.run; results of the last
                                        # round's workers, in rank order
    """

    @staticmethod
    def create_settings(min_num_proc: int = 1, max_num_proc: int | None = None,
                        reset_limit: int | None = None, elastic_timeout: float = 600,
                        timeout_s: float = 30, ssh_identity_file: str | None = None,
                        nics=None, min_np: int | None = None, max_np: int | None = None,
                        verbose: int = 1, discovery=None) -> ElasticRaySettings:
        min_num_proc = min_np if min_np is not None else min_num_proc
        max_num_proc = max_np if max_np is not None else max_num_proc
        if not isinstance(min_num_proc, int) or min_num_proc < 1:
            raise ValueError(f"min_num_proc must be a positive integer, got {min_num_proc!r}")
        if max_num_proc is not None and max_num_proc < min_num_proc:
            raise ValueError(f"max_num_proc ({max_num_proc}) must be >= min_num_proc "
                             f"({min_num_proc})")
        if reset_limit is not None and reset_limit < 0:
            raise ValueError(f"reset_limit must be >= 0, got {reset_limit}")
        for name, value in (("elastic_timeout", elastic_timeout), ("timeout_s", timeout_s)):
            if not value > 0:
                raise ValueError(f"{name} must be positive, got {value!r}")
        nics = set(nics or ())
        if len(nics) > 1:
            raise ValueError(f"nics: give one network interface for the ranks, got "
                             f"{sorted(nics)}")
        return ElasticRaySettings(min_num_proc, max_num_proc, reset_limit, elastic_timeout,
                                  timeout_s, ssh_identity_file, nics, verbose, discovery)

    def __init__(self, settings: ElasticRaySettings, use_gpu: bool = False,
                 cpus_per_slot: float = 1, gpus_per_slot: float | None = None,
                 env_vars: dict | None = None, override_discovery: bool = True):
        if gpus_per_slot and not use_gpu:
            raise ValueError("gpus_per_slot is set but use_gpu is False; set use_gpu=True")
        if not cpus_per_slot > 0:
            raise ValueError(f"cpus_per_slot must be positive, got {cpus_per_slot!r}")
        self.settings = settings
        self.use_gpu = use_gpu
        self.cpus_per_slot = cpus_per_slot
        self.gpus_per_slot = (gpus_per_slot or 1) if use_gpu else 0
        self.env_vars = dict(env_vars or {})
        if override_discovery:
            settings.discovery = RayHostDiscovery(use_gpu, cpus_per_slot, self.gpus_per_slot or 1)
        elif settings.discovery is None:
            raise ValueError("override_discovery=False needs settings.discovery: an object "
                             "whose find_available_hosts_and_slots() returns "
                             "{node address: slots}")
        self._server = None
        self._job = None

    def start(self) -> None:
        """Starts the job's rendezvous server in this process."""
        import ray
        if not ray.is_initialized():
            ray.init()
        if self._server is not None:
            raise RuntimeError("ElasticRayExecutor.start() was called twice")
        addresses = [n["NodeManagerAddress"] for n in ray.nodes() if n.get("Alive")]
        address = rendezvous_address(addresses, ray.util.get_node_ip_address())
        interface = next(iter(self.settings.nics or ()), None)
        self._server, self._job = start_rendezvous(address, float(self.settings.timeout_s),
                                                   network_interface=interface)

    def run(self, worker_fn: Callable[[], Any], callbacks: list | None = None) -> list:
        """worker_fn() on every worker of the elastic job until the last round's workers have
        all returned; their results in rank order. `callbacks`: callables, each called here on
        every value the workers send with ray_logger.log() while they run. Raises RuntimeError
        saying why the job stopped (fewer than min_num_proc workers for elastic_timeout, more
        resets than reset_limit, a worker no round could go on without)."""
        import ray
        callbacks = check_callbacks(callbacks)
        if self._server is None:
            raise RuntimeError("the ElasticRayExecutor is not started; call start() first")
        relay = CallbackRelay(callbacks) if callbacks else None
        queue = relay.queue if relay is not None else None
        actor_cls = ray.remote(HorovodWorker)
        node_resources = set(ray.cluster_resources())

        def launch(host, env):
            if f"node:{host}" not in node_resources:
                node_resources.update(ray.cluster_resources())  # a node that joined since
            if f"node:{host}" not in node_resources:
                raise RuntimeError(f"host {host!r} from the discovery is not the address of a "
                                   "node of this Ray cluster")
            actor = actor_cls.options(num_cpus=self.cpus_per_slot, num_gpus=self.gpus_per_slot,
                                      resources={f"node:{host}": 0.001}).remote()
            actor.update_env_vars.remote(env)
            return actor, actor.run.remote(worker_fn, None, None, queue)

        settings = self.settings

        def make_process(assignment, worker_id):
            env = {"PYTHONUNBUFFERED": "1", **horovod_environment(assignment, self._job),
                   "HOROVOD_ELASTIC": "1", "HOROVOD_ELASTIC_WORKER_ID": worker_id,
                   "HOROVOD_ELASTIC_TIMEOUT": format_number(settings.elastic_timeout)}
            env.update(self.env_vars)
            return RayWorkerProcess(assignment, env, launch)

        def discover():
            found = settings.discovery.find_available_hosts_and_slots()
            return [HostSlots(host, int(slots)) for host, slots in found.items() if slots > 0]

        console = Console(sys.stdout.buffer, sys.stderr.buffer)
        driver = ElasticDriver(discover, make_process, settings.min_num_proc,
                               settings.max_num_proc or UNBOUNDED, settings.reset_limit,
                               self._server, console, settings.elastic_timeout,
                               verbose=bool(settings.verbose and settings.verbose > 1),
                               option_names=("min_num_proc", "reset_limit"))
        code = self._run_driver(driver, relay)
        if code != 0:
            raise RuntimeError(f"the elastic Ray job failed: "
                               f"{driver.stop_reason or f'exit code {code}'}")
        return [process.result for process in driver.last_round_processes]

    @staticmethod
    def _run_driver(driver: ElasticDriver, relay: CallbackRelay | None) -> int:
        """driver.run(), with the relay's callbacks served by a thread of their own meanwhile
        (the elastic driver holds this one)."""
        if relay is None:
            return driver.run()
        finished = threading.Event()

        def serve():
            while not finished.wait(CALLBACK_POLL_S):
                relay.deliver()

        server = threading.Thread(target=serve, daemon=True, name="ray-callbacks")
        server.start()
        try:
            code = driver.run()
        except BaseException:
            finished.set()
            server.join()
            relay.queue.shutdown()
            raise
        finished.set()
        server.join()
        relay.close()
        return code

    def shutdown(self) -> None:
        """Stops the rendezvous server (run() has already stopped every worker)."""
        if self._server is not None:
            self._server.stop()
            self._server, self._job = None, None
