"""Stops the ranks of a launcher that dies without stopping them itself (kill -9, the OOM killer).

The launcher stops its ranks when it fails, is interrupted or is told to stop; a process killed
outright does nothing. So the first rank it starts also starts a guard: a small process in a
session of its own, to which the launcher names each rank's process group, through a pipe:

    "watch <pgid>\\n" ... "done\\n"

A launcher that exits normally says "done" (atexit) and the guard leaves. When the pipe closes
without it, the launcher is gone: the guard sends SIGTERM (and SIGCONT, for a stopped rank) to
every group still there, and SIGKILL after KILL_GRACE_S, so that the ranks' own children (data
loader workers) go with them. Groups that have ended are forgotten within _PRUNE_EVERY_S, so that
a number the system gives to a new group later is never signalled.

Ranks on other hosts are out of its reach: they watch the launcher themselves
(horovodlike/common/launcher_watch.py). The guard runs as a script, with the standard library
only, so that it starts in milliseconds.
"""

from __future__ import annotations

import atexit
import os
import select
import signal
import subprocess
import sys
import threading
import time

KILL_GRACE_S = 3.0
_PRUNE_EVERY_S = 1.0
_DONE = b"done"

_lock = threading.Lock()
_guard: subprocess.Popen | None = None
_start_failed = False


def watch_group(pgid: int) -> None:
    """Has process group `pgid` stopped if this process dies before it exits normally (the
    guard starts at the first call)."""
    global _guard, _start_failed
    with _lock:
        if _guard is None and not _start_failed:
            try:
                # stdout to /dev/null: whoever reads the launcher's output gets its end when
                # the launcher exits; stderr kept, for the guard's one line on what it did.
                _guard = subprocess.Popen(
                    [sys.executable, "-I", os.path.abspath(__file__), str(os.getpid())],
                    stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, cwd="/",
                    start_new_session=True)
            except OSError as error:
                _start_failed = True
                sys.stderr.write(f"horovodlikerun: cannot start the process that stops the "
                                 f"ranks if the launcher is killed ({error}); the job runs "
                                 f"without it\n")
                return
            atexit.register(_release)
        if _guard is None:
            return
        try:
            _guard.stdin.write(f"watch {pgid}\n".encode())
            _guard.stdin.flush()
        except OSError:
            pass  # the guard is gone: the launcher still stops its ranks itself


def _release() -> None:
    """This process is exiting normally (its jobs have stopped their ranks): the guard leaves."""
    global _guard
    with _lock:
        guard, _guard = _guard, None
    if guard is None:
        return
    try:
        guard.stdin.write(_DONE + b"\n")
        guard.stdin.close()
    except OSError:
        pass
    try:
        guard.wait(timeout=2.0)
    except subprocess.TimeoutExpired:
        guard.kill()


# ---------------------------------------------------------------------- the guard process

def _group_exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False  # gone, or the number now belongs to someone else's group
    return True


def _read_until_launcher_gone() -> set[int] | None:
    """The groups still there when the launcher's pipe closes, or None when it said "done"."""
    groups: set[int] = set()
    pending = b""
    next_prune = time.monotonic() + _PRUNE_EVERY_S
    while True:
        readable, _, _ = select.select([0], [], [], _PRUNE_EVERY_S)
        if readable:
            chunk = os.read(0, 4096)
            if not chunk:
                return {g for g in groups if _group_exists(g)}
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                if line == _DONE:
                    return None
                verb, _, number = line.partition(b" ")
                if verb == b"watch" and number.isdigit():
                    groups.add(int(number))
        if time.monotonic() >= next_prune:
            groups = {g for g in groups if _group_exists(g)}
            next_prune = time.monotonic() + _PRUNE_EVERY_S


def _stop_groups(groups: set[int]) -> None:
    for signum in (signal.SIGTERM, signal.SIGCONT):
        for pgid in groups:
            try:
                os.killpg(pgid, signum)
            except OSError:
                pass
    deadline = time.monotonic() + KILL_GRACE_S
    while time.monotonic() < deadline and any(_group_exists(g) for g in groups):
        time.sleep(0.05)
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except OSError:
            pass


def _main(launcher_pid: str) -> int:
    groups = _read_until_launcher_gone()
    if groups:
        try:
            sys.stderr.write(f"horovodlikerun: the launcher (pid {launcher_pid}) ended without "
                             f"stopping its ranks; stopping them (SIGTERM, then SIGKILL)\n")
            sys.stderr.flush()
        except OSError:
            pass  # nobody reads the launcher's stderr any more
        _stop_groups(groups)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1] if len(sys.argv) > 1 else "?"))
