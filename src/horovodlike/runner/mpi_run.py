"""horovodlikerun --mpi: the job is started by Open MPI's mpirun, which places the ranks (over
its own ssh for other hosts), gives them their rank from its environment, and ends every rank
when one fails. This launcher builds the mpirun line, rewrites mpirun's `[1,<rank>]<stdout>:`
tags into its own `[<rank>]<stdout>:`, names the failed rank, and leaves no process behind."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from horovodlike.runner import orphan_guard
from horovodlike.runner.environment import remote_rank_environment
from horovodlike.runner.hosts import HostSlots, format_hosts
from horovodlike.runner.output import Console, lines_of, rank_output_dir
from horovodlike.runner.rank_process import describe_exit

KILL_GRACE_S = 5.0  # mpirun's own teardown (SIGTERM, then SIGKILL to the ranks) takes ~3 s
_HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_MAX_LINE_BYTES = 1 << 20

# Ours that describe one rank of our own launch: under mpirun the ranks take theirs from
# Open MPI, so an outer job's values must not reach them.
MPIRUN_SETS_PER_RANK = frozenset(
    f"HOROVOD_{name}" for name in ("RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE", "CROSS_RANK",
                                   "CROSS_SIZE", "HOSTNAME"))
# MPI's own variables, which mpirun sets for each rank itself.
_MPI_OWN = re.compile(r"^(OMPI_|PMIX_|OPAL_|PRTE_|ORTE_)")

# mpirun --tag-output: "[<jobid>,<rank>]<stdout>:" before each line of a rank.
_TAG = re.compile(rb"\[\d+,(\d+)\]<(stdout|stderr|stddiag)>:")
# mpirun's verdicts on a failed rank (Open MPI 4 and 5).
_KILLED = re.compile(r"process rank (\d+) with PID \d+ on node (\S+) exited on signal (\d+)")
_EXITED_NAME = re.compile(r"Process name:\s+\[\[\d+,\d+\],(\d+)\]")
_EXITED_CODE = re.compile(r"Exit code:\s+(\d+)")


class MpiError(RuntimeError):
    """mpirun is missing or is not Open MPI's."""


def find_open_mpi_mpirun(mpirun: str = "mpirun") -> str:
    """The path of Open MPI's mpirun; raises MpiError saying what to install otherwise."""
    path = shutil.which(mpirun)
    if path is None:
        raise MpiError(f"--mpi needs Open MPI's {mpirun}, which is not on PATH "
                       f"(install openmpi-bin, or leave out --mpi)")
    try:
        version = subprocess.run([path, "--version"], capture_output=True, text=True,
                                 timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired) as error:
        raise MpiError(f"cannot run {path} --version: {error}") from None
    if "Open MPI" not in version and "OpenRTE" not in version:
        first = version.strip().splitlines()[0] if version.strip() else "no version"
        raise MpiError(f"--mpi supports Open MPI's mpirun; {path} is '{first}'")
    return path


def forwarded_names(launcher_env: dict[str, str], job_env: dict[str, str]) -> list[str]:
    """Names of the variables mpirun passes on to every rank with -x (local ranks inherit
    mpirun's environment anyway; remote ones get only these): the job's HOROVOD_* and the
    launcher's own environment, less its login session's and MPI's own."""
    names = [name for name in remote_rank_environment(launcher_env, {})
             if not _MPI_OWN.match(name) and name not in MPIRUN_SETS_PER_RANK]
    names += [name for name in job_env if name not in names]
    return names


def mpirun_command(mpirun: str, hosts: list[HostSlots], num_proc: int, command: list[str],
                   env_names: list[str], *, as_root: bool, oversubscribe: bool,
                   network_interface: str | None = None, ssh_port: int | None = None,
                   ssh_identity_file: str | None = None,
                   mpi_args: list[str] = (),
                   binding_args: list[str] | None = None) -> list[str]:
    """The mpirun argv. Values travel in mpirun's environment and are named with `-x NAME`, so
    that the job's secret never shows on a command line."""
    argv = [mpirun]
    if as_root:
        argv.append("--allow-run-as-root")
    argv += ["--tag-output", "-np", str(num_proc), "-H", format_hosts(hosts)]
    # --binding-args replaces the default placement: no binding, ranks slot by slot.
    argv += list(binding_args) if binding_args is not None else \
        ["--bind-to", "none", "--map-by", "slot"]
    if oversubscribe:
        argv.append("--oversubscribe")
    if network_interface is not None:
        argv += ["-mca", "btl_tcp_if_include", network_interface,
                 "-mca", "oob_tcp_if_include", network_interface]
    rsh_args = []
    if ssh_port is not None:
        rsh_args += ["-p", str(ssh_port)]
    if ssh_identity_file is not None:
        rsh_args += ["-i", ssh_identity_file]
    if rsh_args:
        argv += ["-mca", "plm_rsh_args", " ".join(shlex.quote(a) for a in rsh_args)]
    for name in env_names:
        argv += ["-x", name]
    argv += list(mpi_args)
    return argv + resolve_program(command)


def resolve_program(command: list[str]) -> list[str]:
    """The command with its program looked up on this launcher's PATH, as a rank started
    without --mpi would run it: Debian's mpirun puts its own directory first on the ranks' PATH
    (so `python3` would be /usr/bin/python3, not a virtual environment's)."""
    if not command or "/" in command[0]:
        return list(command)
    found = shutil.which(command[0])
    return [found or command[0]] + list(command[1:])


@dataclass
class Verdict:
    """What mpirun said about the first rank that failed."""

    rank: int | None = None
    host: str | None = None
    signal: int | None = None
    exit_code: int | None = None
    _pending_rank: int | None = field(default=None, repr=False)

    def read(self, line: str) -> None:
        if self.rank is not None:
            return
        killed = _KILLED.search(line)
        if killed:
            self.rank, self.host, self.signal = (int(killed.group(1)), killed.group(2),
                                                 int(killed.group(3)))
            return
        name = _EXITED_NAME.search(line)
        if name:
            self._pending_rank = int(name.group(1))
            return
        code = _EXITED_CODE.search(line)
        if code and self._pending_rank is not None:
            self.rank, self.exit_code = self._pending_rank, int(code.group(1))


class TagRewriter(threading.Thread):
    """Reads one of mpirun's streams and writes each rank's lines to the console as
    `[<rank>]<stream>:line` (and raw to DIR/rank.<r>/<stream> with --output-filename); mpirun's
    own lines go through unchanged.

    mpirun tags each piece of output as it arrives, so a rank's partial line can be followed by
    another rank's tagged piece on the same line: `[1,0]<stderr>:abc[1,1]<stderr>:xyz\n`. The
    pieces are put back together per rank and stream, and a line is written once complete."""

    def __init__(self, stream: str, source: BinaryIO, console: Console, verdict: Verdict,
                 output_dir: str | None, size: int):
        super().__init__(daemon=True, name=f"mpirun-{stream}")
        self._stream = stream
        self._source = source
        self._console = console
        self._verdict = verdict
        self._output_dir = output_dir
        self._size = size
        self._partial: dict[tuple[int, str], bytes] = {}
        self._raw_files: dict[tuple[int, str], BinaryIO] = {}

    def run(self) -> None:
        try:
            for line in lines_of(self._source):
                self._split(line)
            for (rank, stream), rest in self._partial.items():
                if rest:
                    self._emit(rank, stream, rest + b"\n")
        except (OSError, ValueError):
            pass  # the pipe closed under us: the job is being torn down
        finally:
            for raw in self._raw_files.values():
                raw.close()
            self._source.close()

    def _split(self, line: bytes) -> None:
        tags = list(_TAG.finditer(line))
        untagged = line[:tags[0].start()] if tags else line
        if untagged:
            if not untagged.endswith(b"\n"):
                untagged += b"\n"
            self._verdict.read(untagged.decode(errors="replace"))
            self._console.write(self._stream, untagged)
        for index, tag in enumerate(tags):
            end = tags[index + 1].start() if index + 1 < len(tags) else len(line)
            owner = (int(tag.group(1)), "stdout" if tag.group(2) == b"stdout" else "stderr")
            text = self._partial.pop(owner, b"") + line[tag.end():end]
            if text.endswith(b"\n"):
                self._emit(owner[0], owner[1], text)
            elif len(text) >= _MAX_LINE_BYTES:
                self._emit(owner[0], owner[1], text + b"\n")
            else:
                self._partial[owner] = text

    def _emit(self, rank: int, stream: str, line: bytes) -> None:
        self._write_raw(rank, stream, line)
        self._console.write(stream, f"[{rank}]<{stream}>:".encode() + line, rank_line=True)

    def _write_raw(self, rank: int, stream: str, body: bytes) -> None:
        if self._output_dir is None:
            return
        raw = self._raw_files.get((rank, stream))
        if raw is None:
            directory = rank_output_dir(self._output_dir, rank, self._size)
            directory.mkdir(parents=True, exist_ok=True)
            raw = self._raw_files[(rank, stream)] = open(Path(directory, stream), "wb")
        raw.write(body)
        raw.flush()


def _session_members(sid: int) -> list[int]:
    """Processes of session `sid` (Linux /proc): mpirun's local ranks are each in a process
    group of their own, but all in mpirun's session."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        # After the command name: state, ppid, pgrp, session.
        if len(fields) > 3 and int(fields[3]) == sid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


class MpiJob:
    """Runs mpirun and supervises it until it ends."""

    def __init__(self, argv: list[str], env: dict[str, str], console: Console, size: int,
                 hostnames: dict[int, str], output_dir: str | None = None,
                 kill_grace_s: float = KILL_GRACE_S):
        self._argv = argv
        self._env = env
        self._console = console
        self._size = size
        self._hostnames = hostnames
        self._output_dir = output_dir
        self._kill_grace_s = kill_grace_s
        self._process: subprocess.Popen | None = None
        self._signals: list[int] = []

    def run(self) -> int:
        previous = {}
        if threading.current_thread() is threading.main_thread():
            previous = {signum: signal.signal(signum, self._on_signal)
                        for signum in _HANDLED_SIGNALS}
        try:
            return self._run()
        finally:
            self._clean_up_session()
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _on_signal(self, signum, frame) -> None:
        self._signals.append(signum)

    def _run(self) -> int:
        try:
            # A session of its own: a Ctrl-C at the terminal reaches only this launcher, and
            # every local rank can be found by its session afterwards.
            self._process = subprocess.Popen(self._argv, env=self._env, stdin=subprocess.DEVNULL,
                                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                             start_new_session=True)
        except OSError as error:
            self._console.message(f"cannot start {self._argv[0]}: {error}")
            return 127 if isinstance(error, FileNotFoundError) else 1
        orphan_guard.watch_group(self._process.pid)  # SIGTERM, which mpirun passes on
        verdict = Verdict()
        readers = [TagRewriter(stream, source, self._console, verdict, self._output_dir,
                               self._size)
                   for stream, source in (("stdout", self._process.stdout),
                                          ("stderr", self._process.stderr))]
        for reader in readers:
            reader.start()
        signalled = self._wait()
        for reader in readers:
            reader.join(timeout=2.0)
        code = self._process.returncode
        if signalled is not None:
            self._console.message(f"received {signal.Signals(signalled).name}; stopped the job")
            return 128 + signalled
        if code != 0 and verdict.rank is not None:
            host = verdict.host or self._hostnames.get(verdict.rank, "?")
            if verdict.signal is not None:
                what, code = describe_exit(-verdict.signal)
            else:
                what, code = describe_exit(verdict.exit_code)
            self._console.message(f"rank {verdict.rank} (on {host}) {what}; mpirun stopped "
                                  f"the job")
        elif code != 0:
            what, code = describe_exit(code)
            self._console.message(f"mpirun {what}")
        return code

    def _wait(self) -> int | None:
        """Waits for mpirun; on a signal to the launcher, stops it (SIGTERM, which mpirun passes
        on to the ranks, then SIGKILL after the grace or at a second signal)."""
        first_signal = None
        term_sent_at = None
        while True:
            try:
                self._process.wait(timeout=0.05)
                return first_signal
            except subprocess.TimeoutExpired:
                pass
            if self._signals and first_signal is None:
                first_signal = self._signals[0]
                term_sent_at = time.monotonic()
                self._signal_mpirun(signal.SIGTERM)
            if term_sent_at is not None and (len(self._signals) > 1 or
                                             time.monotonic() - term_sent_at > self._kill_grace_s):
                self._signal_mpirun(signal.SIGKILL)
                self._clean_up_session()

    def _signal_mpirun(self, signum: int) -> None:
        try:
            os.kill(self._process.pid, signum)
        except ProcessLookupError:
            pass

    def _clean_up_session(self) -> None:
        """SIGKILL to whatever is left in mpirun's session (ranks of a killed mpirun, or their
        children)."""
        if self._process is None:
            return
        try:
            leftovers = _session_members(self._process.pid)
        except OSError:
            return
        for pid in leftovers:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
