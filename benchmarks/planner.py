"""Is the planner honest? Its predicted step times and ranking against measured step times.

    python benchmarks/planner.py [--sizes 2,4] [--steps 10]

For each world size it starts one job (horovodlikerun, one thread per rank). Rank 0 runs
``hvd.plan`` on the model (profiling its layers in that job, measuring the link with the core's
allreduce); then every layout the repository can run today (pp = 1: dp x tp, tensor parallel
with Megatron's column/row layers, data parallel with DistributedOptimizer, pipelines with
Schedule1F1B on the planner's stage split and micro-batch count) is trained for --steps steps
and its median step time measured. Prints, per world size, each layout's predicted and measured
time and rank, and the load average around the run (timings on a shared machine move with it).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from source_tree import jobs_pythonpath

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
D, HIDDEN, BATCH = 512, 2048, 64


def build_model(tp_set=None):
    """Two MLP blocks as a Sequential; with ``tp_set`` the Linears are Megatron's pair."""
    import torch
    from horovodlike.torch.parallel import ColumnParallelLinear, RowParallelLinear
    torch.manual_seed(0)
    layers = []
    for _ in range(2):
        if tp_set is None:
            layers += [torch.nn.Linear(D, HIDDEN), torch.nn.GELU(), torch.nn.Linear(HIDDEN, D)]
        else:
            layers += [ColumnParallelLinear(D, HIDDEN, process_set=tp_set), torch.nn.GELU(),
                       RowParallelLinear(HIDDEN, D, process_set=tp_set)]
    return torch.nn.Sequential(*layers)


def _train_step(model, optimizer, schedule, stage, x, target):
    import torch
    optimizer.zero_grad()
    if schedule is None:
        torch.nn.functional.mse_loss(model(x), target).backward()
    elif stage.is_first:
        schedule.step(x)
    elif stage.is_last:
        schedule.step(target=target)
    else:
        schedule.step()
    optimizer.step()


def measure(candidate, steps, x, target):
    """Trains ``candidate``'s layout (stage split and micro-batches as predicted) for ``steps``
    steps after 3 warm-up ones; returns the median over steps of the slowest rank's time."""
    import torch
    import horovodlike.torch as hvd
    from horovodlike.torch.pipelining import PipelineStage, Schedule1F1B, split_sequential
    pp, dp, tp = candidate.pp, candidate.dp, candidate.tp
    tag = f"{pp}x{dp}x{tp}"  # tensor names take no spaces
    mesh = hvd.ProcessMesh((pp, dp, tp), ("pp", "dp", "tp"), innermost="tp")
    model = build_model(mesh.process_set("tp") if tp > 1 else None)
    schedule = stage = None
    if pp > 1:
        balance = [last - first for first, last in candidate.stages]
        model = split_sequential(model, pp, balance=balance)[mesh.coordinate("pp")]
        stage = PipelineStage(model, mesh.coordinate("pp"), pp, process_set=mesh.process_set("pp"))
        schedule = Schedule1F1B(stage, candidate.micro_batches, torch.nn.functional.mse_loss)
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=1e-3),
        named_parameters=[(f"{tag}.{n}", p) for n, p in model.named_parameters()],
        process_set=mesh.process_set("dp"),
        backward_passes_per_step=candidate.micro_batches if pp > 1 else 1)
    coordinate = mesh.coordinate("dp")
    rows = slice(coordinate * BATCH // dp, (coordinate + 1) * BATCH // dp)
    times = []
    for step in range(steps + 3):
        hvd.barrier()
        start = time.perf_counter()
        _train_step(model, optimizer, schedule, stage, x[rows], target[rows])
        elapsed = max(hvd.allgather_object(time.perf_counter() - start,
                                           name=f"time.{tag}"))
        if step >= 3:
            times.append(elapsed)
    return statistics.median(times)


def worker(steps, out):
    import torch
    import horovodlike.torch as hvd
    torch.set_num_threads(1)
    hvd.init()
    size = hvd.size()
    sample = torch.randn(BATCH, D)
    result = hvd.plan(build_model(), sample, world_size=size, verbose=hvd.rank() == 0)
    # measure() trains with DistributedOptimizer: the fully_shard layouts are not measured here.
    result.candidates = [c for c in result.candidates if not c.fsdp]
    predicted = {c.layout: c.step_s for c in result.candidates}
    x, target = torch.randn(BATCH, D), torch.randn(BATCH, D)
    measured = {c.layout: measure(c, steps, x, target) for c in result.candidates}
    hvd.barrier()
    if hvd.rank() == 0:
        with open(out, "w") as f:
            json.dump({"predicted": predicted, "measured": measured,
                       "stages": {c.layout: c.stages for c in result.candidates},
                       "micro_batches": {c.layout: c.micro_batches for c in result.candidates},
                       "link": [result.link.latency_s, result.link.bus_bytes_per_s]}, f)
    hvd.shutdown()


def ranks_of(values):
    order = sorted(values, key=values.get)
    return {k: order.index(k) + 1 for k in values}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="2,4")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--out")
    parser.add_argument("--json", help="write the raw figures of every world size here")
    args = parser.parse_args()
    if args.worker:
        return worker(args.steps, args.out)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = jobs_pythonpath()
    raw = {"load_before": os.getloadavg(), "cores": os.cpu_count(), "sizes": {}}
    print(f"model: 2 x (Linear({D}, {HIDDEN}), GELU, Linear({HIDDEN}, {D})), global batch "
          f"{BATCH}, SGD; one thread per rank\n")
    print(f"{'ranks':>5}  {'layout':<18} {'predicted ms':>12} {'measured ms':>12} "
          f"{'pred. rank':>10} {'meas. rank':>10}")
    for size in [int(s) for s in args.sizes.split(",")]:
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "result.json")
            subprocess.run([sys.executable, "-m", "horovodlike.runner.launch", "-np", str(size),
                            sys.executable, os.path.abspath(__file__), "--worker", "--out", out,
                            "--steps", str(args.steps)], env=env, check=True, cwd=REPO,
                           stdout=subprocess.DEVNULL)
            with open(out) as f:
                result = json.load(f)
        raw["sizes"][size] = result
        predicted, measured = result["predicted"], result["measured"]
        both = {k: predicted[k] for k in measured if k in predicted}
        predicted_rank, measured_rank = ranks_of(both), ranks_of(measured)
        for layout in sorted(predicted, key=predicted.get):
            m = measured.get(layout)
            print(f"{size:>5}  {layout:<18} {predicted[layout] * 1e3:>12.2f} "
                  f"{m * 1e3 if m else float('nan'):>12.2f} "
                  f"{predicted_rank.get(layout, '-'):>10} {measured_rank.get(layout, '-'):>10}")
        n = len(measured)
        rho = 1 - 6 * sum((predicted_rank[k] - measured_rank[k]) ** 2 for k in measured) / (
            n * (n * n - 1)) if n > 1 else 1.0
        print(f"       best predicted: {min(both, key=both.get)}; best measured: "
              f"{min(measured, key=measured.get)}; Spearman rank correlation {rho:.2f}")
        latency, bandwidth = result["link"]
        print(f"       link measured in the job: {latency * 1e6:.0f} us, "
              f"{bandwidth / 1e9:.2f} GB/s bus bandwidth\n")
    raw["load_after"] = os.getloadavg()
    print("load average (1, 5, 15 min) before: {:.1f} {:.1f} {:.1f}, after: {:.1f} {:.1f} {:.1f}; "
          "{} cores".format(*raw["load_before"], *raw["load_after"], raw["cores"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(raw, f, indent=1)


if __name__ == "__main__":
    main()
