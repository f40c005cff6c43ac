"""The training step against the bound this machine allows, measured within one job.

    python benchmarks/train_bound.py --np 2 --rounds 10

train_step.py measures horovodlike's DistributedOptimizer, the same training without any
exchange (the ceiling) and the exchange alone as separate jobs, one after the other. On a
machine whose speed drifts (this 2-vCPU VM's forward pass moves by a third from one minute to
the next) the bound made of two jobs is then off by more than the distance it is meant to
measure. Here one job holds both models (built alike) and takes turns: in every round, one
window of each of

- `horovodlike`: a training step with `hvd.DistributedOptimizer` (the gradients allreduced as
  the backward pass produces them, averaged);
- `alone`: the same step of the other model with a plain optimizer, no exchange, each rank at
  its own pace (train_step.py's ceiling);
- `in-step`: the same, with the ranks kept in step by a one-value allreduce at the end of each
  step. Any data-parallel step waits for its slowest rank; what that costs on a noisy machine
  is the machine's, not the exchange's;
- `exchange`: the step's gradients allreduced as DistributedOptimizer does (all started, then
  all waited for), without forward or backward;

in an order that rotates from round to round, every window started together on all ranks.
With no core free for the exchange, a step cannot take less than the no-exchange step plus
the exchange alone: each round prints the horovodlike step against both bounds of the same
round, and rank 0's CPU time per step for each kind (a spinning runtime would take cycles
from the training's own thread).
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
from provenance import footer, header, record  # noqa: E402

KINDS = ("horovodlike", "alone", "in-step", "exchange")


def worker(args):
    import torch
    import horovodlike.torch as hvd
    from allreduce import own_session
    from train_step import CLASSES, WIDTHS, build_model
    own_session()
    torch.set_num_threads(1)
    hvd.init()
    torch.manual_seed(0)
    synced = build_model()
    torch.manual_seed(0)
    plain = build_model()
    hvd.broadcast_parameters(synced.state_dict(), root_rank=0)
    hvd.broadcast_parameters(plain.state_dict(), root_rank=0)
    sync_opt = hvd.DistributedOptimizer(
        torch.optim.SGD(synced.parameters(), lr=1e-3, momentum=0.9),
        named_parameters=synced.named_parameters())
    plain_opt = torch.optim.SGD(plain.parameters(), lr=1e-3, momentum=0.9)
    generator = torch.Generator().manual_seed(1234 + hvd.rank())
    x = torch.randn(args.batch_size, WIDTHS[0], generator=generator)
    y = torch.randint(0, CLASSES, (args.batch_size,), generator=generator)
    loss_fn = torch.nn.CrossEntropyLoss()
    grads = [(name, torch.randn_like(p)) for name, p in plain.named_parameters()]
    one = torch.zeros(1)

    def train(model, optimizer):
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()

    def in_step():
        train(plain, plain_opt)
        hvd.allreduce_(one, name="in_step")

    def exchange():
        handles = [hvd.allreduce_async_(g, name=f"exchange.{name}") for name, g in grads]
        for handle in handles:
            hvd.synchronize(handle)

    steps = {"horovodlike": lambda: train(synced, sync_opt),
             "alone": lambda: train(plain, plain_opt), "in-step": in_step, "exchange": exchange}
    for kind in KINDS:
        for _ in range(args.warmup):
            steps[kind]()
    results = {kind: {"ms": [], "cpu_ms": []} for kind in KINDS}
    for round_ in range(args.rounds):
        shift = round_ % len(KINDS)
        for kind in KINDS[shift:] + KINDS[:shift]:
            hvd.allreduce_(one, name="window")  # every rank starts the window together
            cpu, start = time.process_time(), time.perf_counter()
            for _ in range(args.steps):
                steps[kind]()
            results[kind]["ms"].append(1e3 * (time.perf_counter() - start) / args.steps)
            results[kind]["cpu_ms"].append(1e3 * (time.process_time() - cpu) / args.steps)
    if hvd.rank() == 0:
        with open(args.out, "w") as f:
            json.dump({"kinds": results, "tensors": len(grads),
                       "parameters": sum(g.numel() for _, g in grads)}, f)
    hvd.shutdown()


def run(args) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOROVOD_")}
    env.update(args.env)
    from source_tree import jobs_pythonpath
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = jobs_pythonpath()
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        command = [sys.executable, "-m", "horovodlike.runner.launch", "-np", str(args.np),
                   sys.executable, os.path.abspath(__file__), "--worker", "--out", out,
                   "--rounds", str(args.rounds), "--steps", str(args.steps),
                   "--warmup", str(args.warmup), "--batch-size", str(args.batch_size)]
        done = subprocess.run(command, env=env, capture_output=True, text=True,
                              timeout=args.timeout)
        if done.returncode != 0 or not os.path.exists(out):
            raise SystemExit(f"the job failed:\n{(done.stdout + done.stderr)[-3000:]}")
        with open(out) as f:
            return json.load(f)


def report(result: dict, args) -> dict:
    kinds = result["kinds"]
    print(f"{args.np} ranks, batch {args.batch_size} per rank, "
          f"{result['parameters'] / 1e6:.1f}M parameters in {result['tensors']} tensors, SGD "
          f"with momentum; {args.rounds} rounds of one {args.steps}-step window per kind; "
          f"ms per step (rank 0)\n")
    print("| round | horovodlike | alone | in step | exchange | / (alone + exchange) | "
          "/ (in step + exchange) |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    to_alone, to_in_step = [], []
    for i in range(args.rounds):
        ours, alone, in_step, exchange = (kinds[k]["ms"][i] for k in KINDS)
        to_alone.append(ours / (alone + exchange))
        to_in_step.append(ours / (in_step + exchange))
        print(f"| {i + 1} | {ours:.1f} | {alone:.1f} | {in_step:.1f} | {exchange:.1f} | "
              f"{to_alone[-1]:.3f} | {to_in_step[-1]:.3f} |")
    print("\nhorovodlike's step against the bound of the same round: median "
          f"{statistics.median(to_alone):.3f}, worst {max(to_alone):.3f} (alone + exchange); "
          f"median {statistics.median(to_in_step):.3f}, worst {max(to_in_step):.3f} "
          "(in step + exchange)")
    print("rank 0's CPU time per step, median of the rounds: " + ", ".join(
        f"{k} {statistics.median(kinds[k]['cpu_ms']):.1f} ms" for k in KINDS))
    return {"to_alone": to_alone, "to_in_step": to_in_step}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=10, help="steps per window (default 10)")
    parser.add_argument("--warmup", type=int, default=3, help="steps of each kind first")
    parser.add_argument("--batch-size", type=int, default=32, help="per rank (default 32)")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="a setting for the job (repeatable), e.g. HOROVOD_OVERLAP=0; the "
                        "caller's HOROVOD_* variables are not passed on")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    from allreduce import env_settings, format_settings
    args.env = env_settings(parser, args.env)
    print(header(), flush=True)
    if args.env:
        print(f"settings: {format_settings(args.env)}")
    provenance = record()
    result = run(args)
    ratios = report(result, args)
    print(footer(), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**provenance, "np": args.np, "settings": args.env, **result, **ratios},
                      f, indent=1)


if __name__ == "__main__":
    main()
