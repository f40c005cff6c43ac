"""Supervision of a started job: the start-up deadline, the first rank to fail, the launcher's
own signals, and stopping every rank (SIGTERM to its process group, SIGKILL after a grace)."""

from __future__ import annotations

import os
import signal
import threading
import time
from queue import Empty, SimpleQueue

from horovodlike.runner import failures
from horovodlike.runner.output import Console, join_forwarders
from horovodlike.runner.rank_process import RankExited, RankProcess, describe_exit
from horovodlike.runner.rendezvous import RendezvousServer

KILL_GRACE_S = 3.0
_HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_POLL_S = 0.05


def join_key(rank: int, generation: int = 0) -> str:
    """The rendezvous key a rank PUTs when it joins."""
    return f"addr/{generation}/{rank}"


def describe_ranks(ranks: list[int], hostnames: dict[int, str]) -> str:
    """"rank 2 (on a)", "ranks 2, 3 (on a)", "ranks 1 (on a), 2, 3 (on b)"."""
    groups: list[tuple[str, list[int]]] = []
    for rank in ranks:
        if groups and groups[-1][0] == hostnames[rank]:
            groups[-1][1].append(rank)
        else:
            groups.append((hostnames[rank], [rank]))
    text = ", ".join(f"{', '.join(map(str, members))} (on {host})" for host, members in groups)
    return ("rank " if len(ranks) == 1 else "ranks ") + text


class Job:
    def __init__(self, processes: list[RankProcess], server: RendezvousServer, console: Console,
                 start_timeout_s: float, output_dir: str | None = None, verbose: bool = False,
                 kill_grace_s: float = KILL_GRACE_S):
        self._processes = processes
        self._server = server
        self._console = console
        self._start_timeout_s = start_timeout_s
        self._output_dir = output_dir
        self._verbose = verbose
        self._kill_grace_s = kill_grace_s
        self._events: SimpleQueue = SimpleQueue()  # RankExited, or a signal number
        self._signals_received = 0
        self._started: list[RankProcess] = []
        self._stopped = False

    def run(self) -> int:
        """Starts every rank, supervises them, and returns the launcher's exit code."""
        previous = {}
        if threading.current_thread() is threading.main_thread():  # else Python refuses
            previous = {signum: signal.signal(signum, self._on_signal)
                        for signum in _HANDLED_SIGNALS}
        try:
            code = self._start_all()
            if code is None:
                code = self._supervise()
            return code
        except BaseException:
            self._stop_all()
            raise
        finally:
            join_forwarders([f for p in self._started for f in p.forwarders], idle_timeout=1.0)
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _next_event(self):
        """The next RankExited or signal number, or None after _POLL_S without one."""
        try:
            return self._events.get(timeout=_POLL_S)
        except Empty:
            return None

    def _on_signal(self, signum, frame) -> None:
        self._signals_received += 1
        self._events.put(signum)  # SimpleQueue.put is safe to call from a signal handler

    def _start_all(self) -> int | None:
        for process in self._processes:
            if self._signals_received:
                return None  # _supervise answers the signal
            try:
                process.start(self._console, self._events, self._output_dir)
            except OSError as error:
                self._console.message(f"cannot start rank {process.rank} "
                                      f"(on {process.hostname}): {error}; stopping the job")
                self._stop_all()
                if isinstance(error, FileNotFoundError):
                    return 127
                return 126 if isinstance(error, PermissionError) else 1
            self._started.append(process)
        return None

    def _supervise(self) -> int:
        deadline = time.monotonic() + self._start_timeout_s
        hostnames = {p.rank: p.hostname for p in self._processes}
        waiting_to_join = set(hostnames)
        running = {p.rank for p in self._started}
        while running:
            event = self._next_event()
            if isinstance(event, RankExited):
                running.discard(event.rank)
                if event.returncode == 0:
                    waiting_to_join.discard(event.rank)  # done without needing the others
                else:
                    return self._fail_first_in_cause(event, running)
            elif event is not None:
                self._console.message(f"received {signal.Signals(event).name}; "
                                      f"stopping the job")
                self._stop_all()
                return 128 + event

            if waiting_to_join:
                joined = self._server.keys()
                waiting_to_join -= {r for r in waiting_to_join if join_key(r) in joined}
                if not waiting_to_join and self._verbose:
                    self._console.message(f"all {len(hostnames)} ranks joined", "stdout")
                elif waiting_to_join and time.monotonic() >= deadline:
                    missing = describe_ranks(sorted(waiting_to_join), hostnames)
                    self._console.message(
                        f"{missing} did not join within {self._start_timeout_s:g} s "
                        f"(see --start-timeout); stopping the job")
                    self._server.abort(f"{missing} did not join within "
                                       f"{self._start_timeout_s:g} s")
                    self._stop_all()
                    return 1
        return 0

    def _fail_first_in_cause(self, first: RankExited, running: set[int]) -> int:
        """Names the rank that failed first in cause (see failures.py): waits up to
        failures.GRACE_S for one that failed by itself, else follows the ranks' reports."""
        exits = {first.rank: first.returncode}
        deadline = time.monotonic() + failures.GRACE_S
        while True:
            records = failures.read_records(self._server)
            primary = failures.primary_failure(exits, records)
            if primary is not None:
                return self._fail(self._processes[primary], exits[primary], records.get(primary),
                                  running)
            if not running or time.monotonic() >= deadline:
                break
            event = self._next_event()
            if event is None:
                continue
            if isinstance(event, RankExited):
                running.discard(event.rank)
                exits[event.rank] = event.returncode
            else:
                self._console.message(f"received {signal.Signals(event).name}; "
                                      f"stopping the job")
                self._stop_all()
                return 128 + event
        records = failures.read_records(self._server)
        culprit, blame = failures.trace_cause(first.rank, exits, records, running)
        if culprit == first.rank:
            return self._fail(self._processes[first.rank], first.returncode,
                              records.get(first.rank), running)
        first_process = self._processes[first.rank]
        first_process.join_output(timeout=0.5)
        what, code = describe_exit(first.returncode)
        process = self._processes[culprit]
        message = (f"rank {culprit} (on {process.hostname}) "
                   f"{failures.describe_blame(blame, first.rank)} (rank {first.rank} then "
                   f"{what}); stopping the job")
        self._console.message(message)
        self._server.abort(message)
        self._let_failing_ranks_finish(running)
        self._stop_all()
        return code

    def _let_failing_ranks_finish(self, running: set[int]) -> None:
        """Before the others are stopped: up to failures.EXIT_GRACE_S for the running ranks that
        reported a failure of their own (their runtime has stopped: they are on their way out)
        to exit by themselves, so that their last output (a traceback, a test runner's summary)
        reaches the console instead of being cut by SIGTERM. A rank that reported nothing may
        be busy or hung and is not waited for; a signal to the launcher ends the wait."""
        start = time.monotonic()
        while running and time.monotonic() < start + failures.EXIT_GRACE_S:
            # A rank's report may come a moment after the first rank's exit.
            if time.monotonic() >= start + failures.REPORT_WAIT_S and \
                    not running & failures.read_records(self._server).keys():
                return
            event = self._next_event()
            if isinstance(event, RankExited):
                running.discard(event.rank)
            elif event is not None:
                return  # a signal to the launcher: stop them now

    def _fail(self, process: RankProcess, returncode: int,
              record: failures.FailureRecord | None, running: set[int]) -> int:
        process.join_output(timeout=0.5)  # its last lines first, then the verdict
        what, code = describe_exit(returncode)
        hint = ""
        if process.via_ssh and returncode == 255:
            hint = (f" (255 is also ssh's code for not reaching {process.hostname}: check the "
                    f"host name, --ssh-port, and that `ssh {process.hostname}` works without a "
                    f"password)")
        elif returncode in (126, 127):
            hint = (f" ({returncode}: the command was not found or not executable"
                    f"{' on ' + process.hostname if process.via_ssh else ''})")
        message = f"rank {process.rank} (on {process.hostname}) {what}"
        self._console.message(f"{message}; stopping the job{hint}")
        if record is not None:
            self._console.message(f"rank {process.rank} reported: {record.reason}")
        self._server.abort(message)
        self._let_failing_ranks_finish(running)
        self._stop_all()
        return code

    def _stop_all(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        stop_processes(self._started, self._kill_grace_s, lambda: self._signals_received)


def stop_processes(processes: list[RankProcess], kill_grace_s: float, signal_count) -> None:
    """SIGTERM to every process group; SIGKILL to what is left after the grace (or at once when
    `signal_count()` grows: a second signal to the launcher)."""
    for process in processes:
        process.signal_group(signal.SIGTERM)
        process.signal_group(signal.SIGCONT)  # a stopped (SIGSTOP) rank acts on it only then
    signals_before = signal_count()
    deadline = time.monotonic() + kill_grace_s
    while (time.monotonic() < deadline and signal_count() == signals_before
           and any(_group_exists(p.pid) for p in processes)):
        time.sleep(0.02)
    for process in processes:
        process.signal_group(signal.SIGKILL)
    for process in processes:
        process.wait(timeout=2.0)


def _group_exists(pgid: int | None) -> bool:
    if pgid is None:
        return False
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
