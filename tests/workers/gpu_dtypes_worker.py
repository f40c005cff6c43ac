"""Every dtype Horovod's suites send through every GPU collective, with the shapes they use
(dims 1 to 3 of 17 each; alltoall with uneven splits), on the stand-in CUDA runtime and NCCL.
Each GPU result must equal the same call on host buffers, run through the core right after it
(the CPU path is the reference Horovod's suites already hold the core to), and NumPy where the
result is plain (sums, gathers, broadcasts).

Usage: gpu_dtypes_worker.py nccl|staged"""

import sys

import numpy as np

from gpu_worker import DT, OPS, RED, Gpu, finish, output_on_device
from horovodlike import _core
from horovodlike.common import basics

DTYPES = ("uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64")


def values(dtype, shape, rank, seed):
    rng = np.random.default_rng(1000 * seed + rank)
    return rng.integers(-100 if dtype != "uint8" else 0, 100, shape).astype(dtype)


def host_call(op, name, array, **kw):
    """The same collective on host buffers: (output, integers)."""
    if op in ("allreduce", "broadcast"):
        out = array.copy() if op == "broadcast" else np.zeros_like(array)
        src = out if op == "broadcast" else array
        finish(_core.enqueue(OPS[op], name, src.ctypes.data, out.ctypes.data, DT[str(array.dtype)],
                             list(array.shape), **kw))
        return out, []
    handle = _core.enqueue(OPS[op], name, array.ctypes.data, 0, DT[str(array.dtype)],
                           list(array.shape), **kw)
    finish(handle, release=False)
    raw, shape, integers = _core.output(handle)
    _core.release(handle)
    return np.frombuffer(bytes(raw), dtype=array.dtype).reshape(shape), list(integers)


def device_call(gpu, op, name, array, **kw):
    src = gpu.put(array, delayed=False)
    if op in ("allreduce", "broadcast"):
        dst = src if op == "broadcast" else gpu.put(np.zeros_like(array), delayed=False)
        finish(_core.enqueue(OPS[op], name, src, dst, DT[str(array.dtype)], list(array.shape),
                             device=gpu.device, stream=gpu.stream, **kw))
        return gpu.get(dst, array), []
    handle = _core.enqueue(OPS[op], name, src, 0, DT[str(array.dtype)], list(array.shape),
                           device=gpu.device, stream=gpu.stream, **kw)
    finish(handle, release=False)
    return output_on_device(gpu, handle, array)


def same(gpu, op, name, array, want=None, **kw):
    got, got_ints = device_call(gpu, op, f"{name}.gpu", array, **kw)
    ref, ref_ints = host_call(op, f"{name}.host", array, **kw)
    where = f"rank {basics.rank()}: {op} {name} {array.dtype} {array.shape}"
    assert got.shape == ref.shape and got_ints == ref_ints, \
        f"{where}: GPU gave {got.shape} {got_ints}, the host {ref.shape} {ref_ints}"
    if not np.array_equal(got, ref, equal_nan=True):
        differ = np.flatnonzero(~((got == ref) | (np.isnan(got) & np.isnan(ref)))
                                if got.dtype.kind == "f" else got != ref)
        raise AssertionError(f"{where}: {differ.size} elements differ, the first at flat index "
                             f"{differ[0]}: GPU {got.ravel()[differ[:6]]} != host "
                             f"{ref.ravel()[differ[:6]]}")
    if want is not None:
        assert np.array_equal(got, np.asarray(want, dtype=array.dtype)), \
            f"{where}: {got.ravel()[:6]} != NumPy's {np.asarray(want).ravel()[:6]}"


def main():
    mode = sys.argv[1]
    basics.init()
    rank, size = basics.rank(), basics.size()
    gpu = Gpu(basics.local_rank() if mode == "nccl" else 0)
    count = 0
    for seed, (dtype, dim) in enumerate((d, n) for d in DTYPES for n in (1, 2, 3)):
        shape = (17,) * dim
        inputs = [values(dtype, shape, r, seed) for r in range(size)]
        mine = inputs[rank]
        tag = f"{dtype}.{dim}"
        total = np.sum(np.stack(inputs).astype(np.float64), 0)
        wrapped = total.astype(np.int64).astype(dtype) if dtype.startswith(("int", "uint")) \
            else total.astype(dtype)
        same(gpu, "allreduce", f"sum.{tag}", mine, wrapped, reduce_op=RED["Sum"])
        for op in ("Average", "Min", "Max"):
            same(gpu, "allreduce", f"{op}.{tag}", mine, reduce_op=RED[op])
        same(gpu, "allreduce", f"scaled.{tag}", mine, reduce_op=RED["Sum"], prescale=0.5,
             postscale=2.0)
        same(gpu, "allgather", f"ag.{tag}", mine, np.concatenate(inputs))
        same(gpu, "broadcast", f"bc.{tag}", mine, inputs[size - 1], root_rank=size - 1)
        # Horovod's alltoall test: rank r sends r + 1 rows to every rank.
        rows = np.concatenate([np.full((rank + 1,) + shape[1:], j, dtype=dtype)
                               for j in range(size)])
        same(gpu, "alltoall", f"a2a.{tag}", rows, splits=[rank + 1] * size)
        if dtype != "int8" and dtype != "uint8":
            same(gpu, "reducescatter", f"rs.{tag}", mine, reduce_op=RED["Sum"])
        count += 1
    print(f"rank {rank}: gpu dtypes ok ({mode}, {count} cases, {_core.gpu_mode(0)})", flush=True)
    basics.shutdown()


if __name__ == "__main__":
    main()
