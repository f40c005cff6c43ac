"""What the stand-ins' tests share (tests/test_gpu_standins_*.py): deterministic inputs and the
results NCCL should give, computed with NumPy; the ranks' side of a multi-process test (Rank,
worker_main: a test file run as a script, `--worker SCENARIO RANK NRANKS DIR LIBS`, rank 0
passing the unique id to the others through a file); the parent's side (launch, finish, run);
and reading the stand-in runtime's log. No pytest here, so that the ranks start fast."""

import json
import os
import pickle
import re
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path

import numpy as np

from .device import StandinCuda, StandinNccl, from_bfloat16, to_bfloat16

H2H, H2D, D2H, D2D, DEFAULT = 0, 1, 2, 3, 4
NOT_READY = 600
NON_BLOCKING = 1
# The stand-ins are built by the tests: without a compiler they are skipped.

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
# NCCL between processes: the ranks' side (a test file run as a script)


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


def worker_main(argv, scenarios):
    """A rank: runs scenarios[SCENARIO] and leaves its result in DIR/result-RANK.pkl."""
    scenario, rank, nranks, folder, libs = argv
    signal.alarm(120)  # a hung rank ends instead of hanging the test
    w = Rank(int(rank), int(nranks), folder, json.loads(libs))
    result = scenarios[scenario](w)
    path = Path(folder) / f"result-{rank}.pkl"
    with open(f"{path}.tmp", "wb") as f:
        pickle.dump(result, f)
    os.replace(f"{path}.tmp", path)


# ------------------------------------------------------------------------------------------------
# NCCL between processes: the parent's side


def launch(script, scenario, nranks, folder, libs, envs=None):
    """Starts the ranks: script (a test file) run with --worker; envs: rank -> extra settings."""
    procs = []
    for rank in range(nranks):
        env = dict(os.environ, NCCL_DEBUG="WARN", PYTHONDONTWRITEBYTECODE="1")
        env.pop("HVDL_STANDIN_NCCL_FAIL_AFTER", None)
        env.pop("HVDL_STANDIN_NCCL_VERSION", None)
        env.pop("HVDL_STANDIN_CUDA_DEVICES", None)
        env.update((envs or {}).get(rank, {}))
        command = [sys.executable, str(script), "--worker", scenario,
                   str(rank), str(nranks), str(folder), json.dumps(libs)]
        procs.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    return procs


def finish(procs, folder, timeout=240, expect_dead=()):
    """Waits for the ranks; returns their results (None for those in expect_dead)."""
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


def run(script, scenario, nranks, folder, libs, envs=None, timeout=240):
    return finish(launch(script, scenario, nranks, folder, libs, envs), folder, timeout)


# ------------------------------------------------------------------------------------------------
# The stand-in runtime's log


def lines(cuda, *patterns):
    """The log's lines matching any of the regular expressions, as (seq, text)."""
    found = []
    for line in cuda.log():
        number, text = line.split(" ", 1)
        if any(re.fullmatch(p, text) for p in patterns):
            found.append((int(number), text))
    return found


def seq(cuda, pattern):
    """The sequence number of the one log line matching pattern."""
    hits = lines(cuda, pattern)
    assert len(hits) == 1, (pattern, cuda.log())
    return hits[0][0]
