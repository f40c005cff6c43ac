"""Allreduce by host (HOROVOD_HIERARCHICAL_ALLREDUCE): every op, dtype and size against NumPy,
fused and single tensors, scaling, the same bits on every rank, and the core's count of
hierarchical allreduces, which must be zero when the job did not ask for them.

argv[1]: "hierarchical" when this job asks for it on every rank, else "flat".
"""

import os
import sys

import numpy as np
import torch

import horovodlike.torch as hvd
from common import TORCH_DTYPES, as_float64, check, expected_reduce, rank_input, to_torch

EXPECT = sys.argv[1]
SEED = 4321
# 0, 1, odd, smaller than the number of local ranks times a cache line, and over 3 MiB in
# float64 (several ring segments per block).
SIZES = [0, 1, 3, 7, 1001, 3 * 1024 * 1024 // 8 + 3]
OPS = {"Sum": hvd.Sum, "Average": hvd.Average, "Min": hvd.Min, "Max": hvd.Max,
       "Product": hvd.Product}


def core_stats():
    return hvd.mpi_ops._core.stats()


def same_on_every_rank(tensor, what):
    """The result's bytes, gathered from every rank, are identical."""
    raw = tensor.reshape(-1).view(torch.uint8) if tensor.dtype != torch.bool else \
        tensor.reshape(-1).to(torch.uint8)
    everyone = hvd.allgather(raw.unsqueeze(0), name=f"bits.{what}")
    for r in range(size):
        check(torch.equal(everyone[r], everyone[0]), f"{what}: rank {r} got other bits than rank 0")


def check_allreduces():
    """Every dtype, op and size, one tensor at a time; returns how many were not empty."""
    nonempty = 0
    for dtype in TORCH_DTYPES:
        for op_name, op in OPS.items():
            if dtype == "bool" and op_name == "Average":
                continue
            for count in SIZES:
                if count > 1001 and (op_name in ("Min", "Product") or
                                     dtype in ("int8", "uint8", "int16", "uint16", "bool")):
                    continue  # the large size: Sum, Average and Max of the wider dtypes
                inputs = [rank_input(dtype, count, r, SEED, op_name) for r in range(size)]
                expected = expected_reduce(inputs, op_name, dtype, size)
                name = f"h.{dtype}.{op_name}.{count}"
                out = hvd.allreduce(to_torch(inputs[rank], dtype), name=name, op=op)
                check(out.dtype == TORCH_DTYPES[dtype] and tuple(out.shape) == (count,),
                      f"{name}: got {out.dtype} {tuple(out.shape)}")
                tol = 1e-2 if dtype in ("float16", "bfloat16") and op_name == "Average" else 1e-6
                got = as_float64(out)
                check(np.allclose(got, expected, rtol=tol, atol=tol),
                      f"{name}: rank {rank} max error "
                      f"{np.max(np.abs(got - expected)) if count else 0}")
                nonempty += count > 0
    return nonempty


def check_scaling():
    for dtype in ("float32", "float64", "float16", "int32"):
        for count in (5, 300_001):
            inputs = [rank_input(dtype, count, r, SEED, "Sum") for r in range(size)]
            post = 0.5 if dtype != "int32" else 3.0
            out = hvd.allreduce(to_torch(inputs[rank], dtype), op=hvd.Sum, prescale_factor=2.0,
                                postscale_factor=post, name=f"h.scaled.{dtype}.{count}")
            expected = sum(x * 2.0 for x in inputs) * post
            check(np.allclose(as_float64(out), expected, rtol=1e-3),
                  f"scaled {dtype} {count}: wrong result")
            pre = 0.5 if dtype != "int32" else 1.0
            avg = hvd.allreduce(to_torch(inputs[rank], dtype), op=hvd.Average,
                                prescale_factor=pre, postscale_factor=4.0,
                                name=f"h.avg.{dtype}.{count}")
            expected = sum(x * pre for x in inputs) * 4.0 / size
            if dtype == "int32":
                expected = np.trunc(sum(inputs) * (4.0 / size))
            check(np.allclose(as_float64(avg), expected, rtol=1e-3, atol=1e-6),
                  f"average {dtype} {count} with pre- and postscale: wrong result")


def check_fused():
    """Tensors in flight together are fused into one buffer; each gets its own sum back."""
    before = core_stats()
    handles = {}
    for i in range(60):
        dtype = torch.float32 if i % 2 else torch.int64
        length = [1, 2, 3, 17, 1000, 65_537][i % 6]
        handles[i] = hvd.allreduce_async(torch.full((length,), i + rank, dtype=dtype),
                                         name=f"h.fused.{i}", op=hvd.Sum)
    for i, handle in handles.items():
        out = hvd.synchronize(handle)
        want = i * size + sum(range(size))
        check(bool(torch.all(out == want)), f"fused tensor {i}: got {out[0].item()}, want {want}")
    after = core_stats()
    collectives = after["allreduce_collectives"] - before["allreduce_collectives"]
    check(after["allreduce_tensors"] - before["allreduce_tensors"] == 60, "not 60 tensors")
    check(collectives < 60, f"60 tensors in flight took {collectives} collectives: not fused")


def check_same_bits():
    """Sums of random floats depend on the order of the additions: every rank must still
    end with exactly the same bits."""
    gen = torch.Generator().manual_seed(SEED + rank)
    for count in (1, 33, 1_000_003):
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            x = torch.randn(count, generator=gen).to(dtype)
            for op in (hvd.Sum, hvd.Average):
                out = hvd.allreduce(x, op=op, name=f"h.bits.{count}.{dtype}.{op}")
                same_on_every_rank(out, f"{dtype}.{count}.op{op}")


hvd.init()
rank, size = hvd.rank(), hvd.size()
torch.set_num_threads(1)

before = core_stats()
nonempty = check_allreduces()
check_scaling()
check_fused()
check_same_bits()
after = core_stats()
hierarchical = after["hierarchical_allreduces"] - before["hierarchical_allreduces"]
collectives = after["allreduce_collectives"] - before["allreduce_collectives"]
if EXPECT == "hierarchical":
    # Every allreduce of a non-empty tensor went by host (empty ones need no exchange).
    check(nonempty <= hierarchical <= collectives,
          f"{hierarchical} of {collectives} allreduces went by host; expected at least {nonempty}")
    # Its own variable decides the allgather (same_on_every_rank gathers): not asked, flat.
    check(after["hierarchical_allgathers"] == 0,
          "allgathers went by host, but the job asked for the hierarchical allreduce only")
else:
    check(hierarchical == 0, f"{hierarchical} allreduces went by host, but the job did not ask")

# Again after shutdown() and init(), now with the variable set on rank 0 only: the ranks must
# not take different paths, so all take the flat one (rank 0 warns), and results stay right.
hvd.shutdown()
if rank == 0:
    os.environ["HOROVOD_HIERARCHICAL_ALLREDUCE"] = "1"
else:
    os.environ.pop("HOROVOD_HIERARCHICAL_ALLREDUCE", None)
hvd.init()
out = hvd.allreduce(torch.arange(1001, dtype=torch.float64) * (rank + 1), op=hvd.Sum,
                    name="h.mixed")
check(torch.equal(out, torch.arange(1001, dtype=torch.float64) * sum(range(1, size + 1))),
      "allreduce with the variable on one rank only: wrong result")
check(core_stats()["hierarchical_allreduces"] == 0,
      "the variable was set on one rank only, yet allreduces went by host")

print(f"rank {rank}: local_rank={hvd.local_rank()} local_size={hvd.local_size()} "
      f"cross_rank={hvd.cross_rank()} cross_size={hvd.cross_size()} "
      f"hierarchical={hierarchical} of {collectives}; hierarchical OK", flush=True)
