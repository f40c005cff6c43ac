"""The elastic driver: keeps a job running while workers fail and hosts come and go.

Each slot a host offers (host, index) can hold one worker. The driver starts workers in the
slots the discovery script reports, up to --max-np, and forms *rounds*: once every running
worker has said it is ready (rendezvous key ``elastic/ready/<worker>/<attempt>``), it numbers
them (ranks ordered by host, then slot) and answers each one
(``elastic/assign/<worker>/<attempt>`` = ``round,rank,size,local_rank,local_size,cross_rank,
cross_size,hosts_version``). A worker that fails is not restarted (its slot is retired); the
others raise HorovodInternalError, roll back to their last commit and ask for the next round. A
worker that stops responding (stopped, hung, swapped out) fails the same way: the others give up
on it after HOROVOD_PEER_TIMEOUT_SECONDS and report it (failures.py), and the driver, which
would otherwise wait for its ready key, stops it (SIGTERM, then SIGKILL) and retires its slot
once it has not asked for the next round within HUNG_GRACE_S of the reports. Two silences no
report can name get the same treatment: a member of the last round that has not asked for the
next one HOROVOD_PEER_TIMEOUT_SECONDS (+ HUNG_GRACE_S) after another member did (it stopped
before its peers could wait on it, e.g. while they connected), and a new worker that has not asked
for its first round within --start-timeout (+ HUNG_GRACE_S) of its start while others wait for
one. New slots get new
workers, and the host-set version (``elastic/hosts_version``) tells the running workers to
re-form at their next commit.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from queue import Empty, SimpleQueue
from typing import Callable

from horovodlike.runner import failures
from horovodlike.runner.hosts import HostError, HostSlots, RankAssignment, parse_hosts
from horovodlike.runner.job import KILL_GRACE_S, stop_processes
from horovodlike.runner.output import Console, join_forwarders
from horovodlike.runner.rank_process import RankExited, RankProcess, describe_exit
from horovodlike.runner.rendezvous import RendezvousServer

DISCOVERY_INTERVAL_S = 1.0
# How long a worker the others reported as stopped responding has to show otherwise (by asking
# for the next round) before it is stopped: the reports of a race between two timeouts settle.
HUNG_GRACE_S = 2.0
_POLL_S = 0.05
_HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def discover_with_script(script: str, timeout_s: float = 30.0) -> list[HostSlots]:
    """Runs the host discovery script; its output is one `host:slots` (or `host`) a line."""
    try:
        result = subprocess.run(script, shell=True, capture_output=True, text=True,
                                timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise HostError(f"host discovery script {script!r} did not finish in "
                        f"{timeout_s:g} s") from None
    if result.returncode != 0:
        raise HostError(f"host discovery script {script!r} exited with code "
                        f"{result.returncode}: {result.stderr.strip()[-300:]}")
    lines = [line.strip() for line in result.stdout.splitlines() if line.strip()]
    return parse_hosts(",".join(lines)) if lines else []


@dataclass
class Worker:
    slot: tuple[str, int]  # (host, index)
    index: int             # order of creation; prefixes its output
    process: RankProcess
    attempt: int = 0       # the round request the driver waits for next
    running: bool = True
    exit_code: int | None = None
    removed: bool = False  # stopped because its host left
    hung: bool = False     # stopped because it stopped responding
    started: float = field(default_factory=time.monotonic)

    @property
    def id(self) -> str:
        return f"{self.slot[0]}/{self.slot[1]}"


@dataclass
class Round:
    number: int
    members: list[Worker] = field(default_factory=list)


class ElasticDriver:
    def __init__(self, discover: Callable[[], list[HostSlots]], make_process, min_np: int,
                 max_np: int, reset_limit: int | None, server: RendezvousServer,
                 console: Console, elastic_timeout_s: float, output_dir: str | None = None,
                 verbose: bool = False, option_names: tuple[str, str] = ("--min-np",
                                                                         "--reset-limit"),
                 start_timeout_s: float = 30.0, peer_timeout_s: float | None = None):
        self._discover = discover
        self._make_process = make_process  # (RankAssignment, worker id) -> RankProcess
        self._min_np = min_np
        self._max_np = max_np
        self._reset_limit = reset_limit
        self._server = server
        self._console = console
        self._timeout_s = elastic_timeout_s
        self._start_timeout_s = start_timeout_s
        # The workers' own HOROVOD_PEER_TIMEOUT_SECONDS (they inherit this environment).
        self._peer_timeout_s = peer_timeout_s if peer_timeout_s is not None else float(
            os.environ.get("HOROVOD_PEER_TIMEOUT_SECONDS") or 300.0)
        self._output_dir = output_dir
        self._verbose = verbose
        # How the caller's users set min_np and reset_limit, for the messages that name them.
        self._min_np_name, self._reset_limit_name = option_names
        self._events: SimpleQueue = SimpleQueue()
        self._signals_received = 0
        self._workers: list[Worker] = []
        self._retired: set[tuple[str, int]] = set()
        self._host_order: list[str] = []
        self._round: Round | None = None
        self._hosts_version = 0
        self._short_since: float | None = None
        self._suspects: dict[int, float] = {}  # worker index -> when first reported hung
        self._round_over_since: float | None = None  # when a member first asked for the next
        self._waiting_since: float | None = None     # when a worker first waited for a round
        # Why the job stopped (the driver's last word), for an API that raises instead of
        # printing: ElasticRayExecutor.run, spark.run_elastic.
        self.stop_reason: str | None = None

    @property
    def last_round_processes(self) -> list:
        """The processes of the last round's workers, in rank order."""
        return [worker.process for worker in self._round.members] if self._round else []

    # ------------------------------------------------------------------ main loop
    def run(self) -> int:
        previous = {}
        if threading.current_thread() is threading.main_thread():
            previous = {s: signal.signal(s, self._on_signal) for s in _HANDLED_SIGNALS}
        self._server.put("elastic/hosts_version", "0")
        try:
            return self._supervise()
        finally:
            self._stop(self._running())
            join_forwarders([f for w in self._workers for f in w.process.forwarders],
                            idle_timeout=1.0)
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _on_signal(self, signum, frame) -> None:
        self._signals_received += 1
        self._events.put(signum)

    def _running(self) -> list[Worker]:
        return [w for w in self._workers if w.running]

    def _supervise(self) -> int:
        next_discovery = 0.0
        while True:
            try:
                event = self._events.get(timeout=_POLL_S)
            except Empty:
                event = None
            if isinstance(event, RankExited):
                self._on_exit(self._workers[event.rank], event.returncode)
            elif event is not None:
                self._give_up(f"received {signal.Signals(event).name}; stopping the job")
                return 128 + event
            if time.monotonic() >= next_discovery:
                try:
                    self._apply_discovery(self._discover())
                except HostError as error:
                    self._give_up(f"{error}; stopping the job")
                    return 1
                next_discovery = time.monotonic() + DISCOVERY_INTERVAL_S
            verdict = self._check_progress()
            if verdict is not None:
                return verdict

    def _give_up(self, reason: str) -> None:
        self.stop_reason = reason
        self._console.message(reason)

    # ------------------------------------------------------------------ workers
    def _on_exit(self, worker: Worker, returncode: int) -> None:
        worker.running = False
        worker.exit_code = returncode
        worker.process.join_output(timeout=0.5)
        if returncode != 0 and not worker.removed and not worker.hung:
            self._retired.add(worker.slot)
            what, _ = describe_exit(returncode)
            self._console.message(f"worker {worker.id} {what}; its slot is retired and the job "
                                  "goes on with the others")

    def _apply_discovery(self, hosts: list[HostSlots]) -> None:
        for host in hosts:
            if host.hostname not in self._host_order:
                self._host_order.append(host.hostname)
        offered = {(h.hostname, i) for h in hosts for i in range(h.slots)}
        changed = False
        for worker in self._running():
            if worker.slot not in offered and not worker.removed:
                worker.removed = True  # its host left: stop it, not a failure
                self._stop([worker])
                changed = True
        occupied = {w.slot for w in self._workers if w.running or w.exit_code == 0}
        free = sorted((s for s in offered - occupied - self._retired),
                      key=lambda s: (self._host_order.index(s[0]), s[1]))
        room = self._max_np - len(self._running())
        for slot in free[:max(0, room)]:
            self._start_worker(slot)
            changed = True
        if changed and self._round is not None:
            self._hosts_version += 1
            self._server.put("elastic/hosts_version", str(self._hosts_version))

    def _start_worker(self, slot: tuple[str, int]) -> None:
        index = len(self._workers)
        placeholder = RankAssignment(rank=index, size=self._max_np, local_rank=slot[1],
                                     local_size=1, cross_rank=0, cross_size=1,
                                     hostname=slot[0])
        process = self._make_process(placeholder, f"{slot[0]}/{slot[1]}")
        worker = Worker(slot=slot, index=index, process=process)
        self._workers.append(worker)
        process.start(self._console, self._events, self._output_dir)
        if self._verbose:
            self._console.message(f"started worker {worker.id} (output prefix [{index}])",
                                  "stdout")

    def _stop(self, workers: list[Worker]) -> None:
        live = [w.process for w in workers if w.process.poll() is None]
        if live:
            stop_processes(live, KILL_GRACE_S, lambda: self._signals_received)

    # ------------------------------------------------------------------ rounds
    def _check_progress(self) -> int | None:
        running = self._running()
        if not running:
            return self._final_verdict()
        if self._round is not None and all(w.exit_code == 0 for w in self._round.members):
            # Training is over; workers that arrived too late for it have nothing to join.
            self._stop(running)
            return 0
        if len(running) < self._min_np:
            self._short_since = self._short_since or time.monotonic()
            if time.monotonic() - self._short_since > self._timeout_s:
                self._give_up(
                    f"only {len(running)} workers left, fewer than {self._min_np_name} "
                    f"{self._min_np}, "
                    f"for {self._timeout_s:g} s; stopping the job")
                return 1
            return None
        self._short_since = None
        keys = self._server.keys()
        if all(f"elastic/ready/{w.id}/{w.attempt}" in keys for w in running):
            return self._form_round(running)
        self._stop_hung_workers(keys)
        self._stop_silent_workers(keys, running)
        return None

    def _stop_hung_workers(self, keys: set[str]) -> None:
        """Stops each worker of the current round that the others reported as stopped responding
        and that has not asked for the next round within HUNG_GRACE_S since: the next round can
        form without it."""
        if self._round is None:
            return
        blamed = failures.stopped_responding(
            failures.read_records(self._server, generation=self._round.number))
        now = time.monotonic()
        suspects, hung = {}, []
        for rank, record in sorted(blamed.items()):
            worker = self._round.members[rank] if 0 <= rank < len(self._round.members) else None
            if (worker is None or not worker.running
                    or f"elastic/ready/{worker.id}/{worker.attempt}" in keys):
                continue
            suspects[worker.index] = self._suspects.get(worker.index, now)
            if now - suspects[worker.index] >= HUNG_GRACE_S:
                hung.append((worker, rank, record))
        self._suspects = suspects
        for worker, rank, record in hung:
            worker.hung = True
            self._retired.add(worker.slot)
            self._console.message(
                f"worker {worker.id} (rank {rank} of round {self._round.number}) "
                f"{failures.describe_blame(record, record.rank)}; stopping it (SIGTERM, then "
                f"SIGKILL) and retiring its slot; the job goes on with the others")
        self._stop([worker for worker, _, _ in hung])

    def _stop_silent_workers(self, keys: set[str], running: list[Worker]) -> None:
        """Stops the workers that hold up the next round without a report that names them: a
        member of the last round still silent HOROVOD_PEER_TIMEOUT_SECONDS (+ HUNG_GRACE_S) after
        another member asked for the next round, and a new worker that has not asked for its
        first round --start-timeout (+ HUNG_GRACE_S) after it started and after another worker
        began to wait for a round (as peers that connect must all join within HOROVOD_START_TIMEOUT
        of each other)."""
        now = time.monotonic()

        def ready(worker):
            return f"elastic/ready/{worker.id}/{worker.attempt}" in keys
        members = set(id(w) for w in self._round.members) if self._round else set()
        if self._round is not None and self._round_over_since is None and any(
                w.running and ready(w) for w in self._round.members):
            self._round_over_since = now
        if not any(ready(w) for w in running):
            self._waiting_since = None
            return
        self._waiting_since = self._waiting_since or now
        start_limit = self._start_timeout_s + HUNG_GRACE_S
        silent = []
        for worker in running:
            if ready(worker) or worker.hung:
                continue
            if id(worker) in members:
                if (self._round_over_since is not None and now - self._round_over_since
                        >= self._peer_timeout_s + HUNG_GRACE_S):
                    rank = self._round.members.index(worker)
                    silent.append((worker, f"(rank {rank} of round {self._round.number}) did not "
                                           f"ask for the next round within "
                                           f"HOROVOD_PEER_TIMEOUT_SECONDS "
                                           f"({self._peer_timeout_s:g} s) of the others"))
            elif (worker.attempt == 0 and now - worker.started >= start_limit
                  and now - self._waiting_since >= start_limit):
                silent.append((worker, f"did not ask for its first round within --start-timeout "
                                       f"({self._start_timeout_s:g} s) while others waited"))
        for worker, why in silent:
            worker.hung = True
            self._retired.add(worker.slot)
            self._console.message(f"worker {worker.id} {why}; stopping it (SIGTERM, then "
                                  "SIGKILL) and retiring its slot; the job goes on with the "
                                  "others")
        self._stop([worker for worker, _ in silent])

    def _form_round(self, workers: list[Worker]) -> int | None:
        number = 0 if self._round is None else self._round.number + 1
        if self._reset_limit is not None and number > self._reset_limit:
            for worker in workers:
                self._server.put(f"elastic/assign/{worker.id}/{worker.attempt}",
                                 f"stop,reset-limit-{self._reset_limit}-reached")
            self._give_up(f"the job was reset {number} times, more than "
                          f"{self._reset_limit_name} {self._reset_limit}; stopping the job")
            return 1
        ordered = sorted(workers, key=lambda w: (self._host_order.index(w.slot[0]), w.slot[1]))
        hosts = [h for h in self._host_order if any(w.slot[0] == h for w in ordered)]
        local = {h: [w for w in ordered if w.slot[0] == h] for h in hosts}
        for rank, worker in enumerate(ordered):
            host = worker.slot[0]
            local_rank = local[host].index(worker)
            cross = [h for h in hosts if len(local[h]) > local_rank]
            value = ",".join(map(str, (number, rank, len(ordered), local_rank, len(local[host]),
                                       cross.index(host), len(cross), self._hosts_version)))
            self._server.put(f"elastic/assign/{worker.id}/{worker.attempt}", value)
            worker.attempt += 1
        self._round = Round(number, ordered)
        self._round_over_since = None
        self._waiting_since = None
        if self._verbose or number > 0:
            self._console.message(f"round {number}: {len(ordered)} workers "
                                  f"({', '.join(w.id for w in ordered)})", "stdout")
        return None

    def _final_verdict(self) -> int:
        members = self._round.members if self._round else self._workers
        failed = [w for w in members if w.exit_code not in (0, None)]
        if self._round is None or failed:
            worst = failed[0] if failed else (self._workers[0] if self._workers else None)
            if worst is None:
                self._give_up("the host discovery script offered no slots")
                return 1
            what, code = describe_exit(worst.exit_code)
            self._give_up(f"worker {worst.id} {what}; no round could go on without it")
            return code or 1
        return 0
