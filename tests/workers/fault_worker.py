"""A rank that fails, or watches another rank fail, in the way argv[1] says; the others write
what they saw to argv[2]/rank<r>.json and then exit 1 (as an uncaught error would), so that the
launcher must tell the rank that failed first in cause from the ranks that failed because of it.

Modes (the victim is the last rank unless said otherwise):
  kill-rendezvous   the victim is SIGKILLed before it joins; the others are inside init()
  kill-negotiation  SIGKILL while every rank negotiates new tensors (small, uncached)
  kill-transfer     SIGKILL while the ranks move a large allreduce through the ring
  sigstop           idle and busy phases longer than the peer timeout pass; then the victim
                    stops (SIGSTOP) and the others must give up after HOROVOD_PEER_TIMEOUT_SECONDS
  exit3             rank 1 calls sys.exit(3) after init() while rank 0 keeps working
Numpy only (no torch import), so that a job starts in well under a second.
"""

import json
import os
import signal
import sys
import threading
import time

import numpy as np

from horovodlike.common import basics
from horovodlike.common import numpy_ops as ops
from horovodlike.common.exceptions import HorovodInternalError

mode, report_dir = sys.argv[1], sys.argv[2]
rank = int(os.environ["HOROVOD_RANK"])
size = int(os.environ["HOROVOD_SIZE"])
victim = 1 if mode == "exit3" else size - 1
# The launcher stops the others once it has named the victim; they report first.
signal.signal(signal.SIGTERM, signal.SIG_IGN)


def report(**fields):
    fields.update(rank=rank, pid=os.getpid())
    path = os.path.join(report_dir, f"rank{rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(fields, f)
    os.replace(path + ".tmp", path)


def kill_self_after(seconds, signum=signal.SIGKILL):
    def fire():
        time.sleep(seconds)
        with open(os.path.join(report_dir, "victim.json"), "w") as f:
            json.dump({"time": time.time(), "pid": os.getpid()}, f)
        os.kill(os.getpid(), signum)
    threading.Thread(target=fire, daemon=True).start()


def check_sum(name, count):
    out = ops.allreduce(np.full(count, rank + 1, np.float32), name, op=ops.Sum)
    assert out[0] == out[-1] == size * (size + 1) / 2, (name, out[:4])


def fail_with(error, started):
    report(outcome=type(error).__name__, message=str(error), at=time.time(),
           waited=time.time() - started)
    # Later calls fail at once too.
    try:
        check_sum("after", 1)
        later = "no error"
    except HorovodInternalError:
        later = "HorovodInternalError"
    report(outcome=type(error).__name__, message=str(error), at=time.time(),
           waited=time.time() - started, later=later)
    sys.exit(1)


if mode == "kill-rendezvous":
    if rank == victim:
        # Only once the others are calling init(): on a busy machine they may start late, and
        # the launcher stops them a few seconds after the victim died, report or not.
        while not all(os.path.exists(os.path.join(report_dir, f"init-{r}"))
                      for r in range(size) if r != victim):
            time.sleep(0.01)
        kill_self_after(0.5)
        time.sleep(60)
    open(os.path.join(report_dir, f"init-{rank}"), "w").close()
    started = time.time()
    try:
        basics.init()
        report(outcome="init returned")
    except HorovodInternalError as e:
        report(outcome=type(e).__name__, message=str(e), at=time.time(),
               waited=time.time() - started)
    sys.exit(1)

basics.init()
check_sum("warmup", 1024)

if mode in ("kill-negotiation", "kill-transfer"):
    big = mode == "kill-transfer"
    if rank == victim:
        kill_self_after(0.4)
    started = time.time()
    try:
        for step in range(1_000_000):
            if big:
                check_sum("big", 8 * 1024 * 1024)  # 32 MB: the ring takes a while
            else:
                check_sum(f"small.{step}", 4)  # a new name each time: always negotiated
    except HorovodInternalError as e:
        fail_with(e, started)
    report(outcome="no error")

elif mode == "sigstop":
    timeout = float(os.environ["HOROVOD_PEER_TIMEOUT_SECONDS"])
    time.sleep(timeout * 1.5)  # idle: the background loops keep answering each other
    check_sum("after-idle", 16)
    spin_until = time.time() + timeout * 1.5  # busy in Python, holding the GIL
    while time.time() < spin_until:
        sum(range(1000))
    check_sum("after-busy", 16)
    if rank == victim:
        kill_self_after(0.2, signal.SIGSTOP)
    started = time.time()
    try:
        for step in range(1_000_000):
            check_sum("steady", 16)
    except HorovodInternalError as e:
        fail_with(e, started)

elif mode == "exit3":
    if rank == victim:
        time.sleep(0.3)
        sys.exit(3)
    started = time.time()
    try:
        for step in range(1_000_000):
            check_sum("steady", 16)
    except HorovodInternalError as e:
        fail_with(e, started)
