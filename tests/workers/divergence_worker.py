"""Ranks that diverge, and blocking waits that signals interrupt.

usage: divergence_worker.py MODE REPORT_DIR; each rank writes REPORT_DIR/rank<r>.json.
- skip: rank 1 skips the collective 'skipped' and goes on to 'after'.
- order: rank 0 allreduces 'a' then 'b', rank 1 'b' then 'a', each waiting for the first.
- interrupt: both ranks block on collectives the other never submits; rank 0 is interrupted by
  SIGINT in synchronize(), rank 1 by SIGALRM in barrier().
- join: SIGALRM interrupts rank 0's join() while rank 1 is busy elsewhere.
- init: rank 1 never calls init(); SIGALRM interrupts rank 0's init().
"""

import json
import os
import signal
import sys
import threading
import time

MODE, REPORT_DIR = sys.argv[1], sys.argv[2]
RANK = int(os.environ["HOROVOD_RANK"])


def write_report(result):
    with open(os.path.join(REPORT_DIR, f"rank{RANK}.json"), "w") as f:
        json.dump(result, f)


def outcome(call):
    """What `call` raised (type, message, notes, seconds it took)."""
    started = time.monotonic()
    try:
        call()
        return {"type": None, "seconds": time.monotonic() - started}
    except BaseException as e:  # noqa: BLE001 - KeyboardInterrupt is one of the outcomes
        return {"type": type(e).__name__, "message": str(e),
                "notes": getattr(e, "__notes__", []), "seconds": time.monotonic() - started}


def wait_for_report(rank):
    """Until `rank` has reported: this rank's exit would end that rank's wait. (A rank that
    fails before it reports ends the job through the launcher.)"""
    while not os.path.exists(os.path.join(REPORT_DIR, f"rank{rank}.json")):
        time.sleep(0.1)


def wait_for_rank0():
    wait_for_report(0)


def signal_once_waiting(signum, core_function, seconds=1.0):
    """Sends `signum` to this process `seconds` after this thread calls `core_function`, the
    core's blocking wait: a timer started before the call could go off before the wait began
    on a busy machine, and interrupt something else."""
    def on_call(frame, event, arg):
        if event == "c_call" and arg is core_function:
            sys.setprofile(None)
            threading.Timer(seconds, os.kill, (os.getpid(), signum)).start()
    sys.setprofile(on_call)


class AlarmTimeout(Exception):
    pass


def raise_alarm(signum, frame):
    raise AlarmTimeout("SIGALRM")


signal.signal(signal.SIGALRM, raise_alarm)

if MODE == "init":
    import horovodlike.torch as hvd
    from horovodlike import _core
    if RANK == 1:
        wait_for_rank0()  # never calls init()
        sys.exit(0)
    signal_once_waiting(signal.SIGALRM, _core.init)
    write_report({"init": outcome(hvd.init)})
    sys.exit(0)

import numpy as np  # noqa: E402
import torch  # noqa: E402

import horovodlike.torch as hvd  # noqa: E402
from horovodlike import _core  # noqa: E402
from horovodlike.common import numpy_ops as ops  # noqa: E402

hvd.init()
result = {}
hvd.allreduce(torch.ones(2), name="warmup")

if MODE == "skip":
    def steps():
        if RANK == 0:
            ops.allreduce(np.ones(3, np.float32), "skipped", op=ops.Sum)
        ops.allreduce(np.ones(3, np.float32), "after", op=ops.Sum)
    result["steps"] = outcome(steps)
    result["later"] = outcome(lambda: ops.allreduce(np.ones(3, np.float32), "later"))
elif MODE == "order":
    def steps():
        for name in ("a", "b") if RANK == 0 else ("b", "a"):
            hvd.allreduce(torch.ones(3), name=name)
    result["steps"] = outcome(steps)
elif MODE == "interrupt":
    if RANK == 0:
        handle = hvd.allreduce_async(torch.ones(3), name="only_on_0")
        signal_once_waiting(signal.SIGINT, _core.wait)
        result["synchronize"] = outcome(lambda: hvd.synchronize(handle))
    else:
        signal_once_waiting(signal.SIGALRM, _core.wait)
        result["barrier"] = outcome(hvd.barrier)
        wait_for_rank0()
elif MODE == "join":
    if RANK == 0:
        signal_once_waiting(signal.SIGALRM, _core.wait)
        result["join"] = outcome(hvd.join)
    else:
        wait_for_rank0()  # busy elsewhere
write_report(result)
if MODE == "interrupt" and RANK == 0:
    wait_for_report(1)  # rank 1 waits for its own signal, not for this rank's exit
