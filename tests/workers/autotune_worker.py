"""Training-like steps of fused allreduces while the autotuner changes the parameters under them:
every result is checked against NumPy, and after each step the rank prints the parameters in
force, for the test to compare across ranks.

Usage: autotune_worker.py STEPS
"""

import json
import sys

import numpy as np
import torch

import horovodlike.torch as hvd
from horovodlike.common.basics import _runtime_stats
from common import as_float64, check, expected_reduce, rank_input, to_torch

hvd.init()
rank, size = hvd.rank(), hvd.size()
steps = int(sys.argv[1])
SEED = 77
# Gradients of a small model: mixed sizes (16 bytes to ~600 KB) and dtypes, so that thresholds
# between 64 KiB and hundreds of MB group them differently.
TENSORS = [("float32", 4), ("float32", 150000), ("float64", 3000), ("float32", 20000),
           ("int32", 70000), ("float32", 1000), ("float64", 40000), ("float32", 9)]


def parameters():
    s = _runtime_stats()
    return [s["parameters_round"], s["fusion_threshold_bytes"], s["cycle_time_ms"],
            s["cache_enabled"], s["autotune_done"]]


records = []
for step in range(steps):
    handles, expected = [], []
    for i, (dtype, count) in enumerate(TENSORS):
        inputs = [rank_input(dtype, count, r, SEED + step * 31 + i) for r in range(size)]
        op = "Average" if dtype == "float64" else "Sum"
        expected.append(expected_reduce(inputs, op, dtype, size))
        tensor = to_torch(inputs[rank], dtype)
        handles.append(hvd.allreduce_async(tensor, name=f"grad.{i}",
                                           op=hvd.Average if op == "Average" else hvd.Sum))
    for i, (handle, want) in enumerate(zip(handles, expected)):
        got = as_float64(hvd.synchronize(handle))
        check(np.allclose(got, want, rtol=1e-6, atol=1e-6),
              f"step {step} tensor {i}: rank {rank} max error {np.max(np.abs(got - want))}")
    records.append(parameters())

stats = _runtime_stats()
check(stats["autotune"], "HOROVOD_AUTOTUNE did not reach the core")
print(f"rank {rank}: records {json.dumps(records)}")
print(f"rank {rank}: {steps} autotuned steps OK")
hvd.shutdown()
