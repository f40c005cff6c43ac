"""Runs named collectives for tests/test_timeline.py, which reads the timeline rank 0 writes.

    timeline_worker.py env OUT_DIR      HOROVOD_TIMELINE is set: collectives, then shutdown()
    timeline_worker.py runtime OUT_DIR  start_timeline/stop_timeline around some collectives
    timeline_worker.py bad-path OUT_DIR start_timeline on a path that cannot be written
"""

import os
import sys

import torch

import horovodlike.torch as hvd

mode, out_dir = sys.argv[1], sys.argv[2]
hvd.init()
rank, size = hvd.rank(), hvd.size()


def allreduce(name):
    result = hvd.allreduce(torch.full((16,), float(rank + 1)), name=name, op=hvd.Sum)
    assert torch.all(result == sum(range(1, size + 1))), (name, result)


def collectives():
    allreduce("solo")
    # A group always runs as one fused allreduce through the fusion buffer.
    tensors = [torch.full((n,), float(rank)) for n in (3, 50, 7)]
    for t in hvd.grouped_allreduce(tensors, name="fused", op=hvd.Sum):
        assert torch.all(t == sum(range(size))), t
    gathered = hvd.allgather(torch.full((rank + 1, 2), float(rank)), name="gathered")
    assert gathered.shape[0] == sum(range(1, size + 1)), gathered.shape
    value = torch.full((4,), float(rank))
    assert torch.all(hvd.broadcast(value, root_rank=1, name="broadcasted") == 1.0)


if mode == "env":
    for _ in range(3):  # the first time the slow way, then through the response cache
        collectives()
elif mode == "runtime":
    allreduce("before")
    hvd.start_timeline(os.path.join(out_dir, f"first.rank{rank}.json"))
    allreduce("during_first")
    allreduce("during_first")
    hvd.stop_timeline()
    allreduce("between")
    hvd.start_timeline(os.path.join(out_dir, f"second.rank{rank}.json"), mark_cycles=True)
    allreduce("during_second")
    hvd.stop_timeline()
    hvd.stop_timeline()  # a second stop does nothing
    allreduce("after")
elif mode == "bad-path":
    path = os.path.join(out_dir, "no-such-directory", "timeline.json")
    try:
        hvd.start_timeline(path)
        outcome = "no error"
    except ValueError as e:
        outcome = f"ValueError: {e}"
    print(f"rank {rank}: {outcome}", flush=True)
    allreduce("still_works")
else:
    raise SystemExit(f"unknown mode {mode!r}")
hvd.shutdown()
print(f"rank {rank}: done", flush=True)
