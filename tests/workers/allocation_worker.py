"""Counts the heap allocations of the background thread ("hvdl-loop") per training step, with
tests/native/malloc_counter.c preloaded. Prints one JSON line per rank for the test to judge:
the counts of the warm-up (first) steps, of every later step, and of the main thread, which
show that the counter works; every result is checked against NumPy on the way.

    allocation_worker.py COUNTER_LIBRARY STEPS
"""

import ctypes
import json
import os
import sys
import time

import numpy as np
import torch

import horovodlike.torch as hvd

counter = ctypes.CDLL(sys.argv[1]).malloc_counter_of
counter.restype = ctypes.c_long
counter.argtypes = [ctypes.c_int]
steps = int(sys.argv[2])

hvd.init()
rank, size = hvd.rank(), hvd.size()
torch.manual_seed(0)


def thread_named(name):
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                found = f.read().strip()
        except FileNotFoundError:  # a short-lived thread that ended since the listing
            continue
        if found == name:
            return int(tid)
    raise SystemExit(f"rank {rank}: no thread named {name!r}")


loop = thread_named("hvdl-loop")
main = os.getpid()  # the main thread's id is the process id

# 1. Fused allreduces of 60 tensors of mixed sizes, in place, as a DistributedOptimizer does.
sizes = [7, 1000, 33, 4096, 100_000, 1] * 10
tensors = [torch.empty(n) for n in sizes]


def fused_step(step):
    for i, t in enumerate(tensors):
        t.fill_(float(rank + 1 + i + step))
    handles = [hvd.allreduce_async_(t, name=f"fused.{i}", op=hvd.Sum)
               for i, t in enumerate(tensors)]
    for h in handles:
        hvd.synchronize(h)
    for i, t in enumerate(tensors):
        expected = sum(r + 1 + i + step for r in range(size))
        np.testing.assert_array_equal(t.numpy(), np.full(t.numel(), expected, np.float32))


# 2. Training steps of a model with 50 parameter tensors through DistributedOptimizer.
layers = []
for i in range(25):
    layers += [torch.nn.Linear(32 if i else 16, 32), torch.nn.Tanh()]
model = torch.nn.Sequential(*layers, torch.nn.Linear(32, 1))
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                     named_parameters=model.named_parameters())
data = torch.randn(8, 16, generator=torch.Generator().manual_seed(rank))


def train_step(step):
    optimizer.zero_grad()
    model(data).square().mean().backward()
    optimizer.step()


report = {"rank": rank}
for name, step_fn in (("fused", fused_step), ("training", train_step)):
    before = counter(loop)
    step_fn(0)  # the first step negotiates every tensor the slow way
    warmup = counter(loop) - before
    for step in range(1, 4):
        step_fn(step)
    counts = []
    main_before = counter(main)
    start = time.monotonic()
    for step in range(4, 4 + steps):
        before = counter(loop)
        step_fn(step)
        counts.append(counter(loop) - before)
    report[name] = {"warmup": warmup, "steps": counts, "main": counter(main) - main_before,
                    "seconds": time.monotonic() - start}
    # One more step, not counted: no rank can start the next phase's new tensors (which this
    # rank's loop would negotiate) before every rank has taken its last reading.
    step_fn(4 + steps)

# The replicas stayed identical: every rank holds rank 0's weights.
flat = torch.cat([p.detach().flatten() for p in model.parameters()])
np.testing.assert_array_equal(hvd.broadcast(flat, root_rank=0, name="final").numpy(),
                              flat.numpy())
print(f"rank {rank}: ALLOCATIONS {json.dumps(report)}", flush=True)
hvd.shutdown()
