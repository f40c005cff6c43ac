"""Allgather by host (HOROVOD_HIERARCHICAL_ALLGATHER): every dtype, first dimensions including
0 on some or all ranks, single and fused (grouped) allgathers, each result exactly the
concatenation of every rank's input in rank order, and the core's count of hierarchical
allgathers, which must be zero when the job did not ask for them.

argv[1]: "hierarchical" when this job asks for it on every rank, else "flat".
argv[2] (optional): "interleaved" puts even and odd ranks on two simulated hosts, so that no
host's ranks are consecutive (as mpirun may place them); set before init() through
HOROVOD_HOSTNAME, which decides the shared-memory groups.
"""

import os
import sys

import numpy as np
import torch

EXPECT = sys.argv[1]
INTERLEAVED = len(sys.argv) > 2 and sys.argv[2] == "interleaved"
if INTERLEAVED:
    os.environ["HOROVOD_HOSTNAME"] = f"simulated-{int(os.environ['HOROVOD_RANK']) % 2}"

import horovodlike.torch as hvd  # noqa: E402
from common import TORCH_DTYPES, check, to_torch  # noqa: E402

SEED = 8765
# Rows each rank contributes, by case: zero everywhere, zero on some ranks, uneven, and a large
# block (several chain-broadcast segments) next to an empty one.
ROWS = [
    lambda r: 0,
    lambda r: 0 if r == 1 else 3,
    lambda r: (r * 7 + 2) % 5,
    lambda r: 1,
    lambda r: 0 if r == 0 else 150_000 + r,
]
TRAILING = [(), (3,), (2, 2)]


def rank_input(dtype, case, trailing, r):
    rows = ROWS[case](r)
    gen = np.random.default_rng([SEED, case, len(trailing), r, list(TORCH_DTYPES).index(dtype)])
    values = gen.integers(0, 100, size=(rows, *trailing)).astype(np.float64)
    return to_torch(values, dtype)


def expected(dtype, case, trailing):
    return torch.cat([rank_input(dtype, case, trailing, r) for r in range(size)])


def hierarchical_count():
    return hvd.mpi_ops._core.stats()["hierarchical_allgathers"]


def check_single():
    """One tensor per allgather, straight into its output."""
    for dtype in TORCH_DTYPES:
        for case in range(len(ROWS)):
            if case == len(ROWS) - 1 and dtype not in ("float32", "uint8", "bfloat16"):
                continue  # the large case for a few widths only
            for trailing in TRAILING:
                name = f"ag.{dtype}.{case}.{len(trailing)}"
                before = hierarchical_count()
                out = hvd.allgather(rank_input(dtype, case, trailing, rank), name=name)
                want = expected(dtype, case, trailing)
                check(out.dtype == want.dtype and out.shape == want.shape,
                      f"{name}: got {out.dtype} {tuple(out.shape)}, want {tuple(want.shape)}")
                check(torch.equal(out, want), f"{name}: rank {rank} got other values")
                by_host = hierarchical_count() - before
                check(by_host == (1 if EXPECT == "hierarchical" else 0),
                      f"{name}: {by_host} hierarchical allgathers, expected with {EXPECT}")


def check_fused():
    """Several tensors in one allgather (grouped), of one dtype and different shapes."""
    for dtype in ("float32", "int64", "float16", "bool"):
        for group in range(3):
            cases = [(case, TRAILING[(case + group) % 3]) for case in range(len(ROWS) - 1)]
            inputs = [rank_input(dtype, case, trailing, rank) for case, trailing in cases]
            before = hierarchical_count()
            outs = hvd.grouped_allgather(inputs, name=f"agf.{dtype}.{group}")
            by_host = hierarchical_count() - before
            for (case, trailing), out in zip(cases, outs):
                want = expected(dtype, case, trailing)
                check(out.shape == want.shape and torch.equal(out, want),
                      f"grouped {dtype} {group}, case {case}: rank {rank} got other values")
            if EXPECT == "hierarchical":
                check(by_host >= 1, f"grouped {dtype} {group}: no allgather went by host")
            else:
                check(by_host == 0, f"grouped {dtype} {group}: {by_host} went by host")


hvd.init()
rank, size = hvd.rank(), hvd.size()
torch.set_num_threads(1)

before = hierarchical_count()
check_single()
check_fused()
by_host = hierarchical_count() - before

# Again with the variable on rank 0 only: every rank takes the flat path (rank 0 warns).
hvd.shutdown()
if rank == 0:
    os.environ["HOROVOD_HIERARCHICAL_ALLGATHER"] = "1"
else:
    os.environ.pop("HOROVOD_HIERARCHICAL_ALLGATHER", None)
hvd.init()
out = hvd.allgather(rank_input("float64", 2, (3,), rank), name="ag.mixed")
check(torch.equal(out, expected("float64", 2, (3,))), "variable on one rank only: wrong result")
check(hierarchical_count() == 0, "the variable was set on one rank only, yet went by host")

print(f"rank {rank}: hierarchical_allgathers={by_host}; hierarchical allgather OK", flush=True)
