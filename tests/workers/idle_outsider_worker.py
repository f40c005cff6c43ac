"""A job with a process set of ranks 0 and 1 and rank 2 outside it. Each of the set's rounds
also negotiates the global set, so it needs rank 2 in a round; inside a host, where a round bell
reaches every rank, rank 2's loop still slows down while idle (core/runtime.h, idle_rounds_),
and the set's rounds ring it. Rank 2 reports its loop's cycle after a second in which no rank
had work (slowed). Then the pair runs allreduces with pauses between them, in which the loops
slow down, while rank 2 waits for a point-to-point message: each rank of the pair reports the
bells it rang and its slowest call (a figure, not an assertion)."""

import time

import numpy as np
import torch

import horovodlike.torch as hvd
from horovodlike import _core

pair = hvd.ProcessSet([0, 1])
hvd.init(process_sets=[pair])
rank = hvd.rank()


def cycle_once(expected_us, deadline_s=20.0):
    """This rank's loop cycle, once it is `expected_us` (or at the deadline, whatever it is)."""
    end = time.monotonic() + deadline_s
    while _core.stats()["loop_cycle_us"] != expected_us and time.monotonic() < end:
        time.sleep(0.01)
    return _core.stats()["loop_cycle_us"]


# Point-to-point messages order the phases: they need no round.
if rank == 2:
    time.sleep(1.0)
    print(f"rank 2: OUTSIDER idle_cycle_ms {cycle_once(50000) / 1e3:g}", flush=True)
    for peer in (0, 1):
        hvd.send(torch.zeros(1), dst=peer)
    hvd.irecv(torch.zeros(1), src=0).wait()
else:
    hvd.irecv(torch.zeros(1), src=2).wait()
    bells = _core.stats()["shm_round_bells"]
    slowest = 0.0
    for i in range(20):  # a count, not a deadline: both ranks must make the same calls
        time.sleep(0.02)
        start = time.perf_counter()
        result = hvd.allreduce(torch.full((256,), float(i + rank)), op=hvd.Sum, name="pair",
                               process_set=pair)
        slowest = max(slowest, time.perf_counter() - start)
        np.testing.assert_array_equal(result.numpy(), np.full(256, 2.0 * i + 1, np.float32))
    bells = _core.stats()["shm_round_bells"] - bells
    print(f"rank {rank}: PAIR bells {bells} slowest_ms {slowest * 1e3:.1f}", flush=True)
    if rank == 0:
        hvd.send(torch.zeros(1), dst=2)
hvd.barrier()
hvd.shutdown()
