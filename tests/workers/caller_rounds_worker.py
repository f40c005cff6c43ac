"""A waiting caller runs the negotiation rounds itself (HOROVOD_CALLER_ROUNDS, the default).

    caller_rounds_worker.py results   synchronous and asynchronous collectives mixed, against
                                      NumPy; prints the rounds each thread ran
    caller_rounds_worker.py interrupt rank 1 stops (SIGSTOP) before it joins a round that rank 0
                                      runs on its calling thread: a signal handler on rank 0 that
                                      raises still ends the wait, then rank 1 is continued and
                                      both ranks see the runtime stopped
    caller_rounds_worker.py deferred  HOROVOD_OVERLAP=0: an asynchronous collective waits for a
                                      caller (or the loop's long cycle), then completes right,
                                      with a late peer and with polling alone
"""

import json
import os
import signal
import sys
import time

import numpy as np
import torch

import horovodlike.torch as hvd
from horovodlike import _core
from common import check, raises

mode = sys.argv[1]
hvd.init()
rank, size = hvd.rank(), hvd.size()


def stopped_state(pid):
    """The process's state letter from /proc ("T": stopped by a signal)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


if mode == "results":
    t = torch.empty(1024)
    for i in range(200):
        t.fill_(float(rank + i))
        hvd.allreduce_(t, name="small", op=hvd.Sum)
        expected = np.full(1024, sum(r + i for r in range(size)), np.float32)
        np.testing.assert_array_equal(t.numpy(), expected)
        if i % 20 == 0:
            # Asynchronous ones in between: the loop runs them, or the caller that waits.
            tensors = [torch.full((n,), float(rank * n)) for n in (1, 100, 5000)]
            handles = [hvd.allreduce_async_(x, name=f"async.{n}", op=hvd.Sum)
                       for x, n in zip(tensors, (1, 100, 5000))]
            for h, x, n in zip(handles, tensors, (1, 100, 5000)):
                hvd.synchronize(h)
                np.testing.assert_array_equal(
                    x.numpy(), np.full(n, sum(r * n for r in range(size)), np.float32))
            out = hvd.allreduce(torch.arange(10.0) * (rank + 1), name="out", op=hvd.Average)
            np.testing.assert_allclose(
                out.numpy(), np.arange(10.0) * np.mean([r + 1 for r in range(size)]), rtol=1e-6)
    stats = _core.stats()
    rounds = {k: stats[k] for k in ("loop_rounds", "caller_rounds")}
    print(f"rank {rank}: ROUNDS {json.dumps(rounds)}", flush=True)
    hvd.shutdown()

elif mode == "interrupt":
    pids = hvd.allgather_object(os.getpid(), name="pids")

    class Alarm(Exception):
        pass

    if rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)  # rank 0 continues this process
        raises(hvd.HorovodInternalError, lambda: hvd.allreduce_(torch.ones(4), name="late"),
               "rank 0")
    else:
        # Until rank 1 (its background loop too) is stopped: a round it still answered would
        # end, and the alarm would find no round to interrupt. The ranks share this host.
        while stopped_state(pids[1]) != "T":
            time.sleep(0.01)

        def on_alarm(signum, frame):
            raise Alarm()

        signal.signal(signal.SIGALRM, on_alarm)
        signal.setitimer(signal.ITIMER_REAL, 2.0)  # a round's wait asks after 1 s
        try:
            hvd.allreduce_(torch.ones(4), name="late")
            check(False, "the allreduce with a stopped peer completed")
        except Alarm as e:
            notes = " ".join(getattr(e, "__notes__", []))
            check("negotiation round" in notes, f"no note on the interrupted round: {notes!r}")
        finally:
            os.kill(pids[1], signal.SIGCONT)  # whatever happened, rank 1 must not stay stopped
        raises(hvd.HorovodInternalError, lambda: hvd.allreduce_(torch.ones(4), name="after"),
               "stopped")
    print(f"rank {rank}: INTERRUPT OK", flush=True)
    hvd.shutdown()

elif mode == "deferred":
    # Run with HOROVOD_OVERLAP=0 and a cycle time of 2 s: the loop turns every 2 s at most,
    # unless a caller waits.
    hvd.allreduce_(torch.zeros(1), name="sync")  # a round has just ended on every rank
    time.sleep(0.1)  # and the round the loop may still run after a wait has ended too
    x = torch.full((1000,), float(rank + 1))
    handle = hvd.allreduce_async_(x, name="held", op=hvd.Sum)
    time.sleep(0.2)
    check(not hvd.poll(handle), "the asynchronous allreduce started before anyone waited for it")
    if rank == 1:
        time.sleep(0.3)  # rank 0 waits for a late peer
    hvd.synchronize(handle)
    np.testing.assert_array_equal(x.numpy(), np.full(1000, sum(r + 1 for r in range(size)),
                                                     np.float32))
    # Nobody waits: polling alone still completes it, within the loop's cycle.
    y = torch.arange(5.0) * (rank + 1)
    handle = hvd.allreduce_async_(y, name="polled", op=hvd.Average)
    start = time.time()
    while not hvd.poll(handle):
        check(time.time() - start < 30, "a polled asynchronous allreduce never completed")
        time.sleep(0.01)
    hvd.synchronize(handle)
    np.testing.assert_allclose(y.numpy(), np.arange(5.0) * np.mean([r + 1 for r in range(size)]),
                               rtol=1e-6)
    print(f"rank {rank}: DEFERRED OK", flush=True)
    hvd.shutdown()
