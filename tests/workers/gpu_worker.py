"""Every GPU collective through horovodlike's core, on the stand-in CUDA runtime and NCCL
(tests/gpu_standins/): device buffers are the stand-in's, each input is written by a delayed
"kernel" on the caller's stream just before the collective is enqueued, and every result is
read back through the caller's stream and compared with NumPy.

Usage: gpu_worker.py MODE [REPORT_DIR]
  MODE nccl: each rank on its own GPU (cuda:local_rank); staged: the ranks share GPU 0.
The expected path ("nccl" or "staged: ...") is checked with _core.gpu_mode()."""

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu_standins.device import StandinCuda  # noqa: E402
from horovodlike import _core  # noqa: E402
from horovodlike.common import basics  # noqa: E402
from horovodlike.common.exceptions import raise_for_status  # noqa: E402

import os  # noqa: E402

DT = _core.DTYPES
OPS = _core.OPS
RED = _core.REDUCE_OPS
DELAY_MS = 30  # each input is written this long after the collective is enqueued


class Gpu:
    """The stand-in device seen by one rank: buffers, a caller stream, and its log."""

    def __init__(self, device):
        self.cuda = StandinCuda(os.environ["HOROVOD_CUDART_PATH"])
        self.device = device
        self.stream = self.cuda.stream_create()

    def put(self, array, delayed=True):
        """A device buffer holding `array`, written by a delayed kernel on the caller's stream
        (so the core must wait for the stream, not for the host)."""
        ptr = self.cuda.malloc(max(array.nbytes, 1))
        if delayed:
            self.cuda.write(ptr, np.zeros_like(array))
            self.cuda.launch_fill(self.stream, ptr, array, DELAY_MS)
        else:
            self.cuda.write(ptr, array)
        return ptr

    def get(self, ptr, like, shape=None):
        """`like`'s dtype and shape (or `shape`) read through the caller's stream."""
        shape = like.shape if shape is None else tuple(shape)
        out = np.empty(shape, dtype=like.dtype)
        self.cuda.launch_read(self.stream, out, ptr)
        self.cuda.stream_synchronize(self.stream)
        return out


def np_dtype(name):
    return {"bfloat16": np.float32}.get(name, np.dtype(name))


def data(name, shape, rank, seed=0):
    rng = np.random.default_rng(seed * 100 + rank)
    if name == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    if name in ("float16", "float32", "float64"):
        return rng.integers(-8, 8, shape).astype(name) / 4
    return rng.integers(1, 5, shape).astype(name)


def expected_value(inputs, op, prescale, postscale):
    """NumPy's reduction of every rank's input, scaled as the core does."""
    stacked = np.stack(inputs)
    if stacked.dtype == bool:
        return stacked.any(0) if op in ("Sum", "Max") else stacked.all(0)
    values = stacked.astype(np.float64) * prescale
    result = {"Sum": values.sum, "Average": values.mean, "Min": values.min, "Max": values.max,
              "Product": values.prod}[op](0)
    return result * postscale


def enqueue(gpu, op, name, inp, out, dtype, shape, **kw):
    return _core.enqueue(OPS[op], name, inp, out, DT[dtype], list(shape), device=gpu.device,
                         stream=gpu.stream, **kw)


def finish(handle, release=True):
    code, message = _core.wait(handle)
    if release:
        _core.release(handle)
    if code:
        raise_for_status(code, message)


def check(got, want, what, rtol=1e-3):
    if not np.allclose(got.astype(np.float64), np.asarray(want).astype(np.float64), rtol=rtol,
                       atol=1e-3):
        raise AssertionError(f"{what}: got {got.ravel()[:8]}, want {np.asarray(want).ravel()[:8]}")


def all_inputs(make, size):
    return [make(r) for r in range(size)]


def test_allreduce(gpu, rank, size):
    # Each dtype and op the core reduces; int16 and Min with a scale are staged even over NCCL.
    cases = [("float32", "Sum", 1.0, 1.0), ("float32", "Average", 1.0, 1.0),
             ("float32", "Sum", 0.5, 3.0), ("float32", "Average", 2.0, 1.0),
             ("float64", "Max", 1.0, 1.0), ("float16", "Sum", 1.0, 1.0),
             ("int32", "Product", 1.0, 1.0), ("int64", "Min", 1.0, 1.0),
             ("uint8", "Sum", 1.0, 1.0), ("bool", "Sum", 1.0, 1.0), ("bool", "Min", 1.0, 1.0),
             ("int16", "Sum", 1.0, 1.0), ("float32", "Min", 2.0, 1.0)]
    for i, (dtype, op, pre, post) in enumerate(cases):
        shape = (3, 5)
        inputs = all_inputs(lambda r: data(dtype, shape, r, i), size)
        want = expected_value(inputs, op, pre, post)
        src = gpu.put(inputs[rank])
        dst = gpu.put(np.zeros(shape, dtype), delayed=False)
        finish(enqueue(gpu, "allreduce", f"ar.{i}", src, dst, dtype, shape,
                       reduce_op=RED[op], prescale=pre, postscale=post))
        check(gpu.get(dst, inputs[rank]), want, f"allreduce {dtype} {op} x{pre} x{post}")


def test_fused_allreduce(gpu, rank, size):
    # Several tensors in flight at once: fused through the device's buffer, in place.
    shapes = [(7,), (2, 3), (1,), (64,)]
    inputs = [all_inputs(lambda r: data("float32", s, r, 20 + j), size)
              for j, s in enumerate(shapes)]
    ptrs = [gpu.put(x[rank]) for x in inputs]
    handles = [enqueue(gpu, "allreduce", f"fused.{j}", p, p, "float32", s,
                       reduce_op=RED["Average"])
               for j, (p, s) in enumerate(zip(ptrs, shapes))]
    for h in handles:
        finish(h)
    for j, p in enumerate(ptrs):
        check(gpu.get(p, inputs[j][rank]), np.mean(inputs[j], axis=0), f"fused allreduce {j}")


def test_grouped_allreduce(gpu, rank, size):
    shapes = [(4,), (3, 2)]
    inputs = [all_inputs(lambda r: data("float64", s, r, 30 + j), size)
              for j, s in enumerate(shapes)]
    ptrs = [gpu.put(x[rank]) for x in inputs]
    handles = [enqueue(gpu, "allreduce", f"group.{j}", p, p, "float64", s,
                       reduce_op=RED["Sum"], group_id=77, group_size=2)
               for j, (p, s) in enumerate(zip(ptrs, shapes))]
    for h in handles:
        finish(h)
    for j, p in enumerate(ptrs):
        check(gpu.get(p, inputs[j][rank]), np.sum(inputs[j], axis=0), f"grouped allreduce {j}")


def output_on_device(gpu, handle, like):
    """A core-allocated output, copied to a device buffer through the caller's stream."""
    _bytes, shape, integers = _core.output(handle)
    dst = gpu.cuda.malloc(max(int(np.prod(shape)) * like.itemsize, 1))
    _core.output_to_device(handle, dst, gpu.stream)
    _core.release(handle)
    return gpu.get(dst, like, shape), list(integers)


def test_allgather(gpu, rank, size):
    rows = [r + 1 for r in range(size)]  # uneven
    inputs = all_inputs(lambda r: data("float32", (rows[r], 3), r, 40), size)
    h = enqueue(gpu, "allgather", "ag", gpu.put(inputs[rank]), 0, "float32", inputs[rank].shape)
    finish(h, release=False)
    got, integers = output_on_device(gpu, h, inputs[rank])
    check(got, np.concatenate(inputs), "allgather")
    assert integers == rows, integers
    # Two even ones fused in one group.
    even = [all_inputs(lambda r: data("int32", (2, 2), r, 41 + j), size) for j in range(2)]
    hs = [enqueue(gpu, "allgather", f"agg.{j}", gpu.put(even[j][rank]), 0, "int32", (2, 2),
                  group_id=88, group_size=2) for j in range(2)]
    for j, h in enumerate(hs):
        finish(h, release=False)
        got, _ = output_on_device(gpu, h, even[j][rank])
        check(got, np.concatenate(even[j]), f"grouped allgather {j}")


def test_broadcast(gpu, rank, size):
    root = size - 1
    inputs = all_inputs(lambda r: data("float16", (9,), r, 50), size)
    p = gpu.put(inputs[rank])
    finish(enqueue(gpu, "broadcast", "bc", p, p, "float16", (9,), root_rank=root))
    check(gpu.get(p, inputs[rank]), inputs[root], "broadcast")


def test_alltoall(gpu, rank, size):
    # Rank r sends (r + j) % 3 rows to rank j.
    splits = [[(r + j) % 3 for j in range(size)] for r in range(size)]
    inputs = all_inputs(lambda r: data("int64", (sum(splits[r]), 2), r, 60), size)
    h = enqueue(gpu, "alltoall", "a2a", gpu.put(inputs[rank]), 0, "int64", inputs[rank].shape,
                splits=splits[rank])
    finish(h, release=False)
    got, received = output_on_device(gpu, h, inputs[rank])
    want = []
    for r in range(size):
        start = sum(splits[r][:rank])
        want.append(inputs[r][start:start + splits[r][rank]])
    check(got, np.concatenate(want), "alltoall")
    assert received == [splits[r][rank] for r in range(size)], received


def test_reducescatter(gpu, rank, size):
    rows = 2 * size + 1  # uneven: the first rows % size ranks get one more
    for op in ("Sum", "Average"):
        inputs = all_inputs(lambda r: data("float32", (rows, 2), r, 70), size)
        h = enqueue(gpu, "reducescatter", f"rs.{op}", gpu.put(inputs[rank]), 0, "float32",
                    (rows, 2), reduce_op=RED[op])
        finish(h, release=False)
        got, _ = output_on_device(gpu, h, inputs[rank])
        total = expected_value(inputs, op, 1.0, 1.0)
        counts = [rows // size + (1 if r < rows % size else 0) for r in range(size)]
        start = sum(counts[:rank])
        check(got, total[start:start + counts[rank]], f"reducescatter {op}")


def test_process_set(gpu, rank, size):
    # A set of the even ranks runs its own collective (its own communicator).
    members = list(range(0, size, 2))
    h = _core.enqueue_control(OPS["add_process_set"], "add.evens", members)
    finish(h, release=False)
    set_id = _core.output(h)[2][0]
    _core.release(h)
    if rank in members:
        inputs = all_inputs(lambda r: data("float32", (6,), r, 80), size)
        p = gpu.put(inputs[rank])
        finish(_core.enqueue(OPS["allreduce"], "evens", p, p, DT["float32"], [6],
                             reduce_op=RED["Sum"], device=gpu.device, stream=gpu.stream,
                             process_set=set_id))
        check(gpu.get(p, inputs[rank]), sum(inputs[r] for r in members), "process set")
    return set_id


def test_stream_order(gpu, rank):
    """From the stand-in's log: the core's work on the input ran after the caller's delayed
    write, and the caller's stream waited for the core's completion event."""
    x = np.full((4,), rank + 1.0, np.float32)
    gpu.cuda.log_clear()
    p = gpu.put(x)
    finish(enqueue(gpu, "allreduce", "order", p, p, "float32", (4,), reduce_op=RED["Sum"]))
    log = gpu.cuda.log()
    caller = gpu.cuda.stream_id(gpu.stream)
    fill_done = [int(line.split()[0]) for line in log if f"stream={caller} fill" in line]
    assert fill_done, log
    core_work = [int(line.split()[0]) for line in log
                 if " run " in line and f"stream={caller} " not in line
                 and ("memcpy" in line or "host_func" in line)]
    assert core_work and min(core_work) > fill_done[0], \
        f"the core touched the input before the caller's kernel wrote it:\n" + "\n".join(log)
    waits = [line for line in log if f"call stream_wait stream={caller} " in line]
    assert waits, "the caller's stream never waited for the core:\n" + "\n".join(log)


def main():
    mode = sys.argv[1]
    report = Path(sys.argv[2]) if len(sys.argv) > 2 else None
    basics.init()
    rank, size = basics.rank(), basics.size()
    gpu = Gpu(basics.local_rank() if mode == "nccl" else 0)
    started = time.time()
    test_allreduce(gpu, rank, size)
    test_fused_allreduce(gpu, rank, size)
    test_grouped_allreduce(gpu, rank, size)
    test_allgather(gpu, rank, size)
    test_broadcast(gpu, rank, size)
    test_alltoall(gpu, rank, size)
    test_reducescatter(gpu, rank, size)
    set_id = test_process_set(gpu, rank, size)
    test_stream_order(gpu, rank)
    path = _core.gpu_mode(0)
    expect = "nccl" if mode == "nccl" else "staged"
    assert path is not None and path.startswith(expect), path
    runs = basics._runtime_stats()["provider_runs"]
    if mode == "nccl":
        assert runs.get("NCCL_ALLREDUCE", 0) > 0 and runs.get("NCCL_ALLTOALL", 0) > 0, runs
        # int16 and Min with a scale: NCCL cannot, so those went through host memory.
        assert runs.get("CUDA_HOST_STAGING", 0) >= 2, runs
        if rank % 2 == 0:
            assert _core.gpu_mode(set_id) == "nccl", _core.gpu_mode(set_id)
    else:
        # Only the process set's allreduce may use NCCL (a set of one rank has its GPU alone).
        assert not any(k.startswith("NCCL_") and k != "NCCL_ALLREDUCE" for k in runs), runs
        assert runs.get("NCCL_ALLREDUCE", 0) <= 1, runs
    if report:
        (report / f"rank{rank}.txt").write_text(f"{path}\n{sorted(runs.items())}\n")
    print(f"rank {rank}: gpu {mode} ok in {time.time() - started:.1f}s ({path})", flush=True)
    basics.shutdown()


if __name__ == "__main__":
    main()
