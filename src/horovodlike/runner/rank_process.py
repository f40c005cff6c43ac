"""One running rank: its process (local, or the ssh client of a remote one), its output
forwarders, and the signals that stop it."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from pathlib import Path
from queue import SimpleQueue

from horovodlike.runner import orphan_guard
from horovodlike.runner.hosts import RankAssignment
from horovodlike.runner.output import Console, StreamForwarder, rank_output_dir


class RankExited:
    """Event: the process of `rank` ended with Popen's returncode (negative: killed by signal)."""

    def __init__(self, rank: int, returncode: int):
        self.rank = rank
        self.returncode = returncode


class AssignedRank:
    """What the launcher and the elastic driver know of any rank they run (a process here, a Ray
    actor, a Spark task): its slot, its environment, how it is reached and its forwarders."""

    def __init__(self, assignment: RankAssignment, env: dict[str, str], via_ssh: bool):
        self.assignment = assignment
        self.env = env
        self.via_ssh = via_ssh
        self.forwarders: list[StreamForwarder] = []

    @property
    def rank(self) -> int:
        return self.assignment.rank

    @property
    def hostname(self) -> str:
        return self.assignment.hostname


class ReportedRank(AssignedRank):
    """A rank that something else runs (a Ray actor, a Spark agent's process) and whose exit it
    reports: exited() posts RankExited; poll() and wait() answer as a process's do. Its output
    reaches the launcher without forwarders."""

    def __init__(self, assignment: RankAssignment, env: dict[str, str]):
        super().__init__(assignment, env, via_ssh=False)
        self.pid = None
        self._code: int | None = None
        self._done = threading.Event()

    def exited(self, code: int, events) -> None:
        self._code = code
        self._done.set()
        events.put(RankExited(self.rank, code))

    def poll(self) -> int | None:
        return self._code

    def wait(self, timeout: float) -> int | None:
        self._done.wait(timeout)
        return self._code


class RankProcess(AssignedRank):
    def __init__(self, assignment: RankAssignment, argv: list[str], env: dict[str, str],
                 via_ssh: bool):
        super().__init__(assignment, env, via_ssh)
        self.argv = argv
        self._process: subprocess.Popen | None = None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def start(self, console: Console, events: SimpleQueue, output_dir: str | None) -> None:
        """Starts the process in its own process group (so that stopping it reaches its
        children, and a Ctrl-C at the terminal reaches only the launcher, which then stops it;
        the orphan guard stops the group if the launcher is killed), its two forwarders, and a
        thread that posts RankExited to `events`."""
        raw_files = {"stdout": None, "stderr": None}
        try:
            if output_dir is not None:
                raw_dir = rank_output_dir(output_dir, self.rank, self.assignment.size)
                raw_dir.mkdir(parents=True, exist_ok=True)
                for stream in raw_files:
                    raw_files[stream] = open(Path(raw_dir, stream), "wb")
            stderr_read, stderr_write = os.pipe()
            env = self.env
            if not self.via_ssh:
                # The core's log lines (stall warnings, why the job stopped) go to a second
                # descriptor of the same pipe, which output capture inside the rank (pytest
                # redirects fd 2) leaves alone; an ssh rank has only its stderr.
                # The pipe's inode goes with the number, so that a process that inherits the
                # variable but not the descriptor never writes to whatever reuses the number.
                env = dict(self.env, HOROVODLIKE_STDERR_FD=(
                    f"{stderr_write}:{os.fstat(stderr_write).st_ino}"))
            try:
                self._process = subprocess.Popen(
                    self.argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                    stderr=stderr_write, pass_fds=() if self.via_ssh else (stderr_write,),
                    start_new_session=True)
            except OSError:
                os.close(stderr_read)
                raise
            finally:
                os.close(stderr_write)
            orphan_guard.watch_group(self._process.pid)
        except OSError:
            for raw_file in raw_files.values():
                if raw_file is not None:
                    raw_file.close()
            raise
        for stream, source in (("stdout", self._process.stdout),
                               ("stderr", os.fdopen(stderr_read, "rb"))):
            forwarder = StreamForwarder(self.rank, stream, source, console, raw_files[stream])
            forwarder.start()
            self.forwarders.append(forwarder)
        threading.Thread(target=self._post_exit, args=(events,), daemon=True,
                         name=f"rank{self.rank}-wait").start()

    def _post_exit(self, events: SimpleQueue) -> None:
        events.put(RankExited(self.rank, self._process.wait()))

    def poll(self) -> int | None:
        return self._process.poll() if self._process else None

    def wait(self, timeout: float) -> int | None:
        if self._process is None:
            return None
        try:
            return self._process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def signal_group(self, signum: int) -> None:
        """Sends `signum` to the rank's process group, which outlives the rank itself while any
        child it started is still there."""
        if self._process is None:
            return
        try:
            os.killpg(self._process.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    def join_output(self, timeout: float) -> None:
        for forwarder in self.forwarders:
            forwarder.join(timeout)


def describe_exit(returncode: int) -> tuple[str, int]:
    """("exited with code 3", 3) or ("was killed by signal 9 (SIGKILL)", 137)."""
    if returncode < 0:
        signum = -returncode
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = "unknown signal"
        return f"was killed by signal {signum} ({name})", 128 + signum
    return f"exited with code {returncode}", returncode
