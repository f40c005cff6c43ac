"""Data parallel (DistributedOptimizer) against ZeroRedundancyOptimizer, for a model whose
gradients are large: step time, bytes sent per rank, optimizer state and peak memory per rank.

    python benchmarks/zero.py [--np 4] [--width 1024] [--steps 10] [--json results.json]

Both train the same MLP with Adam on the same data, one thread per rank. Bytes sent per rank
are counted from the collectives each issues, with the ring algorithms the core runs (allreduce
2(N-1)/N of the gradients; reduce-scatter (N-1)/N of the gradients plus allgather (N-1)/N of
the parameters): the same volume, split into two halves. Peak memory is the rank's maximum
resident set size (torch itself accounts for a few hundred MiB of it).
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

from source_tree import jobs_pythonpath

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def worker(kind, width, steps, out):
    import torch
    import horovodlike.torch as hvd
    torch.set_num_threads(1)
    hvd.init()
    n = hvd.size()
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[layer for _ in range(4) for layer in
                                  (torch.nn.Linear(width, width), torch.nn.ReLU())])
    parameter_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    if kind == "dp":
        optimizer = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=1e-4),
                                             named_parameters=model.named_parameters())
        sent = 2 * (n - 1) / n * parameter_bytes
        state = lambda: optimizer.state  # noqa: E731
    else:
        optimizer = hvd.ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, lr=1e-4)
        sent = 2 * (n - 1) / n * parameter_bytes
        state = lambda: optimizer.optim.state  # noqa: E731
    x = torch.randn(32, width)
    times = []
    for step in range(steps + 2):
        hvd.barrier()
        start = time.perf_counter()
        optimizer.zero_grad()
        model(x).pow(2).mean().backward()
        optimizer.step()
        elapsed = max(hvd.allgather_object(time.perf_counter() - start))
        if step >= 2:
            times.append(elapsed)
    state_bytes = sum(v.numel() * v.element_size() for s in state().values()
                      for v in s.values() if torch.is_tensor(v) and v.dim() > 0)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    everyone = hvd.allgather_object((state_bytes, peak))
    if hvd.rank() == 0:
        with open(out, "w") as f:
            json.dump({"step_s": statistics.median(times), "step_s_all": times, "sent": sent,
                       "state": max(s for s, _ in everyone), "peak": max(p for _, p in everyone),
                       "state_per_rank": [s for s, _ in everyone],
                       "peak_per_rank": [p for _, p in everyone],
                       "parameters": parameter_bytes}, f)
    hvd.shutdown()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--np", type=int, default=4)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--worker")
    parser.add_argument("--out")
    parser.add_argument("--json", help="writes the raw figures of both runs here")
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker, args.width, args.steps, args.out)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = jobs_pythonpath()
    mib = 1 << 20
    rows, loads = [], [os.getloadavg()]
    for kind, label in (("dp", "data parallel"), ("zero", "ZeRO")):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "result.json")
            subprocess.run([sys.executable, "-m", "horovodlike.runner.launch", "-np",
                            str(args.np), sys.executable, os.path.abspath(__file__), "--worker",
                            kind, "--out", out, "--width", str(args.width), "--steps",
                            str(args.steps)], env=env, check=True, cwd=REPO,
                           stdout=subprocess.DEVNULL)
            with open(out) as f:
                rows.append((label, json.load(f)))
        loads.append(os.getloadavg())
    print(f"{args.np} ranks, 4 x Linear({args.width}, {args.width}) "
          f"({rows[0][1]['parameters'] / mib:.1f} MiB of parameters), Adam, batch 32 per rank\n")
    print(f"{'':<14} {'step ms':>8} {'sent/rank MiB':>14} {'Adam state/rank MiB':>20} "
          f"{'peak RSS MiB':>13}")
    for label, r in rows:
        print(f"{label:<14} {r['step_s'] * 1e3:>8.1f} {r['sent'] / mib:>14.1f} "
              f"{r['state'] / mib:>20.1f} {r['peak'] / mib:>13.0f}")
    print(f"\nload average (1, 5, 15 min) before: {' '.join(f'{v:.1f}' for v in loads[0])}, "
          f"after: {' '.join(f'{v:.1f}' for v in loads[-1])}; {os.cpu_count()} cores")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": sys.argv, "np": args.np, "width": args.width,
                       "steps": args.steps, "load_average": loads,
                       "results": dict(rows)}, f, indent=1)


if __name__ == "__main__":
    main()
