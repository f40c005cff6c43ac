"""Ranks pinned to CPUs before init(), as `--bind-to core` or a scheduler's cgroups pin them:
argv[1] "own" pins rank r to CPU r (one core each), "shared" pins every rank to CPU 0. Checks
an allreduce of every size class against the closed-form sum, and prints how the shared-memory
link decided to wait (spin or sleep) and how many cores it counted for the host's ranks."""

import os
import sys

import torch

import horovodlike.torch as hvd
from horovodlike import _core

mode = sys.argv[1]
local_rank = int(os.environ["HOROVOD_LOCAL_RANK"])
cpus = sorted(os.sched_getaffinity(0))
os.sched_setaffinity(0, {cpus[local_rank % len(cpus)] if mode == "own" else cpus[0]})
hvd.init()
rank, size = hvd.rank(), hvd.size()
for count in (1, 1000, 300_000, 3_000_000):
    out = hvd.allreduce(torch.full((count,), float(rank + 1)), op=hvd.Sum, name=f"pinned.{count}")
    expected = size * (size + 1) / 2
    assert torch.all(out == expected), f"{count}: got {out[:3]}, expected {expected}"
stats = _core.stats()
print(f"rank {rank}: spins={stats['shm_spins']} host_cores={stats['shm_host_cores']} "
      f"moves={stats['shm_cpu_moves']}", flush=True)
hvd.shutdown()
