"""The GPU path's edges on the stand-ins (tests/gpu_standins/): an old NCCL whose missing
features are staged through host memory, and an NCCL error that must fail every rank fast.

Usage: gpu_features_worker.py old|join|host|fail REPORT_DIR"""

import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_worker import DT, OPS, RED, Gpu, check, enqueue, finish  # noqa: E402
from reference import expected_adasum  # noqa: E402
from horovodlike import _core  # noqa: E402
from horovodlike.common import basics  # noqa: E402
from horovodlike.common.exceptions import HorovodInternalError  # noqa: E402


def old_nccl(gpu, rank, size):
    inputs = [np.arange(6, dtype=np.float32) * (r + 1) for r in range(size)]
    total = np.sum(inputs, axis=0)
    for name, op, pre, want in [("plain", "Sum", 1.0, total),
                                ("mean", "Average", 1.0, total / size),
                                ("scaled", "Sum", 0.5, total * 0.5)]:
        p = gpu.put(inputs[rank])
        finish(enqueue(gpu, "allreduce", name, p, p, "float32", (6,), reduce_op=RED[op],
                       prescale=pre))
        check(gpu.get(p, inputs[rank]), want, name)
    runs = basics._runtime_stats()["provider_runs"]
    assert runs.get("NCCL_ALLREDUCE") == 1 and runs.get("CUDA_HOST_STAGING") == 2, runs
    assert _core.gpu_mode(0) == "nccl", _core.gpu_mode(0)
    print(f"rank {rank}: old nccl ok", flush=True)


def join_and_adasum(gpu, rank, size):
    """Adasum on GPU tensors goes through host memory; a rank that joined takes part in the
    others' allreduces with zeros, over NCCL (from its GPU, known from an earlier collective)."""
    vectors = [np.arange(1, 9, dtype=np.float32) * (r + 1) * (-1) ** r for r in range(size)]
    p = gpu.put(vectors[rank])
    finish(enqueue(gpu, "allreduce", "adasum", p, p, "float32", (8,), reduce_op=RED["Adasum"]))
    check(gpu.get(p, vectors[rank]), expected_adasum(vectors, np.float32), "adasum")
    runs = basics._runtime_stats()["provider_runs"]
    assert runs.get("CUDA_HOST_STAGING") == 1, runs
    x = np.full(5, rank + 1.0, np.float32)
    p = gpu.put(x)
    if rank == size - 1:
        h = _core.enqueue_control(OPS["join"], "join")
    else:
        finish(enqueue(gpu, "allreduce", "while_joined", p, p, "float32", (5,),
                       reduce_op=RED["Sum"]))
        check(gpu.get(p, x), np.full(5, sum(r + 1.0 for r in range(size - 1))), "joined")
        h = _core.enqueue_control(OPS["join"], "join")
    finish(h, release=False)
    last = _core.output(h)[2][0]
    _core.release(h)
    assert last == size - 2 if size > 1 else 0, last
    runs = basics._runtime_stats()["provider_runs"]
    assert runs.get("NCCL_ALLREDUCE", 0) >= 1 and _core.gpu_mode(0) == "nccl", runs
    print(f"rank {rank}: join and adasum ok", flush=True)


def by_host(gpu, rank, size):
    """HOROVOD_HIERARCHICAL_ALLREDUCE=1 on 2 hosts x 2 ranks: NCCL inside each host, the CPU
    transport across hosts; single, fused and scaled allreduces equal NumPy's."""
    for i, (op, pre, post, shape) in enumerate([("Sum", 1.0, 1.0, (9,)),
                                                ("Average", 1.0, 1.0, (2, 7)),
                                                ("Sum", 0.5, 4.0, (1,)),
                                                ("Max", 1.0, 1.0, (5,))]):
        inputs = [np.arange(np.prod(shape), dtype=np.float32).reshape(shape) * (r + 1) - r
                  for r in range(size)]
        stacked = np.stack(inputs).astype(np.float64) * pre
        want = {"Sum": stacked.sum(0), "Average": stacked.mean(0), "Max": stacked.max(0)}[op]
        p = gpu.put(inputs[rank])
        finish(enqueue(gpu, "allreduce", f"host.{i}", p, p, "float32", shape,
                       reduce_op=RED[op], prescale=pre, postscale=post))
        check(gpu.get(p, inputs[rank]), want * post, f"by host {op}")
    # Fused: three tensors in flight at once.
    ptrs = [gpu.put(np.full(n, rank + 1.0, np.float32)) for n in (3, 4, 5)]
    hs = [enqueue(gpu, "allreduce", f"fused.{j}", p, p, "float32", (n,), reduce_op=RED["Sum"])
          for j, (p, n) in enumerate(zip(ptrs, (3, 4, 5)))]
    for h in hs:
        finish(h)
    for p, n in zip(ptrs, (3, 4, 5)):
        check(gpu.get(p, np.zeros(n, np.float32)), np.full(n, size * (size + 1) / 2), "fused")
    runs = basics._runtime_stats()["provider_runs"]
    assert runs.get("NCCL_HIERARCHICAL_ALLREDUCE", 0) >= 5, runs
    print(f"rank {rank}: by host ok", flush=True)


def failing_nccl(gpu, rank, size, report):
    x = np.ones(4, np.float32)
    p = gpu.put(x, delayed=False)
    finish(enqueue(gpu, "allreduce", "before", p, p, "float32", (4,), reduce_op=RED["Sum"]))
    started = time.time()
    try:
        # Rank 1's NCCL fails this one (HVDL_STANDIN_NCCL_FAIL_AFTER) and never finishes it.
        finish(enqueue(gpu, "allreduce", "failing", p, p, "float32", (4,), reduce_op=RED["Sum"]))
        outcome = "completed"
    except HorovodInternalError as e:
        outcome = f"HorovodInternalError after {time.time() - started:.2f} s: {e}"
    (report / f"rank{rank}.txt").write_text(outcome + "\n")
    print(f"rank {rank}: {outcome}", flush=True)


def main():
    mode, report = sys.argv[1], Path(sys.argv[2])
    if mode == "fail" and os.environ.get("HOROVOD_RANK") == "1":
        os.environ["HVDL_STANDIN_NCCL_FAIL_AFTER"] = "2"
    basics.init()
    rank, size = basics.rank(), basics.size()
    gpu = Gpu(basics.local_rank())
    if mode == "old":
        old_nccl(gpu, rank, size)
    elif mode == "host":
        by_host(gpu, rank, size)
    elif mode == "join":
        join_and_adasum(gpu, rank, size)
    else:
        failing_nccl(gpu, rank, size, report)
    basics.shutdown()


if __name__ == "__main__":
    main()
