"""A job with a process set of ranks 0 and 1: they allreduce in it while rank 2, outside the set,
has nothing to do. Each of the set's rounds also negotiates the global set, so it needs rank 2
in a round: in a job with process sets an idle loop keeps its pace (core/runtime.h,
idle_rounds_). Prints the rounds rank 2's loop ran meanwhile and its cycle then, and the set's slowest
call."""

import time

import torch

import horovodlike.torch as hvd
from horovodlike import _core

pair = hvd.ProcessSet([0, 1])
hvd.init(process_sets=[pair])
before = _core.stats()["loop_rounds"]
if hvd.rank() in (0, 1):
    tensor = torch.ones(256)
    slowest = 0.0
    for _ in range(300):  # a count, not a deadline: both ranks must make the same calls
        start = time.perf_counter()
        result = hvd.allreduce(tensor, op=hvd.Sum, name="pair", process_set=pair)
        slowest = max(slowest, time.perf_counter() - start)
        assert result.tolist() == [2.0] * 256, result
    print(f"rank {hvd.rank()}: PAIR slowest_ms {slowest * 1e3:.1f}", flush=True)
else:
    time.sleep(1.0)
    stats = _core.stats()
    print(f"rank {hvd.rank()}: OUTSIDER rounds {stats['loop_rounds'] - before} cycle_ms "
          f"{stats['loop_cycle_us'] / 1e3:g}", flush=True)
hvd.barrier()
hvd.shutdown()
