"""Mismatches fail that call on every rank with a clear message; bad input raises before
anything is sent; the job goes on and later calls work."""

import numpy as np
import torch

import horovodlike.torch as hvd
from common import check

# A process set known at start-up, registered by init() on every rank.
pair = hvd.ProcessSet([0, 1])
hvd.init(process_sets=[pair])
rank, size = hvd.rank(), hvd.size()
assert size >= 2, "run with at least 2 ranks"


def expect_mismatch(make, name, *fragments):
    try:
        make()
    except hvd.TensorMismatchError as e:
        message = str(e)
        for fragment in (name,) + fragments:
            check(fragment in message, f"mismatch message for {name} lacks {fragment!r}: {message}")
        return message
    raise AssertionError(f"{name}: no error raised on rank {rank}")


def works(tag):
    out = hvd.allreduce(torch.full((3,), float(rank)), op=hvd.Sum, name=f"works.{tag}")
    check(out.tolist() == [float(sum(range(size)))] * 3, f"allreduce after {tag} wrong: {out}")


# Shapes differ on the last rank.
shape = (4, 2) if rank != size - 1 else (2, 4)
msg = expect_mismatch(lambda: hvd.allreduce(torch.ones(shape), name="bad.shape"), "bad.shape",
                      "shape", "[4, 2]", "[2, 4]", f"rank {size - 1}")
works("shape")
# Dtypes differ.
dtype = torch.float32 if rank == 0 else torch.float64
expect_mismatch(lambda: hvd.allreduce(torch.ones(3, dtype=dtype), name="bad.dtype"),
                "bad.dtype", "data types", "float32", "float64")
works("dtype")
# Different collectives under one name.
if rank == 0:
    fn = lambda: hvd.allgather(torch.ones(3), name="bad.op")
else:
    fn = lambda: hvd.allreduce(torch.ones(3), name="bad.op")
expect_mismatch(fn, "bad.op", "allgather", "allreduce")
works("op")
# Different reduce ops.
op = hvd.Sum if rank == 0 else hvd.Max
expect_mismatch(lambda: hvd.allreduce(torch.ones(3), name="bad.reduce", op=op), "bad.reduce",
                "Sum", "Max")
# Different broadcast roots.
expect_mismatch(lambda: hvd.broadcast(torch.ones(3), root_rank=rank % 2, name="bad.root"),
                "bad.root", "root")
# Allgather with different trailing dimensions.
expect_mismatch(lambda: hvd.allgather(torch.ones(2, 3 + (rank == 1)), name="bad.gather"),
                "bad.gather", "[2, 3]", "[2, 4]")
works("gather")
# One member of a grouped call differs in shape: every member fails on every rank, naming the
# culprit, and nothing hangs.
group = [torch.ones(4), torch.ones(3 + rank), torch.ones(5)]
try:
    hvd.grouped_allreduce(group, name="bad.group")
    raise AssertionError(f"grouped mismatch: no error on rank {rank}")
except hvd.TensorMismatchError as e:
    check("bad.group.1" in str(e) and "[3]" in str(e) and "[4]" in str(e),
          f"grouped mismatch message: {e}")
works("group")
# A mismatch on a name the cache knows: same name, new shape on one rank only.
for step in range(3):
    hvd.allreduce(torch.ones(5), name="cached.name")
expect_mismatch(lambda: hvd.allreduce(torch.ones(5 if rank else 6), name="cached.name"),
                "cached.name", "[5]", "[6]")
out = hvd.allreduce(torch.ones(5), name="cached.name", op=hvd.Sum)
check(out.tolist() == [float(size)] * 5, "cached name unusable after its mismatch")

# Bad input raises synchronously, before anything is sent; no other rank is involved.
def expect_raise(exc, fn, *fragments):
    try:
        fn()
    except exc as e:
        for fragment in fragments:
            check(fragment in str(e), f"{exc.__name__} message lacks {fragment!r}: {e}")
        return
    raise AssertionError(f"expected {exc.__name__} ({fragments})")


first = hvd.allreduce_async(torch.ones(2), name="dup", op=hvd.Sum)
expect_raise(ValueError, lambda: hvd.allreduce_async(torch.ones(2), name="dup"), "dup",
             "already in flight")
check(hvd.synchronize(first).tolist() == [float(size)] * 2, "first 'dup' allreduce wrong")
expect_raise(TypeError, lambda: hvd.allreduce(torch.ones(2, dtype=torch.complex64), name="cx"),
             "cx", "complex64", "not supported")
expect_raise(ValueError, lambda: hvd.broadcast(torch.ones(2), root_rank=size, name="far"),
             "far", f"root_rank {size}")
expect_raise(ValueError, lambda: hvd.broadcast(torch.ones(2), root_rank=-1, name="neg"), "neg")
strided = torch.ones(4, 4).t()
expect_raise(ValueError, lambda: hvd.allreduce_(strided, name="strided"), "strided",
             "not contiguous")
expect_raise(ValueError, lambda: hvd.broadcast_(strided, 0, name="strided.b"), "not contiguous")
expect_raise(ValueError, lambda: hvd.allreduce(torch.ones(2, dtype=torch.bool), name="bavg",
                                               op=hvd.Average), "bavg", "bool")
# Average of bool is refused by reducescatter as by allreduce (it is no logical or).
expect_raise(ValueError, lambda: hvd.reducescatter(torch.ones(2 * size, dtype=torch.bool),
                                                   name="rs.bavg", op=hvd.Average),
             "rs.bavg", "bool")
expect_raise(ValueError, lambda: hvd.allgather(torch.tensor(1.0), name="scalar"), "scalar")
expect_raise(TypeError, lambda: hvd.allreduce([1, 2, 3], name="list"), "torch.Tensor")
# An out-of-place allreduce of a non-contiguous tensor is fine (it is copied).
out = hvd.allreduce(strided, op=hvd.Sum, name="strided.ok")
check(torch.equal(out, torch.full((4, 4), float(size))), "non-contiguous out-of-place wrong")
works("end")
# The static set works; adding sets at run time needs HOROVOD_DYNAMIC_PROCESS_SETS.
check(pair.process_set_id == 1 and pair.size() == 2, f"static process set: {pair}")
if pair.included():
    out = hvd.allreduce(torch.tensor([float(rank)]), op=hvd.Sum, name="pair", process_set=pair)
    check(out.item() == 1.0, "allreduce on the static set wrong")
expect_raise(ValueError, lambda: hvd.add_process_set([0]), "HOROVOD_DYNAMIC_PROCESS_SETS")
# Join and process-set changes are control operations with their own message: the tensor entry
# point refuses them, and ranks asking for different changes get a mismatch naming the ranks.
from horovodlike import _core  # noqa: E402
expect_raise(ValueError, lambda: _core.enqueue(_core.OPS["join"], "join", 0, 0, 0, [0]),
             "control operation")
handle = _core.enqueue_control(_core.OPS["add_process_set"], "ctl.mismatch",
                               ranks=[0, 1] if rank == 0 else [0, 2])
code, message = _core.wait(handle)
_core.release(handle)
check(code == _core.STATUS_MISMATCH and "process set ranks" in message and "[0, 1]" in message
      and "[0, 2]" in message, f"process-set change mismatch: {code} {message}")
check(sorted(_core.process_set_ids()) == [0, 1], f"a refused change added a set: "
      f"{_core.process_set_ids()}")
works("control")
print(f"rank {rank}: errors OK", flush=True)
