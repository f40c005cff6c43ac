"""Where one pipelined, tensor-parallel step of the planner's MLP spends its time: pp=2 x tp=2
on two emulated hosts of two ranks, each host on a core of its own (planner.py --own-cores's
setup; needs root), Schedule1F1B over 8 micro-batches. Every rank times each call of its
stage's forward and backward, its pipeline receives and sends, and its tensor-parallel
allreduces, over 8 timed steps; then, for each allreduce of a stage's two ranks, how long it
took after both had called it (the clock is the machine's monotonic one, shared by the
emulated hosts).

    python3 benchmarks/probes/pipeline_step_breakdown.py \
        > benchmarks/results/pipeline-step-breakdown-two-hosts.txt
"""

import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from provenance import footer, header  # noqa: E402

STEPS = 8
TIMED = ("forward_one", "backward_one", "_receive", "_send", "_allreduce_sum")


def _timed(owner, name, calls):
    """Wraps ``owner.name`` so that each call appends (name, start, end) to ``calls``."""
    function = getattr(owner, name)

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            calls.append((name, start, time.perf_counter()))
    setattr(owner, name, wrapper)


def worker(out):
    import torch

    import horovodlike.torch as hvd
    from horovodlike.torch.parallel import mappings
    from horovodlike.torch.pipelining import schedules, stage
    from horovodlike.torch.planner.cost_model import Candidate
    from planner_models import build_model, measure
    torch.set_num_threads(1)
    hvd.init()
    calls = []
    for owner, name in ((stage.PipelineStage, "forward_one"),
                        (stage.PipelineStage, "backward_one"),
                        (schedules._PipelineSchedule, "_receive"),
                        (schedules._PipelineSchedule, "_send"), (mappings, "_allreduce_sum")):
        _timed(owner, name, calls)
    layout = Candidate(pp=2, dp=1, tp=2, stages=[(0, 3), (3, 6)], micro_batches=8)
    model, sample = build_model("mlp")
    target = torch.randn_like(model(sample))
    marks = []   # measure() calls on_step before the first timed step and after the last
    steps = measure(layout, lambda tp_set: build_model("mlp", tp_set)[0], sample, target,
                    STEPS, "breakdown", on_step=lambda: marks.append(len(calls)))
    mine = {"rank": hvd.rank(), "steps": steps, "calls": calls[marks[0]:marks[1]]}
    everyone = hvd.allgather_object(mine, name="breakdown.calls")
    if hvd.rank() == 0:
        with open(out, "w") as f:
            json.dump(everyone, f)
    hvd.shutdown()


def after_both(first, second):
    """For the k-th allreduce of each of a stage's two ranks: seconds from the later call to
    the earlier return."""
    a = [c for c in first if c[0] == "_allreduce_sum"]
    b = [c for c in second if c[0] == "_allreduce_sum"]
    return [min(x[2], y[2]) - max(x[1], y[1]) for x, y in zip(a, b)]


def report(everyone):
    steps = everyone[0]["steps"]
    print(f"pp=2 x tp=2, MLP, 8 micro-batches; steps (ms, the slowest rank's): "
          + " ".join(f"{s * 1e3:.1f}" for s in steps))
    print(f"\n{'rank':>4} {'stage':>5} " + " ".join(f"{n:>16}" for n in TIMED)
          + "   (ms a step: total of the calls / calls a step)")
    for mine in everyone:
        per = {n: [c for c in mine["calls"] if c[0] == n] for n in TIMED}
        cells = [f"{sum(e - s for _, s, e in per[n]) / STEPS * 1e3:9.1f} / "
                 f"{len(per[n]) / STEPS:4.1f}" for n in TIMED]
        print(f"{mine['rank']:>4} {mine['rank'] // 2:>5} " + " ".join(f"{c:>16}" for c in cells))
    for stage_index in (0, 1):
        waits = after_both(everyone[2 * stage_index]["calls"],
                           everyone[2 * stage_index + 1]["calls"])
        if waits:
            print(f"\nstage {stage_index}: {len(waits)} tensor-parallel allreduces of 16 KiB; "
                  f"after both ranks had called it, each took (ms): median "
                  f"{statistics.median(waits) * 1e3:.2f}, min {min(waits) * 1e3:.2f}, "
                  f"max {max(waits) * 1e3:.2f}; in all {sum(waits) / STEPS * 1e3:.1f} ms a step")


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        return worker(sys.argv[2])
    from planner import run_job
    print(header(), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "calls.json")
        qdisc = run_job([os.path.abspath(__file__), "--worker", out], "two-hosts", "1gbit", 600,
                        own_cores=True)
        print(f"two emulated hosts of 2 ranks, each on a core of its own; {qdisc}\n")
        with open(out) as f:
            report(json.load(f))
    print(footer(), flush=True)


if __name__ == "__main__":
    main()
