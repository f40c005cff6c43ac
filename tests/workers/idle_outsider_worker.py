"""A job with a process set of ranks 0 and 1 and rank 2 outside it. Each of the set's rounds
also negotiates the global set, so it needs rank 2 in a round: rank 2's loop slows down while
idle only together with the set's ranks, when no rank has work in any set (a round in which
some rank has work resets every rank's pace: core/runtime.h, idle_rounds_). Rank 2 reports its
loop's cycle after a second in which no rank had work (slowed), then while rank 0 has an
allreduce of the set pending that rank 1 has not submitted yet (back at its pace). Then the
pair runs allreduces with pauses between them, in which the loops slow down, and reports the
slowest (a figure, not an assertion)."""

import time

import numpy as np
import torch

import horovodlike.torch as hvd
from horovodlike import _core

pair = hvd.ProcessSet([0, 1])
hvd.init(process_sets=[pair])
rank = hvd.rank()


def cycle_once(expected_us, deadline_s=20.0):
    """Rank 2's loop cycle, once it is `expected_us` (or at the deadline, whatever it is)."""
    end = time.monotonic() + deadline_s
    while _core.stats()["loop_cycle_us"] != expected_us and time.monotonic() < end:
        time.sleep(0.01)
    return _core.stats()["loop_cycle_us"]


# Point-to-point messages order the phases: they need no round.
if rank == 2:
    time.sleep(1.0)
    print(f"rank 2: OUTSIDER idle_cycle_ms {cycle_once(50000) / 1e3:g}", flush=True)
    hvd.send(torch.zeros(1), dst=0)
    hvd.irecv(torch.zeros(1), src=0).wait()  # rank 0's allreduce is pending now
    print(f"rank 2: OUTSIDER busy_cycle_ms {cycle_once(1000) / 1e3:g}", flush=True)
    hvd.send(torch.zeros(1), dst=1)
else:
    tensor = torch.full((256,), float(rank + 1))
    if rank == 0:
        hvd.irecv(torch.zeros(1), src=2).wait()
        handle = hvd.allreduce_async(tensor, op=hvd.Sum, name="pending", process_set=pair)
        hvd.send(torch.zeros(1), dst=2)
    else:
        hvd.irecv(torch.zeros(1), src=2).wait()
        handle = hvd.allreduce_async(tensor, op=hvd.Sum, name="pending", process_set=pair)
    np.testing.assert_array_equal(hvd.synchronize(handle).numpy(), np.full(256, 3.0, np.float32))
    slowest = 0.0
    for i in range(20):  # a count, not a deadline: both ranks must make the same calls
        time.sleep(0.02)
        start = time.perf_counter()
        result = hvd.allreduce(torch.full((256,), float(i)), op=hvd.Sum, name="pair",
                               process_set=pair)
        slowest = max(slowest, time.perf_counter() - start)
        np.testing.assert_array_equal(result.numpy(), np.full(256, 2.0 * i, np.float32))
    print(f"rank {rank}: PAIR slowest_ms {slowest * 1e3:.1f}", flush=True)
hvd.barrier()
hvd.shutdown()
