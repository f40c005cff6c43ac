"""horovodlike.spark.run_elastic: elastic training whose slots are Spark tasks (agent.py). The
launcher's elastic driver runs in the Spark driver: the agents that are up are its hosts' slots,
and a worker is a process an agent starts."""

from __future__ import annotations

import sys
import threading
import time

from horovodlike.runner.cluster_job import start_rendezvous
from horovodlike.runner.elastic_driver import ElasticDriver
from horovodlike.runner.environment import format_number, horovod_environment
from horovodlike.runner.hosts import HostSlots
from horovodlike.runner.output import Console
from horovodlike.runner.rank_process import ReportedRank
from horovodlike.spark.agent import (AGENT_PREFIX, DONE_KEY, agent_key, agent_task,
                                     encode_env)
from horovodlike.spark.output import OutputForwarder
from horovodlike.spark.runner import (active_spark_context, check_num_proc, check_options,
                                      driver_address, start_timeout_s)

_POLL_S = 0.1


class Agents:
    """The agents that have come up, and the commands sent to each."""

    def __init__(self, server):
        self._server = server
        self._commands: dict[int, int] = {}
        self._lock = threading.Lock()

    def hosts(self) -> dict[int, str]:
        """partition -> host of each agent that is up."""
        found = {}
        for key in self._server.keys():
            rest = key[len(AGENT_PREFIX):]
            if key.startswith(AGENT_PREFIX) and rest.isdigit():
                found[int(rest)] = self._server.get(key)
        return found

    def slots(self) -> list[HostSlots]:
        counts: dict[str, int] = {}
        for _, host in sorted(self.hosts().items()):
            counts[host] = counts.get(host, 0) + 1
        return [HostSlots(host, count) for host, count in counts.items()]

    def partition_of(self, host: str, index: int) -> int:
        return sorted(p for p, h in self.hosts().items() if h == host)[index]

    def send(self, partition: int, command: str) -> None:
        with self._lock:
            number = self._commands.get(partition, 0)
            self._commands[partition] = number + 1
        self._server.put(agent_key(partition, "cmd", number), command)

    def finish(self) -> None:
        self._server.put(DONE_KEY, "1")
        for partition in self.hosts():
            self.send(partition, "done")


class AgentWorkerProcess(ReportedRank):
    """An elastic worker as the elastic driver sees a process: started and stopped by the agent
    of its slot, which reports its exit code."""

    def __init__(self, assignment, env: dict[str, str], agents: Agents, partition: int,
                 server):
        super().__init__(assignment, env)  # its agent sends the worker's output (output.py)
        self._agents = agents
        self._partition = partition
        self._server = server
        self._stop_sent = False

    def start(self, console: Console, events, output_dir) -> None:
        self._agents.send(self._partition, f"start:{self.rank}:{encode_env(self.env)}")
        threading.Thread(target=self._wait_for_exit, args=(events,), daemon=True,
                         name=f"spark-worker{self.rank}").start()

    def _wait_for_exit(self, events) -> None:
        key = agent_key(self._partition, "exit", self.rank)
        while (value := self._server.get(key)) is None:
            time.sleep(_POLL_S)
        self.exited(int(value), events)

    def signal_group(self, signum: int) -> None:
        if not self._stop_sent and self._code is None:
            self._stop_sent = True
            self._agents.send(self._partition, f"stop:{self.rank}")

    def join_output(self, timeout: float) -> None:
        pass


def run_elastic(fn, args=(), kwargs={}, num_proc=None, min_num_proc=None, max_num_proc=None,
                start_timeout=None, elastic_timeout=None, reset_limit=None, env=None,
                stdout=None, stderr=None, verbose=1, nics=None,
                prefix_output_with_timestamp=False, min_np=None, max_np=None):
    """Elastic training in a Spark application: max_num_proc Spark tasks each offer a slot, and
    fn(*args, **kwargs), which uses hvd.elastic.run, runs in worker processes the tasks start.
    Starts with the slots that are up, goes on with at least min_num_proc workers, retires the
    slot of a worker that fails. Returns the results of the last round's workers in rank order.
    The workers' output is printed here as run() prints the ranks', each line labelled with
    its worker's number (workers are numbered in start order, as horovodlikerun's elastic
    output prefixes are)."""
    import cloudpickle
    context = active_spark_context()
    num_proc = check_num_proc(num_proc, context)
    min_np = min_np if min_np is not None else (min_num_proc or num_proc)
    max_np = max_np if max_np is not None else (max_num_proc or num_proc)
    if not 1 <= min_np <= num_proc <= max_np:
        raise ValueError(f"run_elastic needs 1 <= min_num_proc ({min_np}) <= num_proc "
                         f"({num_proc}) <= max_num_proc ({max_np})")
    if reset_limit is not None and reset_limit < 0:
        raise ValueError(f"reset_limit must be >= 0, got {reset_limit}")
    interface = check_options(None, None, nics)
    elastic_timeout = 600.0 if elastic_timeout is None else float(elastic_timeout)
    timeout = start_timeout_s(start_timeout)
    server, job = start_rendezvous(driver_address(context), timeout,
                                   network_interface=interface)
    agents = Agents(server)
    payload = cloudpickle.dumps((fn, tuple(args), dict(kwargs)))
    outcome: dict = {}

    def run_agents():
        try:
            outcome["results"] = (context.parallelize(range(max_np), max_np)
                                  .mapPartitions(agent_task(payload, job, env,
                                                            prefix_output_with_timestamp))
                                  .collect())
        except Exception as error:  # reported after the driver has ended
            outcome["error"] = error

    spark_job = threading.Thread(target=run_agents, daemon=True, name="spark-agents")
    forwarder = OutputForwarder(server, stdout, stderr)
    forwarder.start()
    try:
        context.setJobDescription(f"horovodlike.spark.run_elastic (up to {max_np} workers)")
        spark_job.start()
        # The elastic driver ends a job that has no worker: start it once num_proc agents are up.
        deadline = time.monotonic() + timeout
        while len(agents.hosts()) < num_proc and "error" not in outcome:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {len(agents.hosts())} of num_proc={num_proc} Spark "
                                   f"tasks started within start_timeout={timeout:g} s; does "
                                   f"the application have {num_proc} free task slots?")
            time.sleep(_POLL_S)

        def make_process(assignment, worker_id):
            host, index = worker_id.rsplit("/", 1)
            worker_env = {"PYTHONUNBUFFERED": "1", **horovod_environment(assignment, job),
                          "HOROVOD_ELASTIC": "1", "HOROVOD_ELASTIC_WORKER_ID": worker_id,
                          "HOROVOD_ELASTIC_TIMEOUT": format_number(elastic_timeout)}
            return AgentWorkerProcess(assignment, worker_env, agents,
                                      agents.partition_of(host, int(index)), server)

        def discover():
            return [] if "error" in outcome else agents.slots()

        console = Console(sys.stdout.buffer, sys.stderr.buffer)
        driver = ElasticDriver(discover, make_process, min_np, max_np, reset_limit, server,
                               console, elastic_timeout, verbose=bool(verbose and verbose > 1),
                               option_names=("min_num_proc", "reset_limit"))
        code = driver.run()
        members = [process.rank for process in driver.last_round_processes]
    finally:
        agents.finish()
        spark_job.join(timeout=60)
        forwarder.stop()
        server.stop()
    if "error" in outcome:
        raise RuntimeError(f"the Spark tasks of run_elastic failed: {outcome['error']}")
    if code != 0:
        raise RuntimeError(f"the elastic Spark job failed: "
                           f"{driver.stop_reason or f'exit code {code}'}")
    results = {worker: result for worker, _, result in outcome.get("results", [])}
    return [results.get(worker) for worker in members]
