"""Inputs the core cannot send raise on the calling rank before anything is sent, naming the
problem, and the job goes on: tensors without storage (PyTorch's meta device, a null pointer with
elements) or on a device horovodlike does not take, names longer than a message carries, and
process sets with ranks outside the job. Run with 2 ranks and HOROVOD_DYNAMIC_PROCESS_SETS=1."""

import numpy as np
import torch

import horovodlike.torch as hvd
from horovodlike import _core
from horovodlike.common import numpy_ops
from horovodlike.common.constants import (ADD_PROCESS_SET, ALLGATHER, ALLREDUCE, BROADCAST,
                                          DTYPES, MAX_NAME_BYTES, Sum)
from common import check

hvd.init()
rank, size = hvd.rank(), hvd.size()
ROWS = 2 * size  # splits evenly for alltoall and reducescatter


def expect(kind, fn, *fragments):
    try:
        fn()
    except kind as e:
        for fragment in fragments:
            check(fragment in str(e), f"{kind.__name__} lacks {fragment!r}: {str(e)[:300]}")
        return
    raise AssertionError(f"no {kind.__name__} ({fragments}) on rank {rank}")


def works(tag):
    out = hvd.allreduce(torch.full((3,), float(rank + 1)), op=hvd.Sum, name=f"works.{tag}")
    check(out.tolist() == [size * (size + 1) / 2] * 3, f"allreduce after {tag} wrong: {out}")


def grouped(function):
    """A grouped call whose second member is the one under test: nothing may be queued."""
    return lambda t, name: function([torch.ones(ROWS, 3), t], name=name)


sync = hvd.synchronize
COLLECTIVES = {
    "allreduce": lambda t, n: hvd.allreduce(t, name=n),
    "allreduce_": lambda t, n: hvd.allreduce_(t, name=n),
    "allreduce_async": lambda t, n: sync(hvd.allreduce_async(t, name=n)),
    "allreduce_async_": lambda t, n: sync(hvd.allreduce_async_(t, name=n)),
    "allgather": lambda t, n: hvd.allgather(t, name=n),
    "allgather_async": lambda t, n: sync(hvd.allgather_async(t, name=n)),
    "broadcast": lambda t, n: hvd.broadcast(t, 0, name=n),
    "broadcast_": lambda t, n: hvd.broadcast_(t, 0, name=n),
    "broadcast_async": lambda t, n: sync(hvd.broadcast_async(t, 0, name=n)),
    "broadcast_async_": lambda t, n: sync(hvd.broadcast_async_(t, 0, name=n)),
    "alltoall": lambda t, n: hvd.alltoall(t, name=n),
    "alltoall_async": lambda t, n: sync(hvd.alltoall_async(t, name=n)),
    "reducescatter": lambda t, n: hvd.reducescatter(t, name=n, op=hvd.Sum),
    "reducescatter_async": lambda t, n: sync(hvd.reducescatter_async(t, name=n, op=hvd.Sum)),
    "grouped_allreduce": grouped(hvd.grouped_allreduce),
    "grouped_allreduce_": grouped(hvd.grouped_allreduce_),
    "grouped_allreduce_async": grouped(lambda ts, name: sync(hvd.grouped_allreduce_async(
        ts, name=name))),
    "grouped_allreduce_async_": grouped(lambda ts, name: sync(hvd.grouped_allreduce_async_(
        ts, name=name))),
    "grouped_allgather": grouped(hvd.grouped_allgather),
    "grouped_allgather_async": grouped(lambda ts, name: sync(hvd.grouped_allgather_async(
        ts, name=name))),
    "grouped_reducescatter": grouped(lambda ts, name: hvd.grouped_reducescatter(
        ts, name=name, op=hvd.Sum)),
    "grouped_reducescatter_async": grouped(lambda ts, name: sync(
        hvd.grouped_reducescatter_async(ts, name=name, op=hvd.Sum))),
}


class OnXpu(torch.Tensor):
    """A CPU tensor that says it is on an XPU: as a tensor of a device other than the CPU and
    CUDA (xpu, mps) looks to the torch layer, whose pointer the core must never read."""

    @property
    def is_cpu(self):
        return False

    @property
    def device(self):
        return torch.device("xpu", 0)


class NoStorage(torch.Tensor):
    """A tensor that says it is on the CPU but has no storage (its data pointer is null), as
    tensor subclasses made with _make_wrapper_subclass are; it supports no operation."""

    @staticmethod
    def __new__(cls, *shape):
        return torch.Tensor._make_wrapper_subclass(cls, shape, dtype=torch.float32)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise NotImplementedError(f"NoStorage: {func}")


# The core refuses a null pointer with elements (the synchronous in-place allreduce hands it the
# pointer as it is); a grouped call checks every member before it queues the first.
check(NoStorage(3).is_cpu and NoStorage(3).data_ptr() == 0, "NoStorage is no longer one")
expect(ValueError, lambda: hvd.allreduce_(NoStorage(ROWS, 3), name="nostorage"), "'nostorage'",
       "no data", "null")
grouped_in_place = COLLECTIVES["grouped_allreduce_"]
expect(ValueError, lambda: grouped_in_place(NoStorage(ROWS, 3), "nostorage.group"),
       "'nostorage.group.1'", "no data")
grouped_in_place(torch.ones(ROWS, 3), "nostorage.group")
works("nostorage")

too_long = "n" * (MAX_NAME_BYTES + 1)
for kind, run in COLLECTIVES.items():
    meta = torch.empty(ROWS, 3, device="meta")
    expect(ValueError, lambda: run(meta, f"{kind}.meta"), f"{kind}.meta", "'meta' device")
    xpu = torch.ones(ROWS, 3).as_subclass(OnXpu)
    expect(ValueError, lambda: run(xpu, f"{kind}.xpu"), f"{kind}.xpu", "'xpu' device")
    expect(ValueError, lambda: run(torch.ones(ROWS, 3), too_long), "bytes long",
           str(MAX_NAME_BYTES))
    # Nothing of the refused calls was queued: the same names run now, on every rank.
    run(torch.ones(ROWS, 3), f"{kind}.meta")
    run(torch.ones(ROWS, 3), f"{kind}.xpu")
    works(kind)

# Names count in UTF-8 bytes; one of exactly the limit travels, and so does the error of a
# mismatch under it (which quotes the name: its middle is cut, its end still says what differed).
expect(ValueError, lambda: hvd.allreduce(torch.ones(2), name="é" * (MAX_NAME_BYTES // 2) + "x"),
       str(MAX_NAME_BYTES + 1))
longest = "L" * MAX_NAME_BYTES
out = hvd.allreduce(torch.ones(2), name=longest, op=hvd.Sum)
check(out.tolist() == [float(size)] * 2, f"allreduce under a {MAX_NAME_BYTES}-byte name: {out}")
expect(hvd.TensorMismatchError, lambda: hvd.allreduce(torch.ones(2 + rank), name=longest),
       "LLL [...] LLL", "rank 0: [2]; rank 1: [3]")
works("longest.name")
# The NumPy layer (under TensorFlow's) checks names before the core.
expect(ValueError, lambda: numpy_ops.allreduce(np.ones(3), too_long), str(MAX_NAME_BYTES))

# The core itself refuses a null pointer with elements, for any caller, naming the tensor.
f32 = DTYPES["float32"]
buffer = np.ones(4, dtype=np.float32)
expect(ValueError, lambda: _core.enqueue(ALLREDUCE, "null.input", 0, buffer.ctypes.data, f32,
                                         [4]), "'null.input'", "input", "null", "meta")
expect(ValueError, lambda: _core.enqueue(BROADCAST, "null.output", buffer.ctypes.data, 0, f32,
                                         [4]), "'null.output'", "output", "null")
expect(ValueError, lambda: _core.enqueue(ALLGATHER, "null.gather", 0, 0, f32, [2, 2]),
       "'null.gather'", "null")
expect(ValueError, lambda: _core.run(ALLREDUCE, "null.run", 0, 0, f32, [4], Sum, 1.0, 1.0, 0,
                                     -1, 0), "'null.run'", "null")
expect(ValueError, lambda: _core.enqueue(ALLREDUCE, too_long, buffer.ctypes.data,
                                         buffer.ctypes.data, f32, [4]), str(MAX_NAME_BYTES))
# No elements, no data needed.
check(_core.run(ALLREDUCE, "null.empty", 0, 0, f32, [0, 3], Sum, 1.0, 1.0, 0, -1, 0) is None,
      "an allreduce of no elements failed")
works("null.pointers")

# Process sets: ranks outside the job raise on the caller, before anything is sent.
expect(ValueError, lambda: hvd.add_process_set([-1, 0]), "[-1, 0]", "rank -1 is outside",
       f"ranks 0 to {size - 1}")
expect(ValueError, lambda: hvd.add_process_set([0, size]), f"rank {size} is outside")
expect(ValueError, lambda: hvd.add_process_set([0, 0]), "rank 0 is listed twice")
expect(ValueError, lambda: hvd.add_process_set([]), "needs a rank")
expect(ValueError, lambda: _core.enqueue_control(ADD_PROCESS_SET, "ctl.negative", ranks=[-1, 0]),
       "rank -1 is outside")
check(_core.process_set_ids() == [0], f"a refused set was added: {_core.process_set_ids()}")
works("process.sets")
last = hvd.add_process_set([size - 1])
if rank == size - 1:
    out = hvd.allreduce(torch.tensor([7.0]), op=hvd.Sum, name="last", process_set=last)
    check(out.item() == 7.0, f"allreduce on the added set wrong: {out}")
check(hvd.remove_process_set(last), "the added set was not removed")
works("end")
print(f"rank {rank}: input checks OK", flush=True)
