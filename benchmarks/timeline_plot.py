"""A picture of backward and allreduce overlapping in a training step, from train_step.py
--trace-dir's files (rank 0's timeline and its step phases, on one clock).

    python benchmarks/timeline_plot.py TRACE_DIR --png benchmarks/results/train_step_timeline.png

Top row: rank 0's forward pass, backward pass, and the rest of the step (the optimizer's wait
for the last allreduces, then the update). Below, one row per gradient tensor: its negotiation
and its allreduce from the timeline. It also prints, per step, how much of the allreduce time
(the union of all tensors' ALLREDUCE spans) fell inside the backward pass, and how long the
step ran after the backward pass ended.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from latency_breakdown import read_timeline  # noqa: E402


def spans_by_row(events):
    """{row title: [(label, start_us, end_us)]} from B/E pairs (nested ones included)."""
    titles = {e["pid"]: e["args"]["name"] for e in events
              if e.get("ph") == "M" and e.get("name") == "process_name"}
    stacks, rows = {}, {}
    for e in events:
        if e.get("ph") == "B":
            stacks.setdefault(e["pid"], []).append((e["name"], e["ts"]))
        elif e.get("ph") == "E" and stacks.get(e["pid"]):
            label, start = stacks[e["pid"]].pop()
            rows.setdefault(titles.get(e["pid"], str(e["pid"])), []).append((label, start,
                                                                              e["ts"]))
    return rows


def union_length(intervals, window):
    """Length of the union of `intervals` clipped to `window` (start, end)."""
    lo, hi = window
    clipped = sorted((max(a, lo), min(b, hi)) for a, b in intervals if b > lo and a < hi)
    total, current_start, current_end = 0.0, None, None
    for a, b in clipped:
        if current_end is None or a > current_end:
            if current_end is not None:
                total += current_end - current_start
            current_start, current_end = a, b
        else:
            current_end = max(current_end, b)
    if current_end is not None:
        total += current_end - current_start
    return total


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace_dir")
    parser.add_argument("--png", help="write the picture here")
    args = parser.parse_args()
    rows = spans_by_row(read_timeline(os.path.join(args.trace_dir, "timeline.json")))
    with open(os.path.join(args.trace_dir, "steps.json")) as f:
        steps = json.load(f)
    allreduces = [(a, b) for spans in rows.values() for label, a, b in spans
                  if label == "ALLREDUCE"]
    print("| step | forward | backward | after backward | allreduce time | of it inside backward |")
    print("|---:|---:|---:|---:|---:|---:|")
    for i, step in enumerate(steps):
        step_window = (step["forward"][0], step["wait_and_update"][1])
        busy = union_length(allreduces, step_window)
        inside = union_length(allreduces, tuple(step["backward"]))
        length = {k: (v[1] - v[0]) / 1e3 for k, v in step.items()}
        print(f"| {i + 1} | {length['forward']:.1f} ms | {length['backward']:.1f} ms | "
              f"{length['wait_and_update']:.1f} ms | {busy / 1e3:.1f} ms | "
              f"{inside / busy * 100 if busy else 0:.0f}% |")
    if args.png:
        plot(rows, steps, args.png)


def plot(rows, steps, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = sorted((title for title in rows if title.startswith("allreduce.")),
                   key=lambda t: min(a for _, a, _ in rows[t]))
    fig, ax = plt.subplots(figsize=(12, 0.07 * len(names) + 2.5))
    colors = {"forward": "tab:green", "backward": "tab:orange", "wait_and_update": "tab:grey"}
    for step in steps:
        for phase, (a, b) in step.items():
            ax.barh(-1.5, (b - a) / 1e3, left=a / 1e3, height=1.5, color=colors[phase])
    for y, title in enumerate(names):
        for label, a, b in rows[title]:
            if label == "ALLREDUCE":
                ax.barh(y, (b - a) / 1e3, left=a / 1e3, height=0.8, color="tab:blue")
            elif label.startswith("NEGOTIATE"):
                ax.barh(y, (b - a) / 1e3, left=a / 1e3, height=0.4, color="tab:purple")
    start = steps[0]["forward"][0] / 1e3
    end = steps[-1]["wait_and_update"][1] / 1e3
    ax.set_xlim(start, end)
    ax.set_ylim(len(names), -3)
    ax.set_yticks([-1.5])
    ax.set_yticklabels(["rank 0 step"])
    ax.set_xlabel("ms since the recording began (rank 0)")
    ax.set_ylabel(f"{len(names)} gradient tensors")
    from matplotlib.patches import Patch
    ax.legend(handles=[Patch(color=c, label=k.replace("_", " ")) for k, c in colors.items()]
              + [Patch(color="tab:purple", label="negotiation"),
                 Patch(color="tab:blue", label="allreduce")], loc="lower right", fontsize=7)
    ax.set_title("backward and allreduce, rank 0 (train_step.py, 2 ranks)")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


if __name__ == "__main__":
    main()
