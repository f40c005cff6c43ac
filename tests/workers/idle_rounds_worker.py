"""An idle job: every rank sleeps while its loop runs its idle rounds. No rank has work in any
set, so no round rings a peer's round bell (core/round_bells.h); a bell would only wake the
peer's loop for another round with nothing in it. Prints the rounds each rank's loop ran
meanwhile, the bells it rang, its loop's cycle then, and how long an allreduce then took (all ranks call it at once,
after a barrier's worth of idleness: the loop's slowed cycle must not delay it)."""

import time

import torch

import horovodlike.torch as hvd
from horovodlike import _core

hvd.init()
before = _core.stats()
time.sleep(1.0)
after = _core.stats()
rounds = after["loop_rounds"] - before["loop_rounds"]
cycle_ms = after["loop_cycle_us"] / 1e3
bells = after["shm_round_bells"] - before["shm_round_bells"]
# Every rank wakes at its own time; the collective waits for the last one, so time it from
# the last rank's start: each rank's own wait is at most the others' lateness plus the call.
start = time.time()
starts = hvd.allgather(torch.tensor([start], dtype=torch.float64), name="starts")
latest = float(starts.max())
result = hvd.allreduce(torch.ones(4), op=hvd.Sum, name="after_idle")
assert result.tolist() == [float(hvd.size())] * 4, result
after_idle_ms = (time.time() - latest) * 1e3
print(f"rank {hvd.rank()}: IDLE rounds {rounds} bells {bells} after_idle_ms {after_idle_ms:.1f} "
      f"cycle_ms {cycle_ms:g}", flush=True)
hvd.shutdown()
