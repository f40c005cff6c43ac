"""Every collective, op, dtype and size, checked against NumPy on every rank."""

import os
import random
import sys

import numpy as np
import torch

import horovodlike.torch as hvd
from common import (FLOAT_DTYPES, TORCH_DTYPES, as_float64, check, expected_reduce, rank_input,
                    to_torch)

hvd.init()
rank, size = hvd.rank(), hvd.size()
SEED = 1234
# 5000: 10-40 KB, staged whole over shared memory (its slot's stores chosen like the large
# ones'); the last is over 3 MiB in float64
SIZES = [0, 1, 7, 1000, 5000, 3 * 1024 * 1024 // 8 + 3]
OPS = {"Sum": hvd.Sum, "Average": hvd.Average, "Min": hvd.Min, "Max": hvd.Max,
       "Product": hvd.Product}

checked = 0
for dtype in TORCH_DTYPES:
    for op_name, op in OPS.items():
        if dtype == "bool" and op_name == "Average":
            continue
        for count in SIZES:
            if count > 5000 and op_name in ("Min", "Product"):
                continue  # the large size is covered by Sum, Average and Max
            inputs = [rank_input(dtype, count, r, SEED, op_name) for r in range(size)]
            expected = expected_reduce(inputs, op_name, dtype, size)
            tensor = to_torch(inputs[rank], dtype)
            name = f"{dtype}.{op_name}.{count}"
            out = hvd.allreduce(tensor, name=name, op=op)
            check(out.dtype == tensor.dtype and out.shape == tensor.shape,
                  f"{name}: got {out.dtype} {tuple(out.shape)}")
            # Inputs are exact in every dtype, so results are exact except Average of floats.
            tol = 1e-2 if dtype in ("float16", "bfloat16") and op_name == "Average" else 1e-6
            got = as_float64(out)
            check(np.allclose(got, expected, rtol=tol, atol=tol),
                  f"{name}: rank {rank} max error {np.max(np.abs(got - expected)) if count else 0}")
            # In place gives the same result and returns the same tensor.
            inplace = to_torch(inputs[rank], dtype)
            same = hvd.allreduce_(inplace, name=name + ".inplace", op=op)
            check(same is inplace and np.allclose(as_float64(inplace), expected, rtol=tol, atol=tol),
                  f"{name} in place: wrong result")
            checked += 2

# Prescale and postscale, applied before and after the sum, for floats and ints.
for dtype in ("float32", "float64", "float16", "int32"):
    inputs = [rank_input(dtype, 101, r, SEED, "Sum") for r in range(size)]
    out = hvd.allreduce(to_torch(inputs[rank], dtype), op=hvd.Sum, prescale_factor=2.0,
                        postscale_factor=0.5 if dtype != "int32" else 3.0, name=f"scaled.{dtype}")
    post = 0.5 if dtype != "int32" else 3.0
    expected = sum(x * 2.0 for x in inputs) * post
    check(np.allclose(as_float64(out), expected, rtol=1e-3), f"scaled {dtype}: wrong result")
    avg = hvd.allreduce(to_torch(inputs[rank], dtype), op=hvd.Average, postscale_factor=4.0,
                        name=f"scaled.avg.{dtype}")
    expected_avg = sum(inputs) * 4.0 / size
    if dtype == "int32":
        expected_avg = np.trunc(sum(inputs) * (4.0 / size))
    check(np.allclose(as_float64(avg), expected_avg, rtol=1e-3, atol=1e-6),
          f"scaled average {dtype}: wrong result")

# Allgather: first dimensions differ per rank (rank r contributes r + 1 rows, or 0 rows).
for dtype in TORCH_DTYPES:
    for rows_of in (lambda r: r + 1, lambda r: 0 if r % 2 else 3, lambda r: 1000):
        parts = [rank_input(dtype, rows_of(r) * 3, r, SEED, "Sum").reshape(rows_of(r), 3)
                 for r in range(size)]
        out = hvd.allgather(to_torch(parts[rank], dtype), name=f"gather.{dtype}.{rows_of(0)}")
        expected = np.concatenate(parts)
        check(tuple(out.shape) == expected.shape and out.dtype == TORCH_DTYPES[dtype],
              f"allgather {dtype}: shape {tuple(out.shape)} != {expected.shape}")
        check(np.array_equal(as_float64(out), expected), f"allgather {dtype}: wrong values")
    one_d = hvd.allgather(torch.tensor([rank, rank], dtype=torch.int64), name=f"gather1d.{dtype}")
    check(one_d.tolist() == [r for r in range(size) for _ in range(2)], "allgather 1-D wrong")

# Broadcast from every root, for every dtype, small and large.
for root in range(size):
    for dtype in TORCH_DTYPES:
        for count in (1, 33, 600_000):
            values = [rank_input(dtype, count, r, SEED, "Sum") for r in range(size)]
            tensor = to_torch(values[rank], dtype)
            out = hvd.broadcast(tensor, root, name=f"bcast.{root}.{dtype}.{count}")
            check(np.array_equal(as_float64(out), values[root]),
                  f"broadcast root {root} {dtype} {count}: wrong values")
            check(np.array_equal(as_float64(tensor), values[rank]),
                  "broadcast modified its input")
            inplace = to_torch(values[rank], dtype)
            hvd.broadcast_(inplace, root, name=f"bcast_.{root}.{dtype}.{count}")
            check(np.array_equal(as_float64(inplace), values[root]), "broadcast_ wrong values")

# Hundreds of small tensors in flight at once are fused and all complete, submitted in a
# different order on every rank.
before = hvd.mpi_ops._core.stats()
names = [f"grad.{i}" for i in range(400)]
order = list(range(len(names)))
random.Random(rank).shuffle(order)
handles = {}
for i in order:
    handles[i] = hvd.allreduce_async(torch.full((i % 17 + 1,), float(i + rank)), name=names[i],
                                     op=hvd.Sum)
for i, h in handles.items():
    out = hvd.synchronize(h)
    want = float(i * size + sum(range(size)))
    check(torch.all(out == want).item(), f"{names[i]}: got {out[0].item()} want {want}")
after = hvd.mpi_ops._core.stats()
tensors = after["allreduce_tensors"] - before["allreduce_tensors"]
collectives = after["allreduce_collectives"] - before["allreduce_collectives"]
check(tensors == 400, f"expected 400 tensors reduced, core counted {tensors}")
if size > 1:
    threshold = int(os.environ.get("HOROVOD_FUSION_THRESHOLD", str(128 * 1024 * 1024)))
    if threshold == 0:
        check(collectives == 400, f"fusion is off, yet 400 tensors took {collectives} collectives")
    else:
        check(collectives < 200, f"400 small tensors took {collectives} collectives: not fused")

# The same names again: the response cache serves them (and the results stay right).
for step in range(3):
    hs = [hvd.allreduce_async(torch.full((5,), float(step + i)), name=names[i], op=hvd.Sum)
          for i in range(50)]
    for i, h in enumerate(hs):
        check(torch.all(hvd.synchronize(h) == float((step + i) * size)).item(), "cached wrong")

# Every rank gets the same bits, whatever the algorithm's order of combination: NaNs in some
# ranks' inputs of a Min and a Max, and sums of floats that round, around the 32 KiB line
# between the recursive doubling and the ring.
for count in (3, 8192, 8193):
    values = np.random.default_rng(7 + rank).standard_normal(count).astype(np.float32)
    values[rank % 3::5] = np.nan if rank % 2 else values[rank % 3::5]
    for op_name in ("Min", "Max", "Sum"):
        out = hvd.allreduce(torch.from_numpy(values.copy()), op=OPS[op_name],
                            name=f"same.bits.{op_name}.{count}")
        bits = hvd.allgather(out.view(torch.int32).unsqueeze(0), name=f"bits.{op_name}.{count}")
        check(bool(torch.all(bits == bits[0]).item()),
              f"{op_name} of {count} floats: the ranks' results differ in their bits")

# Poll and barrier.
h = hvd.allreduce_async(torch.ones(4), name="polled")
while not hvd.poll(h):
    pass
check(torch.allclose(hvd.synchronize(h), torch.ones(4)), "polled allreduce wrong")
hvd.barrier()

# Objects.
obj = hvd.broadcast_object({"rank": rank, "list": list(range(rank + 3))}, root_rank=size - 1)
check(obj == {"rank": size - 1, "list": list(range(size + 2))}, f"broadcast_object: {obj}")
objs = hvd.allgather_object(("r", rank, "x" * rank))
check(objs == [("r", r, "x" * r) for r in range(size)], f"allgather_object: {objs}")

# shutdown() and init() again: a fresh runtime that works.
hvd.shutdown()
check(not hvd.is_initialized(), "still initialized after shutdown")
hvd.init()
out = hvd.allreduce(torch.tensor([float(rank)]), op=hvd.Sum, name="after.reinit")
check(out.item() == sum(range(size)), "allreduce after re-init wrong")
print(f"rank {rank}: {checked} allreduce checks passed; collectives OK", flush=True)
