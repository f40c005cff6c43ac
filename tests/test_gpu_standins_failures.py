"""The stand-in NCCL's failures between real processes: an operation made to fail
(HVDL_STANDIN_NCCL_FAIL_AFTER) and a peer killed mid-collective each leave the stream blocked,
as a hung kernel would, until the communicator is aborted or destroyed. The ranks are this file
run as a script (gpu_standins/testing.py: worker_main)."""

import signal
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from gpu_standins.testing import (NON_BLOCKING, NOT_READY,  # noqa: E402
                                  expected_reduce, finish, launch, make_input, run, worker_main)

# ------------------------------------------------------------------------------------------------
# The ranks' side (this file run as a script; no pytest)


def _blocked_then_released(w, comm, s, destroy=False):
    """Waits for the comm's async error; checks the stream stays blocked until the comm is
    aborted (or destroyed)."""
    cu, nc = w.cuda, w.nccl
    after = cu.event_create()
    late = np.zeros(4, np.float32)
    probe = w.device(np.arange(4, dtype=np.float32))
    cu.launch_read(s, late, probe)
    cu.event_record(after, s)
    error = nc.wait_async_error(comm, 60)
    error_at = time.monotonic()  # the same clock in every process of this machine
    time.sleep(0.3)
    blocked = cu.event_query(after) == NOT_READY and not late.any()
    (nc.destroy if destroy else nc.abort)(comm)
    released = cu.wait_event(after, timeout=10)
    cu.stream_synchronize(s)
    return {"error": error, "error_at": error_at, "blocked": blocked, "released": released,
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


SCENARIOS = {"fail_after": scenario_fail_after, "killed": scenario_killed}

if __name__ == "__main__" and sys.argv[1:2] == ["--worker"]:
    worker_main(sys.argv[2:], SCENARIOS)
    sys.exit(0)

# ------------------------------------------------------------------------------------------------
# The tests (pytest is imported here so that the ranks, run as scripts, start faster)

import pytest  # noqa: E402

SCRIPT = Path(__file__).resolve()



def test_nccl_fail_after_blocks_stream_until_abort(standins, tmp_path):
    envs = {0: {"HVDL_STANDIN_NCCL_FAIL_AFTER": "2"}}
    first, second = run(SCRIPT, "fail_after", 2, tmp_path, standins, envs)
    want = expected_reduce("float32", "sum", [make_input("float32", r, 8, "fa") for r in (0, 1)])
    for res in (first, second):
        np.testing.assert_array_equal(res["first"], want)
        assert res["blocked"] is True and res["released"] is True
        assert res["read_after"] is True
    assert first["error"] == 2
    assert second["error"] == 6  # the failing rank aborted: its connections closed


def test_nccl_peer_killed_mid_collective(standins, tmp_path):
    procs = launch(SCRIPT, "killed", 2, tmp_path, standins)
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"ready-{r}").exists() for r in (0, 1)):
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            break
        time.sleep(0.02)
    time.sleep(0.2)
    killed_at = time.monotonic()
    procs[1].send_signal(signal.SIGKILL)
    survivor, _ = finish(procs, tmp_path, expect_dead=(1,))
    assert procs[1].returncode == -signal.SIGKILL
    assert survivor["error"] == 6
    # Timed from the kill (the test's own waits before it take any time on a busy machine):
    # seconds, the lost connections, not a timeout.
    assert survivor["error_at"] - killed_at < 10.0
    assert survivor["blocked"] is True and survivor["released"] is True
