"""The stand-in CUDA runtime and NCCL (tests/gpu_standins) on their own: stream ordering, the
memory table's copy checks, and NCCL between real processes, every result checked against
NumPy. The NCCL ranks are this file run as a script (`--worker SCENARIO RANK NRANKS DIR LIBS`);
rank 0 passes the unique id to the others through a file."""

import json
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from gpu_standins import build as standin_build  # noqa: E402
from gpu_standins.device import (CudaError, NcclError, StandinCuda, StandinNccl,  # noqa: E402
                                 from_bfloat16, to_bfloat16)

H2H, H2D, D2H, D2D, DEFAULT = 0, 1, 2, 3, 4
NOT_READY = 600
NON_BLOCKING = 1

# ------------------------------------------------------------------------------------------------
# Inputs and expected results (both sides)

DTYPES = ["float32", "float16", "bfloat16", "int32", "int64"]
INTS = {"int32", "int64"}
OPS = ["sum", "avg", "min", "max", "prod", "premul"]
RAW = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16,
       "int32": np.int32, "int64": np.int64}
COUNT = 37
PREMUL = {"float": [0.75, 1.5, -2.25, 3.0], "int": [3, -2, 5, 7]}


def make_input(dtype, rank, count, tag, small=False):
    """The deterministic input of one rank for one case (raw storage: bfloat16 as uint16)."""
    rng = np.random.default_rng([zlib.crc32(f"{dtype}/{tag}".encode()), rank])
    if dtype in INTS:
        bound = 4 if small else 1000
        return rng.integers(-bound + 1, bound, count).astype(RAW[dtype])
    values = rng.uniform(0.5, 1.5, count) if small else rng.standard_normal(count) * 8
    values = values.astype(np.float32)
    return to_bfloat16(values) if dtype == "bfloat16" else values.astype(RAW[dtype])


def premul_scalar(dtype, rank):
    return PREMUL["int" if dtype in INTS else "float"][rank]


def _raw_scalar(dtype, value):
    if dtype == "bfloat16":
        return to_bfloat16(np.float32(value))[()]
    if dtype == "float16":
        return np.float16(np.float32(value))
    return RAW[dtype](value)


def _apply(dtype, fn, a, b):
    """fn elementwise in the type's arithmetic (bfloat16: in float32, rounded back)."""
    with np.errstate(all="ignore"):
        if dtype == "bfloat16":
            return to_bfloat16(fn(from_bfloat16(a), from_bfloat16(b)))
        return fn(a, b).astype(RAW[dtype])


def expected_reduce(dtype, op, inputs):
    """NCCL's reduction in rank order; avg as NCCL does it (floats: a PreMulSum by 1/n in the
    type; integers: the sum divided, rounding toward zero)."""
    n = len(inputs)
    if op == "avg" and dtype in INTS:
        total = expected_reduce(dtype, "sum", inputs)
        return np.where(total < 0, -((-total) // n), total // n).astype(RAW[dtype])
    if op == "avg":
        scalars = [_raw_scalar(dtype, np.float32(1.0 / n))] * n
    elif op == "premul":
        scalars = [_raw_scalar(dtype, premul_scalar(dtype, r)) for r in range(n)]
    else:
        scalars = None

    def pre(r):
        x = inputs[r]
        return x if scalars is None else _apply(dtype, np.multiply, x, np.full_like(x, scalars[r]))

    fn = {"sum": np.add, "avg": np.add, "premul": np.add, "prod": np.multiply,
          "max": np.fmax, "min": np.fmin}[op]
    acc = pre(0)
    for r in range(1, n):
        acc = _apply(dtype, fn, acc, pre(r))
    return acc


# ------------------------------------------------------------------------------------------------
# NCCL between processes: the ranks' side (this file run as a script; no pytest)


class Rank:
    def __init__(self, rank, nranks, folder, libs):
        self.rank, self.nranks, self.folder = rank, nranks, Path(folder)
        self.cuda = StandinCuda(libs["cudart"])
        self.nccl = StandinNccl(libs["nccl"])

    def unique_id(self, name):
        """Rank 0 makes the id and writes it to a file; the others read it."""
        path = self.folder / f"id-{name}"
        if self.rank == 0:
            uid = self.nccl.unique_id()
            tmp = self.folder / f"id-{name}.tmp"
            tmp.write_bytes(uid)
            os.replace(tmp, path)
            return uid
        deadline = time.monotonic() + 30
        while not path.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"no unique id at {path}")
            time.sleep(0.005)
        return path.read_bytes()

    def comm(self, name):
        return self.nccl.init_rank(self.nranks, self.unique_id(name), self.rank)

    def device(self, array):
        ptr = self.cuda.malloc(max(array.nbytes, 1))
        self.cuda.write(ptr, array)
        return ptr

    def mark(self, name):
        (self.folder / f"{name}-{self.rank}").write_text("")

    def wait_marks(self, name):
        deadline = time.monotonic() + 30
        while not all((self.folder / f"{name}-{r}").exists() for r in range(self.nranks)):
            if time.monotonic() > deadline:
                raise TimeoutError(name)
            time.sleep(0.005)


def scenario_collectives(w):
    cu, nc, r, n = w.cuda, w.nccl, w.rank, w.nranks
    cu.set_device(0)
    comm = w.comm("main")
    comm_size, user_rank = nc.count(comm), nc.user_rank(comm)
    s = cu.stream_create(NON_BLOCKING)
    outputs = []  # (key, device pointer, count, raw dtype)

    def output(key, count, dtype, fill=None):
        ptr = cu.malloc(max(count * np.dtype(RAW[dtype]).itemsize, 1))
        if fill is not None:
            cu.write(ptr, np.full(count, fill, RAW[dtype]))
        outputs.append((key, ptr, count, RAW[dtype]))
        return ptr

    def ok(rc):
        assert rc == 0, rc

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
    assert nc.async_error(comm) == 0

    # Calls refused at once (nothing reaches the wire).
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

    # ncclCommSplit: two sub-communicators (rank % 2), keys reversing the order.
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

    # Calls that do not match across ranks: every rank's comm reports ncclInvalidUsage.
    bigger = w.device(np.zeros(16, np.float32))
    ok(nc.all_reduce(bigger, bigger, 4 + 2 * r, "float32", "sum", comm, s))
    mismatch = nc.wait_async_error(comm, 10)
    w.mark("mismatch")  # an early abort would show the others a closed connection instead
    w.wait_marks("mismatch")
    nc.abort(comm)
    cu.stream_synchronize(s)
    return {"out": out, "count": comm_size, "rank": user_rank, "version": nc.version(),
            "errors": errors, "split": split, "mismatch": mismatch}


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


def _blocked_then_released(w, comm, s, destroy=False):
    """Waits for the comm's async error; checks the stream stays blocked until the comm is
    aborted (or destroyed)."""
    cu, nc = w.cuda, w.nccl
    after = cu.event_create()
    late = np.zeros(4, np.float32)
    probe = w.device(np.arange(4, dtype=np.float32))
    cu.launch_read(s, late, probe)
    cu.event_record(after, s)
    start = time.monotonic()
    error = nc.wait_async_error(comm, 15)
    seconds = time.monotonic() - start
    time.sleep(0.3)
    blocked = cu.event_query(after) == NOT_READY and not late.any()
    (nc.destroy if destroy else nc.abort)(comm)
    released = cu.wait_event(after, timeout=10)
    cu.stream_synchronize(s)
    return {"error": error, "seconds": seconds, "blocked": blocked, "released": released,
            "read_after": bool(np.array_equal(late, np.arange(4, dtype=np.float32)))}


def scenario_fail_after(w):
    cu, nc, r = w.cuda, w.nccl, w.rank
    comm = w.comm("fa")
    s = cu.stream_create(NON_BLOCKING)
    x = make_input("float32", r, 8, "fa")
    d, out = w.device(x), cu.malloc(x.nbytes)
    assert nc.all_reduce(d, out, 8, "float32", "sum", comm, s) == 0  # the 1st: fine
    cu.stream_synchronize(s)
    first = cu.read(out, x.nbytes, np.float32)
    assert nc.all_reduce(d, out, 8, "float32", "sum", comm, s) == 0  # the 2nd: fails on rank 0
    # Rank 0 aborts; rank 1, which sees rank 0's connections close, destroys its comm.
    res = _blocked_then_released(w, comm, s, destroy=r == 1)
    res["first"] = first
    return res


def scenario_killed(w):
    cu, nc, r = w.cuda, w.nccl, w.rank
    comm = w.comm("kill")
    s = cu.stream_create(NON_BLOCKING)
    x = np.arange(1 << 16, dtype=np.float32)
    d, out = w.device(x), cu.malloc(x.nbytes)
    assert nc.all_reduce(d, out, x.size, "float32", "sum", comm, s) == 0
    cu.stream_synchronize(s)
    if r == 1:
        # Keeps its stream busy so it never joins the second allreduce; killed meanwhile.
        cu.launch_fill(s, d, x, delay_ms=30000)
        assert nc.all_reduce(d, out, x.size, "float32", "sum", comm, s) == 0
        w.mark("ready")
        time.sleep(60)
        raise SystemExit("rank 1 was not killed")
    assert nc.all_reduce(d, out, x.size, "float32", "sum", comm, s) == 0
    w.mark("ready")
    return _blocked_then_released(w, comm, s)


SCENARIOS = {"collectives": scenario_collectives, "single": scenario_single,
             "fail_after": scenario_fail_after, "killed": scenario_killed}


def _worker_main(argv):
    scenario, rank, nranks, folder, libs = argv
    signal.alarm(120)  # a hung rank ends instead of hanging the test
    w = Rank(int(rank), int(nranks), folder, json.loads(libs))
    result = SCENARIOS[scenario](w)
    path = Path(folder) / f"result-{rank}.pkl"
    with open(f"{path}.tmp", "wb") as f:
        pickle.dump(result, f)
    os.replace(f"{path}.tmp", path)


if __name__ == "__main__" and sys.argv[1:2] == ["--worker"]:
    _worker_main(sys.argv[2:])
    sys.exit(0)

# ------------------------------------------------------------------------------------------------
# The tests (pytest is imported here so that the ranks, run as scripts, start faster)

import pytest  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which(os.environ.get("CC") or "gcc") is None,
                                reason="needs gcc to build the stand-ins")


@pytest.fixture(scope="module")
def libs():
    return standin_build.build()


@pytest.fixture(scope="module")
def cuda(libs):
    return StandinCuda(libs["cudart"])


def _lines(cuda, *patterns):
    """The log's lines matching any of the regular expressions, as (seq, text)."""
    found = []
    for line in cuda.log():
        seq, text = line.split(" ", 1)
        if any(re.fullmatch(p, text) for p in patterns):
            found.append((int(seq), text))
    return found


def _seq(cuda, pattern):
    hits = _lines(cuda, pattern)
    assert len(hits) == 1, (pattern, cuda.log())
    return hits[0][0]


# ------------------------------------------------------------------------------------------------
# In this process: the build, the CUDA runtime, one-rank NCCL


def test_build_is_cached_and_complete(libs):
    assert standin_build.build() == libs
    for key in ("cudart", "nccl", "nccl_omit_allgather"):
        assert Path(libs[key]).is_file()
    assert Path(libs["nccl_omit_allgather"]).parent.name == "omit_allgather"
    assert Path(libs["nccl_omit_allgather"]).name == "libnccl.so.2"


def test_concurrent_builds_share_one_folder(tmp_path, monkeypatch):
    """Callers at once: one compiles (in a temporary folder renamed into place), the others
    wait and reuse it. The compiler is faked here; the `libs` fixture runs the real one."""
    import tempfile
    import threading
    compiled = []

    def fake_compile(folder, key):
        compiled.append(folder)
        time.sleep(0.2)
        (Path(folder) / standin_build.OMIT_DIR).mkdir()
        for name in ("libcudart.so.12", "libnccl.so.2", "omit_allgather/libnccl.so.2"):
            (Path(folder) / name).write_text("")
        (Path(folder) / standin_build.STAMP).write_text(key)

    monkeypatch.setattr(standin_build, "_compile_into", fake_compile)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    for out_dir in (None, tmp_path / "explicit"):
        compiled.clear()
        results = []
        threads = [threading.Thread(target=lambda: results.append(standin_build.build(out_dir)))
                   for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert len(results) == 4 and all(r == results[0] for r in results)
        assert len(compiled) == 1 and Path(compiled[0]) != Path(results[0]["dir"])
        folder = Path(results[0]["dir"])
        assert all(Path(results[0][k]).is_file()
                   for k in ("cudart", "nccl", "nccl_omit_allgather"))
        for place in (folder, folder.parent):  # no temporary folder left behind
            assert not [p.name for p in place.iterdir() if p.name.startswith(".") and p.is_dir()]
        if out_dir is None:
            assert folder.parent.parent == tmp_path
        assert standin_build.build(out_dir) == results[0] and len(compiled) == 1


def test_nccl_half_and_bfloat16_round_like_numpy(libs, cuda):
    """PreMulSum on every 16-bit pattern (one rank: x * scalar), against NumPy's float16 and
    float32-then-round bfloat16, including subnormals, overflow and underflow."""
    nc = StandinNccl(libs["nccl"])
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


def test_nccl_group_across_streams_waits_for_each(libs, cuda):
    """A group's ops run together after the work queued on each of their streams, and each
    stream continues after the group."""
    cuda.log_clear()
    nc = StandinNccl(libs["nccl"])
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
    assert _lines(cuda, f"run stream={cuda.stream_id(a)} host_func")
    nc.destroy(comm)


def test_omit_allgather_variant(libs, cuda):
    import ctypes
    lib = ctypes.CDLL(libs["nccl_omit_allgather"])
    assert not hasattr(lib, "ncclAllGather")
    assert hasattr(lib, "ncclAllReduce") and hasattr(lib, "ncclCommSplit")


def test_device_queries(cuda):
    assert cuda.device_count() == int(os.environ.get("HVDL_STANDIN_CUDA_DEVICES") or 1)
    assert cuda.get_device() == 0
    assert cuda.pci_bus_id(0) == "0000:01:00.0"
    assert cuda.runtime_version() == 12080 and cuda.driver_version() == 12080
    with pytest.raises(CudaError) as e:
        cuda.set_device(1)
    assert e.value.code == 101
    assert cuda.get_last_error() == 101 and cuda.get_last_error() == 0
    assert cuda.error_string(100) == "no CUDA-capable device is detected"
    assert cuda.error_name(600) == "cudaErrorNotReady"
    assert cuda.error_string(1) == "invalid argument"


def test_delayed_fill_then_copy_on_one_stream(cuda):
    cuda.log_clear()
    s = cuda.stream_create()
    sid = cuda.stream_id(s)
    data = np.arange(64, dtype=np.float32) * 1.5
    d = cuda.malloc(data.nbytes)
    out = np.zeros_like(data)
    start = time.monotonic()
    cuda.launch_fill(s, d, data, delay_ms=200)
    cuda.memcpy_async(out.ctypes.data, d, data.nbytes, D2H, s)
    assert time.monotonic() - start < 0.15  # asynchronous
    cuda.stream_synchronize(s)
    np.testing.assert_array_equal(out, data)
    fill = _seq(cuda, f"run stream={sid} fill dst=0x{d:x} n=256")
    copy = _seq(cuda, f"run stream={sid} memcpy kind=2 dst=0x{out.ctypes.data:x} src=0x{d:x} n=256")
    sync = _seq(cuda, f"call stream_synchronize stream={sid}")
    assert fill < copy and sync < copy
    cuda.stream_destroy(s)
    cuda.free(d)


def test_cross_stream_wait_on_event(cuda):
    cuda.log_clear()
    s1, s2 = cuda.stream_create(NON_BLOCKING), cuda.stream_create(NON_BLOCKING)
    sid1, sid2 = cuda.stream_id(s1), cuda.stream_id(s2)
    assert 0 < sid1 < sid2
    e = cuda.event_create()
    eid = cuda.event_id(e)
    assert eid >= 1
    assert cuda.event_query(e) == 0  # never recorded
    data = np.arange(32, dtype=np.int64) - 7
    d1, d2 = cuda.malloc(data.nbytes), cuda.malloc(data.nbytes)
    out = np.zeros_like(data)
    cuda.launch_fill(s1, d1, data, delay_ms=250)
    cuda.event_record(e, s1)
    assert cuda.event_query(e) == NOT_READY
    cuda.stream_wait_event(s2, e)
    cuda.memcpy_async(d2, d1, data.nbytes, D2D, s2)
    cuda.launch_read(s2, out, d2)
    cuda.stream_synchronize(s2)
    np.testing.assert_array_equal(out, data)
    assert cuda.event_query(e) == 0
    fill = _seq(cuda, f"run stream={sid1} fill dst=0x{d1:x} n=256")
    record = _seq(cuda, f"run stream={sid1} record event={eid}")
    wait = _seq(cuda, f"run stream={sid2} wait event={eid} done")
    copy = _seq(cuda, f"run stream={sid2} memcpy kind=3 dst=0x{d2:x} src=0x{d1:x} n=256")
    read = _seq(cuda, f"run stream={sid2} read src=0x{d2:x} n=256")
    call_record = _seq(cuda, f"call event_record stream={sid1} event={eid}")
    call_wait = _seq(cuda, f"call stream_wait stream={sid2} event={eid}")
    assert call_record < call_wait < wait
    assert fill < record < wait < copy < read

    # A wait takes the record current at the call: a later record does not hold it back.
    cuda.event_record(e, s1)
    cuda.stream_wait_event(s2, e)
    cuda.launch_fill(s1, d1, data, delay_ms=600)
    cuda.event_record(e, s1)
    after = cuda.event_create()
    cuda.event_record(after, s2)
    assert cuda.wait_event(after, timeout=0.45)
    assert cuda.event_query(e) == NOT_READY
    cuda.event_synchronize(e)
    assert cuda.event_query(e) == 0
    assert _lines(cuda, f"call event_synchronize event={eid}")

    # A never-recorded event: the call is logged, no wait is queued.
    fresh = cuda.event_create()
    fid = cuda.event_id(fresh)
    cuda.stream_wait_event(s2, fresh)
    cuda.event_synchronize(fresh)
    cuda.stream_synchronize(s2)
    assert _lines(cuda, f"call stream_wait stream={sid2} event={fid}")
    assert not _lines(cuda, f"run stream=\\d+ wait event={fid} done")
    for h in (e, after, fresh):
        cuda.event_destroy(h)
    cuda.free(d1)
    cuda.free(d2)


def test_legacy_default_stream_orders_with_blocking_streams(cuda):
    blocking, free_running = cuda.stream_create(0), cuda.stream_create(NON_BLOCKING)
    data = np.arange(16, dtype=np.float32)
    d = cuda.malloc(data.nbytes)
    out = np.zeros_like(data)
    cuda.launch_fill(blocking, d, data, delay_ms=150)
    cuda.memcpy_async(out.ctypes.data, d, data.nbytes, D2H, 0)  # waits for `blocking`
    cuda.stream_synchronize(0)
    np.testing.assert_array_equal(out, data)
    # A non-blocking stream does not hold the default stream back.
    slow = cuda.event_create()
    cuda.launch_fill(free_running, d, data, delay_ms=500)
    cuda.event_record(slow, free_running)
    quick = cuda.event_create()
    cuda.event_record(quick, 0)
    assert cuda.wait_event(quick, timeout=0.3)
    assert cuda.event_query(slow) == NOT_READY
    # cudaFree waits for the device, as the real one does.
    start = time.monotonic()
    cuda.free(d)
    assert cuda.event_query(slow) == 0 and time.monotonic() - start > 0.1


def test_memcpy_kind_checks(cuda):
    cuda.log_clear()
    d = cuda.malloc(64)
    pinned = cuda.host_alloc(64)
    host = np.zeros(16, dtype=np.float32)
    h = host.ctypes.data
    good = [(d, h, H2D), (d + 8, h, H2D), (h, d, D2H), (h, d + 60, D2H), (d, d + 32, D2D),
            (h, pinned, H2H), (pinned, h, H2H), (d, pinned, H2D), (pinned, d, D2H),
            (d, d, DEFAULT), (h, pinned, DEFAULT), (d, h, DEFAULT)]
    for dst, src, kind in good:
        cuda.memcpy_async(dst, src, 4, kind, 0)
    cuda.stream_synchronize(0)
    assert len(_lines(cuda, r"run stream=0 memcpy .*")) == len(good)
    cuda.log_clear()
    bad = [(h, h, H2D), (d, d, H2D), (h, pinned, H2D), (d, d, D2H), (h, h, D2H),
           (d, h, D2D), (h, d, D2D), (pinned, d, D2D), (d, h, H2H), (h, d + 4, H2H)]
    for dst, src, kind in bad:
        with pytest.raises(CudaError) as e:
            cuda.memcpy_async(dst, src, 4, kind, 0)
        assert e.value.code == 1, (dst, src, kind)
    with pytest.raises(CudaError) as e:  # runs past the end of the allocation
        cuda.memcpy_async(h, d + 32, 64, D2H, 0)
    assert e.value.code == 1
    with pytest.raises(CudaError) as e:
        cuda.memcpy_async(d, h, 4, 7, 0)
    assert e.value.code == 21
    assert cuda.get_last_error() == 21 and cuda.get_last_error() == 0
    cuda.stream_synchronize(0)
    assert not _lines(cuda, r"run stream=\d+ memcpy .*")  # nothing was queued
    with pytest.raises(CudaError) as e:
        cuda.free(h)
    assert e.value.code == 1
    cuda.free(d)
    cuda.free_host(pinned)


def test_log_format(cuda):
    cuda.log_clear()
    s = cuda.stream_create()
    e = cuda.event_create()
    d = cuda.malloc(16)
    out = np.zeros(4, dtype=np.float32)
    cuda.launch_fill(s, d, np.ones(4, dtype=np.float32))
    cuda.event_record(e, s)
    cuda.stream_wait_event(0, e)
    cuda.memcpy_async(out.ctypes.data, d, 16, D2H, 0)
    cuda.launch_read(0, out, d)
    cuda.stream_synchronize(0)
    cuda.event_synchronize(e)
    line = re.compile(
        r"\d+ (run stream=\d+ (memcpy kind=\d dst=0x[0-9a-f]+ src=0x[0-9a-f]+ n=\d+"
        r"|record event=\d+|wait event=\d+ done|fill dst=0x[0-9a-f]+ n=\d+"
        r"|read src=0x[0-9a-f]+ n=\d+|host_func)"
        r"|call (stream_wait stream=\d+ event=\d+|event_record stream=\d+ event=\d+"
        r"|event_synchronize event=\d+|stream_synchronize stream=\d+))")
    log = cuda.log()
    assert len(log) == 9, log
    assert all(line.fullmatch(x) for x in log), log
    seqs = [int(x.split()[0]) for x in log]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    cuda.free(d)


# ------------------------------------------------------------------------------------------------
# NCCL between processes: the parent's side


def _launch(scenario, nranks, folder, libs, envs=None):
    procs = []
    for rank in range(nranks):
        env = dict(os.environ, NCCL_DEBUG="WARN", PYTHONDONTWRITEBYTECODE="1")
        env.pop("HVDL_STANDIN_NCCL_FAIL_AFTER", None)
        env.pop("HVDL_STANDIN_NCCL_VERSION", None)
        env.pop("HVDL_STANDIN_CUDA_DEVICES", None)
        env.update((envs or {}).get(rank, {}))
        command = [sys.executable, str(Path(__file__).resolve()), "--worker", scenario,
                   str(rank), str(nranks), str(folder), json.dumps(libs)]
        procs.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    return procs


def _finish(procs, folder, timeout=60, expect_dead=()):
    deadline = time.monotonic() + timeout
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=max(1.0, deadline - time.monotonic()))[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    text = "\n".join(f"--- rank {r} (exit {p.returncode}):\n{out}"
                     for r, (p, out) in enumerate(zip(procs, outputs)))
    results = []
    for rank, p in enumerate(procs):
        if rank in expect_dead:
            results.append(None)
            continue
        assert p.returncode == 0, text
        with open(Path(folder) / f"result-{rank}.pkl", "rb") as f:
            results.append(pickle.load(f))
    return results


def _run(scenario, nranks, folder, libs, envs=None, timeout=60):
    return _finish(_launch(scenario, nranks, folder, libs, envs), folder, timeout)


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
def test_nccl_collectives(libs, tmp_path, nranks):
    _check_collectives(_run("collectives", nranks, tmp_path, libs), nranks)


def test_nccl_version_gating_and_no_device(libs, tmp_path):
    envs = {0: {"HVDL_STANDIN_NCCL_VERSION": "20903"},
            1: {"HVDL_STANDIN_NCCL_VERSION": "21700", "HVDL_STANDIN_CUDA_DEVICES": "2"},
            2: {"HVDL_STANDIN_CUDA_DEVICES": "0"}}
    old, mid, none = _run("single", 3, tmp_path, libs, envs)
    assert old == {"version": 20903, "avg": 4, "premul": 5, "split": 5, "sum_ok": True,
                   "avg_int_ok": None}
    assert mid["version"] == 21700
    assert mid["avg"] == 0 and mid["premul"] == 0 and mid["split"] == 5 and mid["sum_ok"]
    assert mid["avg_int_ok"] is True
    assert mid["devices"] == 2 and mid["bus1"] == "0000:02:00.0" and mid["set2"] == 101
    assert mid["device_after_set1"] == 1
    assert none == {"count_rc": 100, "count": 0, "message": "no CUDA-capable device is detected",
                    "malloc": 100, "stream": 100, "set_device": 100, "init": 1}


def test_nccl_fail_after_blocks_stream_until_abort(libs, tmp_path):
    envs = {0: {"HVDL_STANDIN_NCCL_FAIL_AFTER": "2"}}
    first, second = _run("fail_after", 2, tmp_path, libs, envs)
    want = expected_reduce("float32", "sum", [make_input("float32", r, 8, "fa") for r in (0, 1)])
    for res in (first, second):
        np.testing.assert_array_equal(res["first"], want)
        assert res["blocked"] is True and res["released"] is True
        assert res["read_after"] is True
    assert first["error"] == 2
    assert second["error"] == 6  # the failing rank aborted: its connections closed


def test_nccl_peer_killed_mid_collective(libs, tmp_path):
    procs = _launch("killed", 2, tmp_path, libs)
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"ready-{r}").exists() for r in (0, 1)):
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            break
        time.sleep(0.02)
    time.sleep(0.2)
    procs[1].send_signal(signal.SIGKILL)
    survivor, _ = _finish(procs, tmp_path, expect_dead=(1,))
    assert procs[1].returncode == -signal.SIGKILL
    assert survivor["error"] == 6
    assert survivor["seconds"] < 5.0
    assert survivor["blocked"] is True and survivor["released"] is True


