"""Multi-copy tensor parallelism: step time of a tensor-parallel MLP block with 1 and 2 copies
in the same job, and a timeline picture of the copies' allreduces and compute.

    python benchmarks/multi_copy.py [--rounds 7] [--steps 5] [--json OUT.json] [--png OUT.png]

The block is ColumnParallelLinear(H, 4H) -> gelu -> RowParallelLinear(4H, H) over 2 ranks
(one compute thread each), batch BS, fp32. Each round times --steps forward+backward passes
of each variant: the layers with num_copies=1, with num_copies=2, and with one copy each
inside MultiCopy(block, 2) (the one that goes first turns from round to round), and prints
the medians (the slowest rank's time per step) and their ratios to one copy. Then rank 0
records the timeline (the core's ALLREDUCE spans) and, on the same clock, when each copy
computed (copies.trace), for TRACED steps with 2 copies; --png draws each of them.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from latency_breakdown import read_timeline  # noqa: E402
from source_tree import jobs_pythonpath  # noqa: E402
from timeline_plot import spans_by_row  # noqa: E402

BS, H = 256, 1024
TRACED = 4


VARIANTS = ("1 copy", "2 copies", "MultiCopy 2")


def _block(variant):
    """The MLP block: layers with num_copies=1 or 2, or one copy each inside MultiCopy."""
    import torch
    import torch.nn.functional as F
    from horovodlike.torch.parallel import ColumnParallelLinear, MultiCopy, RowParallelLinear

    class Mlp(torch.nn.Module):
        def __init__(self, num_copies):
            super().__init__()
            torch.manual_seed(0)   # the same weights in every variant
            self.up = ColumnParallelLinear(H, 4 * H, num_copies=num_copies)
            self.down = RowParallelLinear(4 * H, H, num_copies=num_copies)

        def forward(self, x):
            return self.down(F.gelu(self.up(x)))
    if variant == "MultiCopy 2":
        return MultiCopy(Mlp(1), num_copies=2)
    return Mlp(2 if variant == "2 copies" else 1)


def _step(block, x):
    block(x).pow(2).mean().backward()
    for p in block.parameters():
        p.grad = None


def _timed(hvd, block, x, steps):
    """Median over ``steps`` of the slowest rank's forward+backward time (seconds)."""
    times = []
    for _ in range(steps):
        hvd.barrier()
        start = time.perf_counter()
        _step(block, x)
        times.append(max(hvd.allgather_object(time.perf_counter() - start)))
    return statistics.median(times)


def _trace(hvd, block, x, trace_dir):
    """TRACED steps with the timeline on; the compute spans on its clock (rank 0)."""
    from horovodlike.torch.parallel import copies
    spans, marks = [], []
    before = time.perf_counter()
    hvd.start_timeline(os.path.join(trace_dir, "timeline.json"))
    origin = (before + time.perf_counter()) / 2
    if hvd.rank() == 0:
        copies.trace = lambda label, a, b: spans.append((label, (a - origin) * 1e6,
                                                         (b - origin) * 1e6))
    for _ in range(TRACED):
        hvd.barrier()
        start = (time.perf_counter() - origin) * 1e6
        _step(block, x)
        marks.append((start, (time.perf_counter() - origin) * 1e6))
    copies.trace = None
    hvd.barrier()
    hvd.stop_timeline()
    if hvd.rank() == 0:
        with open(os.path.join(trace_dir, "compute.json"), "w") as f:
            json.dump({"spans": spans, "steps": marks}, f)


def worker(args):
    import torch
    import horovodlike.torch as hvd
    torch.set_num_threads(1)
    hvd.init()
    torch.manual_seed(1)
    x = torch.randn(BS, H).requires_grad_()
    blocks = {v: _block(v) for v in VARIANTS}
    for v in VARIANTS:   # warm-up: first-call costs out of the rounds
        _timed(hvd, blocks[v], x, 2)
    rounds = []
    for r in range(args.rounds):
        order = VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]
        times = {v: _timed(hvd, blocks[v], x, args.steps) for v in order}
        rounds.append({"first": order[0], "seconds": times})
    _trace(hvd, blocks["2 copies"], x, args.trace_dir)
    if hvd.rank() == 0:
        with open(os.path.join(args.trace_dir, "rounds.json"), "w") as f:
            json.dump(rounds, f)
    hvd.shutdown()


def _allreduces(trace_dir, window):
    """[(copy, negotiation start, allreduce start, allreduce end)] in rank 0's timeline within
    ``window``, in the order the layers started them: copy 1, then copy 2, in each call."""
    rows = spans_by_row(read_timeline(os.path.join(trace_dir, "timeline.json")))
    found = []
    for title, spans in rows.items():
        run = [(a, b) for label, a, b in spans if label == "ALLREDUCE" and
               window[0] <= a <= window[1]]
        asked = [a for label, a, b in spans if label.startswith("NEGOTIATE") and
                 window[0] <= a <= window[1]]
        if title.startswith("allreduce.") and run:
            found.append((int(title.rsplit(".", 1)[-1]), min(asked or [run[0][0]]), *run[0]))
    found.sort()
    return [(i % 2 + 1, asked, a, b) for i, (_, asked, a, b) in enumerate(found)]


def _compute_spans(compute, window):
    return [(label, a, b) for label, a, b in compute["spans"] if window[0] <= a <= window[1]]


def plot(trace_dir, path):
    """Rank 0's compute per copy and each copy's allreduce (thin: waiting for every rank to
    submit it; thick: running), one panel per traced step."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
    with open(os.path.join(trace_dir, "compute.json")) as f:
        compute = json.load(f)
    colors = {1: "tab:blue", 2: "tab:orange"}
    lanes = ["row layer forward", "column layer backward", "allreduce copy 1",
             "allreduce copy 2"]
    steps = compute["steps"]
    fig, axes = plt.subplots(len(steps), 1, figsize=(11, 2.3 * len(steps)))
    for i, (ax, window) in enumerate(zip(axes, steps)):
        _draw_step(ax, compute, trace_dir, window, colors)
        ax.set_yticks(range(len(lanes)))
        ax.set_yticklabels(lanes, fontsize=8)
        ax.set_ylim(len(lanes) - 0.4, -0.6)
        ax.set_xlim(window[0] / 1e3 - 2, window[1] / 1e3 + 2)
        ax.set_title(f"traced step {i + 1}", fontsize=9)
    axes[-1].set_xlabel("ms since the recording began (rank 0); thin bar: negotiation (waiting "
                        "for the other rank), thick: the allreduce running")
    axes[0].legend(handles=[Patch(color=colors[1], label="copy 1"),
                            Patch(color=colors[2], label="copy 2"),
                            Patch(color="tab:grey", label="weight gradient")],
                   loc="upper right", fontsize=8)
    fig.suptitle("num_copies=2: Column/Row MLP block, forward+backward steps, rank 0 of 2")
    fig.tight_layout()
    fig.savefig(path, dpi=70)
    plt.close(fig)


def _draw_step(ax, compute, trace_dir, window, colors):
    for label, a, b in _compute_spans(compute, window):
        lane = 1 if "backward" in label or "weight" in label else 0
        color = "tab:grey" if "weight" in label else colors[int(label.split()[1])]
        ax.barh(lane, (b - a) / 1e3, left=a / 1e3, height=0.7, color=color)
    for copy, asked, a, b in _allreduces(trace_dir, window):
        ax.barh(1 + copy, (a - asked) / 1e3, left=asked / 1e3, height=0.2, color=colors[copy])
        ax.barh(1 + copy, (b - a) / 1e3, left=a / 1e3, height=0.7, color=colors[copy],
                edgecolor="black")


def overlaps(trace_dir):
    """Per allreduce of every traced step: how long it waited and ran, and how much of the
    run fell while this rank computed the other copy (or the weight gradient)."""
    with open(os.path.join(trace_dir, "compute.json")) as f:
        compute = json.load(f)
    result = []
    for step, window in enumerate(compute["steps"]):
        spans = _compute_spans(compute, window)
        for copy, asked, a, b in _allreduces(trace_dir, window):
            busy = sum(max(0.0, min(b, e) - max(a, s)) for label, s, e in spans
                       if label.startswith(f"copy {3 - copy}") or label == "weight gradient")
            result.append({"step": step + 1, "copy": copy, "negotiation_ms": (a - asked) / 1e3,
                           "allreduce_ms": (b - a) / 1e3, "overlapped_ms": busy / 1e3})
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--json", help="write the rounds and the load average here")
    parser.add_argument("--png", help="draw the timeline picture here")
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--trace-dir", help="keep rank 0's timeline and compute spans here")
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as trace_dir:
        trace_dir = args.trace_dir or trace_dir   # given: the trace is kept there
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=jobs_pythonpath())
        command = [sys.executable, "-m", "horovodlike.runner.launch", "-np", "2",
                   sys.executable, os.path.abspath(__file__), "--worker", "--rounds",
                   str(args.rounds), "--steps", str(args.steps), "--trace-dir", trace_dir]
        subprocess.run(command, env=env, check=True, timeout=600)
        with open(os.path.join(trace_dir, "rounds.json")) as f:
            rounds = json.load(f)
        if args.png:
            plot(trace_dir, args.png)
        overlap = _report(rounds, overlaps(trace_dir))
    load_after = os.getloadavg()
    print(f"load average before {load_before}, after {load_after}, {os.cpu_count()} cores")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"batch": BS, "hidden": H, "rounds": rounds, "overlap": overlap,
                       "load_before": load_before, "load_after": load_after,
                       "cores": os.cpu_count()}, f, indent=1)


def _report(rounds, traced):
    """Prints every round and the traced steps' allreduces; returns the latter."""
    print(f"MLP block ({BS}, {H}) -> ({H}, {4 * H}) -> ({4 * H}, {H}), 2 ranks, fp32; median "
          "ms per forward+backward step (slowest rank)")
    print("| round | first | " + " | ".join(f"{v} ms" for v in VARIANTS) + " | " +
          " | ".join(f"{v} / 1 copy" for v in VARIANTS[1:]) + " |")
    print("|---:|---|" + "---:|" * (2 * len(VARIANTS) - 1))
    for i, r in enumerate(rounds):
        t = r["seconds"]
        print(f"| {i + 1} | {r['first']} | " + " | ".join(f"{t[v] * 1e3:.1f}" for v in VARIANTS)
              + " | " + " | ".join(f"{t[v] / t['1 copy']:.3f}" for v in VARIANTS[1:]) + " |")
    for v in VARIANTS[1:]:
        ratios = [r["seconds"][v] / r["seconds"]["1 copy"] for r in rounds]
        print(f"{v} / 1 copy: median {statistics.median(ratios):.3f} (min {min(ratios):.3f}, "
              f"max {max(ratios):.3f})")
    for o in traced:
        print(f"traced step {o['step']}: copy {o['copy']}'s allreduce waited "
              f"{o['negotiation_ms']:.2f} ms for the other rank, ran "
              f"{o['allreduce_ms']:.2f} ms, of which {o['overlapped_ms']:.2f} ms while this "
              "rank computed the other copy or the weight gradient")
    return traced


if __name__ == "__main__":
    main()
