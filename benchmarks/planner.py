"""Is the planner honest? Its predicted step times and ranking against measured step times.

    python benchmarks/planner.py [--sizes 2,4] [--steps 10]

For each world size it starts one job (horovodlikerun, one thread per rank). Rank 0 runs
``hvd.plan`` on the model (profiling its layers in that job, measuring the link with the core's
allreduce); then every layout the repository can run today (pp = 1: dp x tp, tensor parallel
with Megatron's column/row layers, data parallel with DistributedOptimizer) is trained for
--steps steps and its median step time measured. Pipeline layouts are predicted only. Prints,
per world size, each layout's predicted and measured time and rank.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

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


def worker(steps, out):
    import torch
    import horovodlike.torch as hvd
    torch.set_num_threads(1)
    hvd.init()
    size = hvd.size()
    sample = torch.randn(BATCH, D)
    result = hvd.plan(build_model(), sample, world_size=size, verbose=hvd.rank() == 0)
    predicted = {c.layout: c.step_s for c in result.candidates}
    measured = {}
    for tp in [t for t in range(1, size + 1) if size % t == 0]:
        dp = size // tp
        mesh = hvd.ProcessMesh((1, dp, tp), ("pp", "dp", "tp"), innermost="tp")
        model = build_model(mesh.process_set("tp") if tp > 1 else None)
        optimizer = hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=1e-3),
            named_parameters=[(f"{tp}.{n}", p) for n, p in model.named_parameters()],
            process_set=mesh.process_set("dp"))
        rows = slice(mesh.coordinate("dp") * BATCH // dp, (mesh.coordinate("dp") + 1) * BATCH // dp)
        x, target = torch.randn(BATCH, D), torch.randn(BATCH, D)
        times = []
        for step in range(steps + 3):
            hvd.barrier()
            start = time.perf_counter()
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x[rows]), target[rows]).backward()
            optimizer.step()
            elapsed = max(hvd.allgather_object(time.perf_counter() - start))
            if step >= 3:
                times.append(elapsed)
        measured[f"pp=1 dp={dp} tp={tp}"] = statistics.median(times)
    hvd.barrier()
    if hvd.rank() == 0:
        with open(out, "w") as f:
            json.dump({"predicted": predicted, "measured": measured,
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
    args = parser.parse_args()
    if args.worker:
        return worker(args.steps, args.out)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, env.get("PYTHONPATH")]))
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
        predicted, measured = result["predicted"], result["measured"]
        both = {k: predicted[k] for k in measured if k in predicted}
        predicted_rank, measured_rank = ranks_of(both), ranks_of(measured)
        for layout in sorted(predicted, key=predicted.get):
            m = measured.get(layout)
            print(f"{size:>5}  {layout:<18} {predicted[layout] * 1e3:>12.2f} "
                  f"{m * 1e3 if m else float('nan'):>12.2f} "
                  f"{predicted_rank.get(layout, '-'):>10} {measured_rank.get(layout, '-'):>10}")
        latency, bandwidth = result["link"]
        print(f"       link measured in the job: {latency * 1e6:.0f} us, "
              f"{bandwidth / 1e9:.2f} GB/s bus bandwidth\n")


if __name__ == "__main__":
    main()
