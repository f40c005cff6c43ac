"""The stand-in NCCL (tests/gpu_standins) on its own, every result checked against NumPy: in
this process (one rank: 16-bit rounding, groups across streams, the variant without
ncclAllGather), and between real processes (every collective, dtype and op; refused calls;
ncclCommSplit; mismatched calls; version gating). The ranks are this file run as a script
(gpu_standins/testing.py: worker_main)."""

import os
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from gpu_standins.device import (CudaError, NcclError, StandinNccl,  # noqa: E402
                                 from_bfloat16, to_bfloat16)
from gpu_standins.testing import (COUNT, DTYPES, NON_BLOCKING, OPS,  # noqa: E402
                                  RAW, expected_reduce, lines, make_input, premul_scalar, run,
                                  worker_main)

# ------------------------------------------------------------------------------------------------
# The ranks' side (this file run as a script; no pytest)


def ok(rc):
    assert rc == 0, rc


def scenario_collectives(w):
    cu, nc = w.cuda, w.nccl
    cu.set_device(0)
    comm = w.comm("main")
    comm_size, user_rank = nc.count(comm), nc.user_rank(comm)
    s = cu.stream_create(NON_BLOCKING)
    out = _collective_outputs(w, comm, s)
    assert nc.async_error(comm) == 0
    errors = _refused_calls(w, comm, s)
    split = _split_communicators(w, comm, s)
    mismatch = _mismatched_call(w, comm, s)
    return {"out": out, "count": comm_size, "rank": user_rank, "version": nc.version(),
            "errors": errors, "split": split, "mismatch": mismatch}


def _collective_outputs(w, comm, s):
    """Every collective on comm, queued on s; returns each output by key."""
    cu, nc, r, n = w.cuda, w.nccl, w.rank, w.nranks
    outputs = []  # (key, device pointer, count, raw dtype)

    def output(key, count, dtype, fill=None):
        ptr = cu.malloc(max(count * np.dtype(RAW[dtype]).itemsize, 1))
        if fill is not None:
            cu.write(ptr, np.full(count, fill, RAW[dtype]))
        outputs.append((key, ptr, count, RAW[dtype]))
        return ptr

    for dtype in DTYPES:
        for op in OPS:
            x = make_input(dtype, r, COUNT, op, small=op == "prod")
            send, recv = w.device(x), output(("allreduce", dtype, op), COUNT, dtype)
            if op == "premul":
                user_op = nc.premul_sum(premul_scalar(dtype, r), dtype, comm)
                ok(nc.all_reduce(send, recv, COUNT, dtype, user_op, comm, s))
                nc.op_destroy(user_op, comm)  # allowed once the call has returned
            else:
                ok(nc.all_reduce(send, recv, COUNT, dtype, op, comm, s))
    buf = w.device(make_input("float32", r, COUNT, "inplace"))
    outputs.append(("inplace", buf, COUNT, np.float32))
    ok(nc.all_reduce(buf, buf, COUNT, "float32", "sum", comm, s))
    scalar = w.device(np.array([2.5 + r], np.float32))
    user_op = nc.premul_sum(scalar, "float32", comm, residence=0)
    ok(nc.all_reduce(w.device(make_input("float32", r, COUNT, "devscalar")),
                     output("devscalar", COUNT, "float32"), COUNT, "float32", user_op, comm, s))
    ok(nc.group_start())
    ok(nc.all_reduce(w.device(make_input("float32", r, 9, "group_a")),
                     output("group_a", 9, "float32"), 9, "float32", "sum", comm, s))
    ok(nc.all_reduce(w.device(make_input("int64", r, 13, "group_b")),
                     output("group_b", 13, "int64"), 13, "int64", "max", comm, s))
    ok(nc.group_end())
    ok(nc.broadcast(w.device(make_input("float32", r, 11, "bcast")),
                    output("bcast", 11, "float32"), 11, "float32", n - 1, comm, s))
    buf = w.device(make_input("int64", r, 7, "bcast2"))
    outputs.append(("bcast_inplace", buf, 7, np.int64))
    ok(nc.broadcast(buf, buf, 7, "int64", 0, comm, s))
    ok(nc.reduce(w.device(make_input("float32", r, 10, "reduce")),
                 output("reduce", 10, "float32", fill=-7.0), 10, "float32", "sum", 1 % n, comm, s))
    ok(nc.reduce(w.device(make_input("int32", r, 6, "reduce2")),
                 output("reduce_max", 6, "int32"), 6, "int32", "max", 0, comm, s))
    ok(nc.all_gather(w.device(make_input("float32", r, 5, "ag")),
                     output("allgather", 5 * n, "float32"), 5, "float32", comm, s))
    buf = output("allgather_inplace", 3 * n, "int32")
    cu.write(buf + r * 12, make_input("int32", r, 3, "ag2"))
    ok(nc.all_gather(buf + r * 12, buf, 3, "int32", comm, s))
    for key, dtype, op in (("rs", "float32", "sum"), ("rs_bf16", "bfloat16", "sum"),
                           ("rs_i32", "int32", "max"), ("rs_avg", "float16", "avg")):
        ok(nc.reduce_scatter(w.device(make_input(dtype, r, 4 * n, key)),
                             output(key, 4, dtype), 4, dtype, op, comm, s))
    # alltoall with grouped send/recv, to every rank including itself; r sends 1 + r + 2j to j.
    sends = [make_input("float32", r, 1 + r + 2 * j, f"a2a-{j}") for j in range(n)]
    send_buf = w.device(np.concatenate(sends))
    recv_counts = [1 + j + 2 * r for j in range(n)]
    recv_buf = output("alltoall", sum(recv_counts), "float32")
    ok(nc.group_start())
    soff = roff = 0
    for j in range(n):
        ok(nc.send(send_buf + soff * 4, len(sends[j]), "float32", j, comm, s))
        ok(nc.recv(recv_buf + roff * 4, recv_counts[j], "float32", j, comm, s))
        soff += len(sends[j])
        roff += recv_counts[j]
    ok(nc.group_end())
    cu.stream_synchronize(s)
    out = {key: cu.read(ptr, count * np.dtype(dt).itemsize, dt) for key, ptr, count, dt in outputs}
    return out


def _refused_calls(w, comm, s):
    """Calls refused at once (nothing reaches the wire): their result codes."""
    nc, n = w.nccl, w.nranks
    d = w.device(np.zeros(8, np.float32))
    host = np.zeros(8, np.float32)
    gone = nc.premul_sum(2.0, "float32", comm)
    nc.op_destroy(gone, comm)
    errors = {
        "dtype": nc.all_reduce(d, d, 8, 42, "sum", comm, s),
        "op": nc.all_reduce(d, d, 8, "float32", 99, comm, s),
        "root": nc.broadcast(d, d, 8, "float32", n, comm, s),
        "peer": nc.send(d, 8, "float32", -1, comm, s),
        "host_pointer": nc.all_reduce(host.ctypes.data, d, 8, "float32", "sum", comm, s),
        "past_end": nc.all_reduce(d, d, 9, "float32", "sum", comm, s),
        "null_comm": nc.all_reduce(d, d, 8, "float32", "sum", 0, s),
        "destroyed_op": nc.all_reduce(d, d, 8, "float32", gone, comm, s),
        "group_end_alone": nc.group_end(),
    }
    try:
        nc.op_destroy(0, comm)
    except NcclError as e:
        errors["builtin_op_destroy"] = e.code
    nc.group_start()
    errors["group_with_error"] = (nc.all_reduce(d, d, 8, "float32", "sum", comm, s),
                                  nc.all_reduce(d, d, 8, 42, "sum", comm, s), nc.group_end())
    return errors


def _split_communicators(w, comm, s):
    """ncclCommSplit: two sub-communicators (rank % 2), keys reversing the order, and one of
    ranks 0 and 1 only (the others pass no color)."""
    cu, nc, r = w.cuda, w.nccl, w.rank
    split = {}
    sub = nc.split(comm, r % 2, -r)
    split["count"], split["rank"] = nc.count(sub), nc.user_rank(sub)
    gather = cu.malloc(4 * split["count"])
    total = cu.malloc(6 * 4)
    ok(nc.all_gather(w.device(np.array([r], np.int32)), gather, 1, "int32", sub, s))
    ok(nc.all_reduce(w.device(np.arange(6, dtype=np.float32) * (r + 1)), total, 6, "float32",
                     "sum", sub, s))
    other = nc.split(comm, 0 if r < 2 else -1, r)
    if other:
        nocolor = cu.malloc(12)
        ok(nc.all_reduce(w.device(np.full(3, r, np.int32)), nocolor, 3, "int32", "max", other, s))
    cu.stream_synchronize(s)
    split["gather"] = cu.read(gather, 4 * split["count"], np.int32)
    split["sum"] = cu.read(total, 24, np.float32)
    if other:
        split["nocolor_max"] = cu.read(nocolor, 12, np.int32)
        nc.destroy(other)
    else:
        split["nocolor_comm"] = other
    nc.destroy(sub)
    return split


def _mismatched_call(w, comm, s):
    """Calls that do not match across ranks: every rank's comm reports ncclInvalidUsage."""
    cu, nc, r = w.cuda, w.nccl, w.rank
    bigger = w.device(np.zeros(16, np.float32))
    ok(nc.all_reduce(bigger, bigger, 4 + 2 * r, "float32", "sum", comm, s))
    mismatch = nc.wait_async_error(comm, 10)
    w.mark("mismatch")  # an early abort would show the others a closed connection instead
    w.wait_marks("mismatch")
    nc.abort(comm)
    cu.stream_synchronize(s)
    return mismatch


def scenario_single(w):
    """One-rank communicators in processes with different settings."""
    cu, nc = w.cuda, w.nccl
    if os.environ.get("HVDL_STANDIN_CUDA_DEVICES") == "0":
        import ctypes
        count = ctypes.c_int(-1)
        rc = cu.lib.cudaGetDeviceCount(ctypes.byref(count))
        res = {"count_rc": rc, "count": count.value, "message": cu.error_string(rc)}
        for key, call in (("malloc", lambda: cu.malloc(16)), ("stream", cu.stream_create),
                          ("set_device", lambda: cu.set_device(0))):
            try:
                call()
                res[key] = 0
            except CudaError as e:
                res[key] = e.code
        try:
            nc.init_rank(1, nc.unique_id(), 0)
            res["init"] = 0
        except NcclError as e:
            res["init"] = e.code
        return res
    res = {"version": nc.version()}
    comm = nc.init_rank(1, nc.unique_id(), 0)
    s = cu.stream_create()
    x = np.arange(5, dtype=np.float32)
    d, out = w.device(x), cu.malloc(x.nbytes)
    res["avg"] = nc.all_reduce(d, out, 5, "float32", "avg", comm, s)
    try:
        nc.op_destroy(nc.premul_sum(2.0, "float32", comm), comm)
        res["premul"] = 0
    except NcclError as e:
        res["premul"] = e.code
    try:
        nc.destroy(nc.split(comm, 0, 0))
        res["split"] = 0
    except NcclError as e:
        res["split"] = e.code
    assert nc.all_reduce(d, out, 5, "float32", "sum", comm, s) == 0
    cu.stream_synchronize(s)
    res["sum_ok"] = bool(np.array_equal(cu.read(out, x.nbytes, np.float32), x))
    res["avg_int_ok"] = None
    if res["avg"] == 0:
        xi = np.array([-7, 7, 3], np.int64)
        di = w.device(xi)
        assert nc.all_reduce(di, di, 3, "int64", "avg", comm, s) == 0
        cu.stream_synchronize(s)
        res["avg_int_ok"] = bool(np.array_equal(cu.read(di, 24, np.int64), xi))
    if os.environ.get("HVDL_STANDIN_CUDA_DEVICES") == "2":
        res["devices"] = cu.device_count()
        res["bus1"] = cu.pci_bus_id(1)
        try:
            cu.set_device(2)
        except CudaError as e:
            res["set2"] = e.code
        cu.set_device(1)
        res["device_after_set1"] = cu.get_device()
    nc.destroy(comm)
    return res


SCENARIOS = {"collectives": scenario_collectives, "single": scenario_single}

if __name__ == "__main__" and sys.argv[1:2] == ["--worker"]:
    worker_main(sys.argv[2:], SCENARIOS)
    sys.exit(0)

# ------------------------------------------------------------------------------------------------
# The tests (pytest is imported here so that the ranks, run as scripts, start faster)

import pytest  # noqa: E402

SCRIPT = Path(__file__).resolve()




# ------------------------------------------------------------------------------------------------
# In this process: one-rank NCCL


def test_nccl_half_and_bfloat16_round_like_numpy(standins, cuda):
    """PreMulSum on every 16-bit pattern (one rank: x * scalar), against NumPy's float16 and
    float32-then-round bfloat16, including subnormals, overflow and underflow."""
    nc = StandinNccl(standins["nccl"])
    comm = nc.init_rank(1, nc.unique_id(), 0)
    s = cuda.stream_create(NON_BLOCKING)
    bits = np.arange(1 << 16, dtype=np.uint16)
    src, dst = cuda.malloc(bits.nbytes), cuda.malloc(bits.nbytes)
    cuda.write(src, bits)
    for scalar in (1.0, 0.1, 3.7, 1e-5, 300.0, -0.33):
        for dtype in ("float16", "bfloat16"):
            op = nc.premul_sum(scalar, dtype, comm)
            assert nc.all_reduce(src, dst, bits.size, dtype, op, comm, s) == 0
            nc.op_destroy(op, comm)
            cuda.stream_synchronize(s)
            got = cuda.read(dst, bits.nbytes, np.uint16)
            with np.errstate(all="ignore"):
                if dtype == "float16":
                    want = bits.view(np.float16) * np.float16(scalar)
                    got_values = got.view(np.float16)
                else:
                    factor = from_bfloat16(to_bfloat16(np.float32(scalar)))
                    want = from_bfloat16(to_bfloat16(from_bfloat16(bits) * factor))
                    got_values = from_bfloat16(got)
            np.testing.assert_array_equal(got_values, want, err_msg=f"{dtype} * {scalar}")
    nc.destroy(comm)
    cuda.free(src)
    cuda.free(dst)


def test_nccl_group_across_streams_waits_for_each(standins, cuda):
    """A group's ops run together after the work queued on each of their streams, and each
    stream continues after the group."""
    cuda.log_clear()
    nc = StandinNccl(standins["nccl"])
    comm = nc.init_rank(1, nc.unique_id(), 0)
    a, b = cuda.stream_create(NON_BLOCKING), cuda.stream_create(NON_BLOCKING)
    x, y = np.arange(8, dtype=np.float32), np.arange(5, dtype=np.int64) * 3
    dx, dy = cuda.malloc(x.nbytes), cuda.malloc(y.nbytes)
    ox, oy = cuda.malloc(x.nbytes), cuda.malloc(y.nbytes)
    cuda.launch_fill(a, dx, x, delay_ms=100)
    cuda.launch_fill(b, dy, y, delay_ms=250)
    assert nc.group_start() == 0
    assert nc.all_reduce(dx, ox, 8, "float32", "sum", comm, a) == 0
    assert nc.all_reduce(dy, oy, 5, "int64", "max", comm, b) == 0
    assert nc.group_end() == 0
    out = np.zeros_like(y)
    cuda.launch_read(b, out, oy)
    cuda.stream_synchronize(b)
    np.testing.assert_array_equal(out, y)
    np.testing.assert_array_equal(cuda.read(ox, x.nbytes, np.float32), x)
    assert lines(cuda, f"run stream={cuda.stream_id(a)} host_func")
    nc.destroy(comm)


def test_omit_allgather_variant(standins, cuda):
    import ctypes
    lib = ctypes.CDLL(standins["nccl_omit_allgather"])
    assert not hasattr(lib, "ncclAllGather")
    assert hasattr(lib, "ncclAllReduce") and hasattr(lib, "ncclCommSplit")


# ------------------------------------------------------------------------------------------------
# Between processes


def _check_collectives(results, n):
    inputs = {}

    def ins(dtype, tag, count, small=False):
        key = (dtype, tag, count, small)
        if key not in inputs:
            inputs[key] = [make_input(dtype, r, count, tag, small) for r in range(n)]
        return inputs[key]

    for rank, res in enumerate(results):
        out = res["out"]
        for dtype in DTYPES:
            for op in OPS:
                want = expected_reduce(dtype, op, ins(dtype, op, COUNT, small=op == "prod"))
                np.testing.assert_array_equal(out[("allreduce", dtype, op)], want,
                                              err_msg=f"rank {rank} {dtype} {op}")
        np.testing.assert_array_equal(out["inplace"], expected_reduce(
            "float32", "sum", ins("float32", "inplace", COUNT)))
        device_scalar = [np.float32(2.5 + r) for r in range(n)]
        x = ins("float32", "devscalar", COUNT)
        want = x[0] * device_scalar[0]
        for r in range(1, n):
            want = want + x[r] * device_scalar[r]
        np.testing.assert_array_equal(out["devscalar"], want)
        np.testing.assert_array_equal(out["group_a"], expected_reduce(
            "float32", "sum", ins("float32", "group_a", 9)))
        np.testing.assert_array_equal(out["group_b"], expected_reduce(
            "int64", "max", ins("int64", "group_b", 13)))
        np.testing.assert_array_equal(out["bcast"], ins("float32", "bcast", 11)[n - 1])
        np.testing.assert_array_equal(out["bcast_inplace"], ins("int64", "bcast2", 7)[0])
        if rank == 1 % n:
            np.testing.assert_array_equal(out["reduce"], expected_reduce(
                "float32", "sum", ins("float32", "reduce", 10)))
        else:
            np.testing.assert_array_equal(out["reduce"], np.full(10, -7.0, np.float32))
        if rank == 0:
            np.testing.assert_array_equal(out["reduce_max"], expected_reduce(
                "int32", "max", ins("int32", "reduce2", 6)))
        np.testing.assert_array_equal(out["allgather"], np.concatenate(
            ins("float32", "ag", 5)))
        np.testing.assert_array_equal(out["allgather_inplace"], np.concatenate(
            ins("int32", "ag2", 3)))
        for key, dtype, op in (("rs", "float32", "sum"), ("rs_bf16", "bfloat16", "sum"),
                               ("rs_i32", "int32", "max"), ("rs_avg", "float16", "avg")):
            chunks = [x[rank * 4:(rank + 1) * 4] for x in ins(dtype, key, 4 * n)]
            np.testing.assert_array_equal(out[key], expected_reduce(dtype, op, chunks),
                                          err_msg=key)
        want = np.concatenate([make_input("float32", j, 1 + j + 2 * rank, f"a2a-{rank}")
                               for j in range(n)])
        np.testing.assert_array_equal(out["alltoall"], want)
        assert res["count"] == n and res["rank"] == rank and res["version"] == 22305
        assert res["errors"] == {"dtype": 4, "op": 4, "root": 4, "peer": 4, "host_pointer": 4,
                                 "past_end": 4, "null_comm": 4, "destroyed_op": 4,
                                 "builtin_op_destroy": 4, "group_end_alone": 5,
                                 "group_with_error": (0, 4, 4)}, res["errors"]
        # ncclCommSplit(color = rank % 2, key = -rank): each color's ranks in reverse order.
        members = [r for r in range(n) if r % 2 == rank % 2][::-1]
        assert res["split"]["count"] == len(members)
        assert res["split"]["rank"] == members.index(rank)
        np.testing.assert_array_equal(res["split"]["gather"], np.array(members, np.int32))
        np.testing.assert_array_equal(res["split"]["sum"], sum(
            np.arange(6, dtype=np.float32) * (r + 1) for r in members))
        if rank < 2:
            np.testing.assert_array_equal(res["split"]["nocolor_max"],
                                          np.full(3, min(n, 2) - 1, np.int32))
        else:
            assert res["split"]["nocolor_comm"] == 0
        assert res["mismatch"] == 5


@pytest.mark.parametrize("nranks", [2, 3])
def test_nccl_collectives(standins, tmp_path, nranks):
    _check_collectives(run(SCRIPT, "collectives", nranks, tmp_path, standins), nranks)


def test_nccl_version_gating_and_no_device(standins, tmp_path):
    envs = {0: {"HVDL_STANDIN_NCCL_VERSION": "20903"},
            1: {"HVDL_STANDIN_NCCL_VERSION": "21700", "HVDL_STANDIN_CUDA_DEVICES": "2"},
            2: {"HVDL_STANDIN_CUDA_DEVICES": "0"}}
    old, mid, none = run(SCRIPT, "single", 3, tmp_path, standins, envs)
    assert old == {"version": 20903, "avg": 4, "premul": 5, "split": 5, "sum_ok": True,
                   "avg_int_ok": None}
    assert mid["version"] == 21700
    assert mid["avg"] == 0 and mid["premul"] == 0 and mid["split"] == 5 and mid["sum_ok"]
    assert mid["avg_int_ok"] is True
    assert mid["devices"] == 2 and mid["bus1"] == "0000:02:00.0" and mid["set2"] == 101
    assert mid["device_after_set1"] == 1
    assert none == {"count_rc": 100, "count": 0, "message": "no CUDA-capable device is detected",
                    "malloc": 100, "stream": 100, "set_device": 100, "init": 1}
