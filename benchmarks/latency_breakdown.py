"""Where the microseconds of a small allreduce go: horovodlike jobs time the same in-place
float32 Sum allreduce several ways, and MPI_Allreduce runs beside them in the same invocation.

    python benchmarks/latency_breakdown.py --size 4K

Three horovodlike jobs, started through the launcher (shared memory between the ranks):
1. two ranks, the defaults: `hvd.allreduce_` of a torch tensor; `_core.run` on a NumPy buffer
   (the core alone, as the framework layers call it for a synchronous collective); the
   asynchronous path (`_core.enqueue`, which wakes the background loop, then `_core.wait`);
   the torch call with the core's entry point answered at once (the Python layer alone); and
   the torch call with the timeline recording on rank 0, whose rows give the negotiation and
   the operation per call;
2. two ranks with HOROVOD_CALLER_ROUNDS=0: the background loop runs every negotiation round, so
   each call also pays the hand-offs from the caller to the loop and back, which a waiting
   caller saves by running its round itself (docs/architecture.md, "Who runs a round");
3. one rank: no peer, so what is left is the core's own bookkeeping.
The differences between these medians split one call into the torch layer, the core's work,
the exchange with the peer and the hand-offs saved. Each figure is the median over --calls
calls after a warm-up. MPI_Allreduce (mpi4py, bound and unbound) is the reference. Times on a
shared machine vary with its load, which the output prints before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import allreduce as bench  # noqa: E402
from provenance import footer, header, record  # noqa: E402


def _timed_calls(call, calls, warmup):
    for _ in range(warmup):
        call()
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
    return samples


def worker(args):
    import numpy as np
    import torch
    import horovodlike.torch as hvd
    from horovodlike import _core
    from horovodlike.common.constants import ALLREDUCE, DTYPES, Sum
    from horovodlike.torch import _queue
    torch.set_num_threads(1)
    hvd.init()
    count = args.size // 4
    array = np.ones(count, dtype=np.float32)
    pointer = array.ctypes.data  # once: the property itself costs about 1 us
    f32 = DTYPES["float32"]

    def core_run():  # the synchronous path, as the framework layers call it
        failed = _core.run(ALLREDUCE, "core", pointer, pointer, f32, [count], Sum, 1.0, 1.0, 0,
                           -1, 0)
        if failed is not None:
            raise RuntimeError(failed[1])

    def core_async():  # enqueue (which wakes the background loop), then wait
        handle = _core.enqueue(ALLREDUCE, "core.async", pointer, pointer, f32, [count],
                               reduce_op=Sum)
        code, message = _core.wait(handle)
        _core.release(handle)
        if code != _core.STATUS_OK:
            raise RuntimeError(message)

    core_run()
    bench._check(float(array[0]), float(hvd.size()), "core allreduce")
    tensor = torch.zeros(count)
    results = {"core_run": _timed_calls(core_run, args.calls, args.warmup),
               "torch": _timed_calls(lambda: hvd.allreduce_(tensor, op=hvd.Sum, name="torch"),
                                     args.calls, args.warmup)}
    if args.job == "main":
        results["core_async"] = _timed_calls(core_async, args.calls, args.warmup)

        # The Python layer alone: the same call with the core's entry point answered at once.
        class NoCore:
            @staticmethod
            def run(*arguments):
                return None

        real, _queue._core = _queue._core, NoCore
        try:
            results["python"] = _timed_calls(
                lambda: hvd.allreduce_(tensor, op=hvd.Sum, name="python"), args.calls,
                args.warmup)
        finally:
            _queue._core = real

        hvd.start_timeline(args.worker_trace, mark_cycles=False)
        for _ in range(args.warmup):
            hvd.allreduce_(tensor, op=hvd.Sum, name="traced")
        results["traced"] = _timed_calls(lambda: hvd.allreduce_(tensor, op=hvd.Sum,
                                                                name="traced"), args.calls, 0)
        hvd.stop_timeline()
    if hvd.rank() == 0:
        with open(args.out, "w") as f:
            json.dump(results, f)
    hvd.shutdown()


# The horovodlike jobs: (ranks, environment). "loop": the background loop runs every round, so
# each call pays the two hand-offs (caller -> loop -> caller) that a waiting caller saves by
# running its round itself; "one-rank": no peer, so what is left is the bookkeeping.
JOBS = {"main": (2, {}), "loop": (2, {"HOROVOD_CALLER_ROUNDS": "0"}), "one-rank": (1, {})}


def read_timeline(path: str) -> list[dict]:
    """The trace's events; the file may lack its closing bracket (Chrome accepts that)."""
    with open(path) as f:
        text = f.read().strip()
    if not text.endswith("]"):
        text = text.rstrip(",\n ") + "]"
    return json.loads(text)


def phases(events: list[dict], row_title: str) -> dict[str, list[float]]:
    """Durations in microseconds per label on the row titled `row_title`, B/E pairs nested."""
    rows = {e["pid"]: e["args"]["name"] for e in events
            if e.get("ph") == "M" and e.get("name") == "process_name"}
    wanted = {pid for pid, title in rows.items() if title == row_title}
    stack, durations = [], {}
    for e in events:
        if e.get("pid") not in wanted:
            continue
        if e["ph"] == "B":
            stack.append((e["name"], e["ts"]))
        elif e["ph"] == "E" and stack:
            name, start = stack.pop()
            durations.setdefault(name, []).append(e["ts"] - start)
    return durations


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.1f} us"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="4K", help="message size (default 4K)")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--json", help="also write the figures here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--job", default="main", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--worker-trace", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.size = bench.parse_size(args.size)
    if args.worker:
        worker(args)
        return

    load_before = os.getloadavg()
    print(header(), flush=True)
    calls, durations = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        timeline = os.path.join(tmp, "timeline.json")
        for job, (ranks, extra_env) in JOBS.items():
            out = os.path.join(tmp, f"{job}.json")
            command = [sys.executable, "-m", "horovodlike.runner.launch", "-np", str(ranks),
                       sys.executable, os.path.abspath(__file__), "--worker", "--job", job,
                       "--out", out, "--worker-trace", timeline, "--size", str(args.size),
                       "--calls", str(args.calls), "--warmup", str(args.warmup)]
            run = subprocess.run(command, env={**bench._base_env(), **extra_env},
                                 capture_output=True, text=True, timeout=900)
            if run.returncode != 0:
                raise SystemExit(f"horovodlike job {job} failed:\n" +
                                 (run.stdout + run.stderr)[-3000:])
            with open(out) as f:
                calls[job] = {k: statistics.median(v) for k, v in json.load(f).items()}
        durations = phases(read_timeline(timeline), "allreduce.traced")

    libs, _ = bench.libraries(2, {"MPI"},
                              mpi_configs=bench.mpi_configurations("bindings"))
    mpi = {}
    for lib in libs:
        result = bench.run_job(lib, 2, ["--sizes", str(args.size), "--iter-scale", "1"], 600)
        mpi[lib.label] = statistics.median(result["samples"][str(args.size)])
    load_after = os.getloadavg()

    main_job, loop, one = calls["main"], calls["loop"], calls["one-rank"]
    phase_us = {k: statistics.median(v) for k, v in durations.items()}
    best_mpi = min(mpi.values()) if mpi else float("nan")
    print(f"float32 allreduce of {bench.format_size(args.size)}, in place, Sum; 2 ranks on one "
          f"host (shared memory) unless said; median of {args.calls} calls; load average "
          f"{load_before[0]:.1f} before, {load_after[0]:.1f} after")
    print()
    print("| path | median per call | / MPI |")
    print("|---|---:|---:|")
    rows = [("`hvd.allreduce_` (horovodlike.torch)", main_job["torch"]),
            ("`_core.run` (NumPy buffer, no framework)", main_job["core_run"]),
            ("`_core.enqueue` + `_core.wait` (the asynchronous path; the enqueue wakes the loop)",
             main_job["core_async"]),
            ("`hvd.allreduce_`, HOROVOD_CALLER_ROUNDS=0 (the loop runs every round)",
             loop["torch"]),
            ("`_core.run`, HOROVOD_CALLER_ROUNDS=0", loop["core_run"]),
            ("`hvd.allreduce_`, one rank (no peer)", one["torch"]),
            ("`_core.run`, one rank (no peer)", one["core_run"]),
            ("`hvd.allreduce_` with the core's entry point answered at once (Python alone)",
             main_job["python"]),
            ("`hvd.allreduce_` with the timeline recording", main_job["traced"])]
    rows += [(f"MPI_Allreduce (mpi4py), {label}", seconds) for label, seconds in mpi.items()]
    for label, seconds in rows:
        print(f"| {label} | {_us(seconds)} | {seconds / best_mpi:.2f}x |")
    print()
    print("where the time of one `hvd.allreduce_` goes (differences of the medians above):")
    print()
    print("| part | per call |")
    print("|---|---:|")
    parts = [("the torch layer (Python: checks, names, the call)", main_job["python"]),
             ("the core's own work without a peer (queue, handle, round, kernel)",
              one["core_run"]),
             ("the exchange with the peer (negotiation and data, waiting for it)",
              main_job["core_run"] - one["core_run"]),
             ("what the torch layer adds over `_core.run` with a peer",
              main_job["torch"] - main_job["core_run"])]
    for label, seconds in parts:
        print(f"| {label} | {_us(seconds)} |")
    print(f"| saved by running the round on the calling thread (loop-run minus caller-run, "
          f"torch) | {_us(loop['torch'] - main_job['torch'])} |")
    print()
    print("inside the traced calls, from rank 0's timeline (median per call, microseconds; the "
          "timeline's own recording costs show in the traced row above):")
    print()
    print("| phase | median | calls seen |")
    print("|---|---:|---:|")
    for label in sorted(durations, key=lambda k: -phase_us[k]):
        print(f"| {label} | {phase_us[label]:.1f} us | {len(durations[label])} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**record(), "size": args.size, "median_s": calls, "mpi_median_s": mpi,
                       "timeline_median_us": phase_us, "timeline_counts":
                           {k: len(v) for k, v in durations.items()},
                       "load_before": load_before, "load_after": load_after}, f, indent=1)
    print(footer())


if __name__ == "__main__":
    main()
