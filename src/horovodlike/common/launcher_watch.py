"""A rank started by horovodlikerun ends, with the processes it started, when the launcher is gone.

The launcher stops its ranks itself, and a guard stops the local ones when the launcher is
killed (runner/orphan_guard.py). A rank on another host is out of the guard's reach, and ssh
without a terminal does not signal the remote command when its session drops. So from init()
on, a thread of each rank holds a connection to the launcher's rendezvous server open: when it
ends (the launcher's process died, or its host stopped answering TCP keepalive probes), the rank
sends SIGTERM to its process group (the rank and its children: data loader workers), and
SIGKILL after KILL_GRACE_S if any of them is still there.

Only in ranks the launcher started itself (HOROVODLIKE_EXIT_WITH_LAUNCHER=1, which
horovodlikerun sets for local and ssh ranks: runner/environment.py): elsewhere (Ray, Spark) the
rank's process group may hold the framework's own processes. init() starts the watch (this module
registers it with basics.py).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

from horovodlike.common import basics
from horovodlike.common.rendezvous_client import RendezvousClient, RendezvousError

KILL_GRACE_S = 3.0
# Set by the launcher in the ranks it starts (the name runner/environment.py gives it too).
EXIT_WITH_LAUNCHER = "HOROVODLIKE_EXIT_WITH_LAUNCHER"

_lock = threading.Lock()
_started = False


def start() -> None:
    """Starts the watch once per process, in a rank that horovodlikerun started."""
    global _started
    if os.environ.get(EXIT_WITH_LAUNCHER) != "1":
        return
    with _lock:
        if _started:
            return
        _started = True
    threading.Thread(target=_watch, daemon=True, name="horovodlike-launcher-watch").start()


def _watch() -> None:
    try:
        client = RendezvousClient.from_environment()
    except RendezvousError:
        return  # no launcher to watch: init() reports that itself
    why = client.wait_until_closed()
    _stop_own_process_group(why)


def _stop_own_process_group(why: str) -> None:
    rank = os.environ.get("HOROVOD_RANK", "?")
    try:
        sys.stderr.write(f"horovodlike: rank {rank}: the launcher is gone ({why}); stopping this "
                         f"rank and the processes it started\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass  # the launcher was reading it
    group = os.getpgrp()
    for signum in (signal.SIGTERM, signal.SIGCONT):
        os.killpg(group, signum)
    # Still here: this rank handles SIGTERM. Whatever it does, nothing of the group may stay.
    time.sleep(KILL_GRACE_S)
    os.killpg(group, signal.SIGKILL)


basics.register_before_start(start)
