"""Where the microseconds of a small allreduce go: one 2-rank job times the same in-place
float32 Sum allreduce three ways, and MPI_Allreduce runs beside it in the same invocation.

    python benchmarks/latency_breakdown.py --size 4K

In the horovodlike job (started through the launcher, shared memory between the ranks):
1. `_core.enqueue` + `_core.wait` on a NumPy buffer: the core alone, no framework layer;
2. `hvd.allreduce_` of a torch tensor (`horovodlike.torch`): the core plus the torch layer
   (argument checks, the handle, the tensor kept alive);
3. the same with the timeline recording on rank 0: its rows give, per call, the negotiation
   (NEGOTIATE_ALLREDUCE: from the round that took the tensor in to the round that found it ready
   everywhere), the operation (ALLREDUCE) and the activities inside it (the provider's run,
   copies). What is left of the call's time is the hand-offs: the caller's enqueue waking the
   background loop, and the loop's completion waking the caller.
Each is the median over --calls calls after a warm-up. MPI_Allreduce (mpi4py, bound and
unbound, the better one) is the reference. Times on a shared machine vary with its load, which
the output prints before and after.
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
    torch.set_num_threads(1)
    hvd.init()
    count = args.size // 4
    array = np.ones(count, dtype=np.float32)

    def core_call():
        handle = _core.enqueue(ALLREDUCE, "core", array.ctypes.data, array.ctypes.data,
                               DTYPES["float32"], [count], reduce_op=Sum)
        code, message = _core.wait(handle)
        _core.release(handle)
        if code != _core.STATUS_OK:
            raise RuntimeError(message)

    core_call()
    bench._check(float(array[0]), float(hvd.size()), "core allreduce")
    array[:] = 0
    core = _timed_calls(core_call, args.calls, args.warmup)

    tensor = torch.zeros(count)
    torch_calls = _timed_calls(lambda: hvd.allreduce_(tensor, op=hvd.Sum, name="torch"),
                               args.calls, args.warmup)

    hvd.start_timeline(args.worker_trace, mark_cycles=False)
    for _ in range(args.warmup):
        hvd.allreduce_(tensor, op=hvd.Sum, name="traced")
    traced = _timed_calls(lambda: hvd.allreduce_(tensor, op=hvd.Sum, name="traced"),
                          args.calls, 0)
    hvd.stop_timeline()
    if hvd.rank() == 0:
        with open(args.out, "w") as f:
            json.dump({"core": core, "torch": torch_calls, "traced": traced}, f)
    hvd.shutdown()


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
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--worker-trace", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.size = bench.parse_size(args.size)
    if args.worker:
        worker(args)
        return

    load_before = os.getloadavg()
    env = bench._base_env()
    with tempfile.TemporaryDirectory() as tmp:
        out, timeline = os.path.join(tmp, "out.json"), os.path.join(tmp, "timeline.json")
        command = [sys.executable, "-m", "horovodlike.runner.launch", "-np", "2",
                   sys.executable, os.path.abspath(__file__), "--worker", "--out", out,
                   "--worker-trace", timeline, "--size", str(args.size), "--calls",
                   str(args.calls), "--warmup", str(args.warmup)]
        run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
        if run.returncode != 0:
            raise SystemExit("horovodlike job failed:\n" + (run.stdout + run.stderr)[-3000:])
        with open(out) as f:
            calls = json.load(f)
        durations = phases(read_timeline(timeline), "allreduce.traced")

    libs, _ = bench.libraries(2, {"MPI"})
    mpi = {}
    for lib in libs:
        result = bench.run_job(lib, 2, ["--sizes", str(args.size), "--iter-scale", "1"], 600)
        mpi[lib.label] = statistics.median(result["samples"][str(args.size)])
    load_after = os.getloadavg()

    median = {k: statistics.median(v) for k, v in calls.items()}
    phase_us = {k: statistics.median(v) for k, v in durations.items()}
    print(f"float32 allreduce of {bench.format_size(args.size)}, 2 ranks on one host (shared "
          f"memory), median of {args.calls} calls; load average {load_before[0]:.1f} before, "
          f"{load_after[0]:.1f} after")
    print()
    print("| path | median per call |")
    print("|---|---:|")
    print(f"| `_core.enqueue` + `_core.wait` (NumPy, no framework) | {_us(median['core'])} |")
    print(f"| `hvd.allreduce_` (horovodlike.torch) | {_us(median['torch'])} |")
    print(f"| `hvd.allreduce_` with the timeline recording | {_us(median['traced'])} |")
    for label, seconds in mpi.items():
        print(f"| MPI_Allreduce (mpi4py), {label} | {_us(seconds)} |")
    print()
    print("inside the traced calls, from rank 0's timeline (median per call, microseconds):")
    print()
    print("| phase | median | calls seen |")
    print("|---|---:|---:|")
    for label in sorted(durations, key=lambda k: -phase_us[k]):
        print(f"| {label} | {phase_us[label]:.0f} us | {len(durations[label])} |")
    negotiate = phase_us.get("NEGOTIATE_ALLREDUCE", 0.0)
    operation = phase_us.get("ALLREDUCE", 0.0)
    rest = median["traced"] * 1e6 - negotiate - operation
    print()
    print(f"end to end {median['traced'] * 1e6:.0f} us = negotiation {negotiate:.0f} us + "
          f"operation {operation:.0f} us + the rest {rest:.0f} us (hand-offs between the "
          f"caller and the background loop, and the framework layer)")
    print(f"torch layer: {(median['torch'] - median['core']) * 1e6:.1f} us per call "
          f"(hvd.allreduce_ minus the core alone)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"size": args.size, "median_s": median, "mpi_median_s": mpi,
                       "timeline_median_us": phase_us, "timeline_counts":
                           {k: len(v) for k, v in durations.items()},
                       "load_before": load_before, "load_after": load_after}, f, indent=1)


if __name__ == "__main__":
    main()
