"""Training throughput: horovodlike's DistributedOptimizer beside torch DistributedDataParallel
with Gloo, same model, same synthetic data, same machine, in the same run.

    python benchmarks/train_step.py --np 2

The model is a stack of Linear + LayerNorm layers of mixed widths (23.0 million parameters in
66 tensors, from 10 values to 2 million): many gradients of different sizes, as in real
networks, so that the comparison covers the per-tensor overheads and the fusion of small
tensors as well as bandwidth. Each rank trains on its own synthetic batch with SGD + momentum;
each job reports samples/s over all ranks (median over its timed windows). The jobs run in
turns (--repeat rounds); the table gives the median over rounds and the ratio to DDP.
A third job, "no sync", trains the same ranks without any gradient exchange: the ceiling that
communication can only lower. A fourth, "exchange", runs only the exchange of a step (the
model's 66 gradients allreduced as DistributedOptimizer does: all started, then all waited
for), without forward or backward: with no core free for it, a step cannot take less than the
ceiling's step plus that, which bounds what any overlap can reach.

    python benchmarks/train_step.py --np 2 --cuda

runs the same step on GPUs (rank r on GPU r mod the GPUs visible; each timed window ends with
torch.cuda.synchronize()): horovodlike's DistributedOptimizer, no exchange, and DDP over NCCL
(which needs a GPU per rank: NCCL refuses several ranks on one GPU, and DDP is then left out).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from provenance import footer, header, record
from source_tree import jobs_pythonpath

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WIDTHS = [512, 1024, 1536, 1024, 2048, 1024, 1536, 768, 1024, 2048, 1024, 512, 1024, 1536, 1024,
          2048, 512]
CLASSES = 10
CPU_MS_PER_STEP: list[float] = []  # time_windows' measurement, for _write


def build_model():
    import torch.nn as nn
    layers = []
    for fan_in, fan_out in zip(WIDTHS[:-1], WIDTHS[1:]):
        layers += [nn.Linear(fan_in, fan_out), nn.LayerNorm(fan_out), nn.GELU()]
    layers.append(nn.Linear(WIDTHS[-1], CLASSES))
    return nn.Sequential(*layers)


def setup(args, local_rank):
    """One compute thread per rank, and (--cuda) this rank's GPU: (device, finish), finish
    waiting for the GPU's queued work (gpu_setup.bench_device)."""
    import torch
    from gpu_setup import bench_device
    torch.set_num_threads(1)
    return bench_device(args.cuda, local_rank)


def train(args, model, optimizer, rank, world, device=None, finish=None):
    """Runs warm-up then timed windows of steps; returns samples/s over all ranks per window."""
    import torch
    generator = torch.Generator().manual_seed(1234 + rank)
    x = torch.randn(args.batch_size, WIDTHS[0], generator=generator).to(device)
    y = torch.randint(0, CLASSES, (args.batch_size,), generator=generator).to(device)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()

    return time_windows(args, step, world, finish)


def time_windows(args, step, world, finish=None):
    """Warm-up steps, then samples/s over all ranks in each timed window of `args.steps`;
    `finish` (CUDA) waits for the queued work at the end of the warm-up and of each window."""
    finish = finish or (lambda: None)
    for _ in range(args.warmup):
        step()
    finish()
    rates = []
    cpu_start = time.process_time()
    for _ in range(args.windows):
        start = time.perf_counter()
        for _ in range(args.steps):
            step()
        finish()
        elapsed = time.perf_counter() - start
        rates.append(args.batch_size * world * args.steps / elapsed)
    # CPU time of every thread of this process (the training's, the runtime's, a spinner's),
    # per step: what the exchange takes from a machine that has other work to do.
    CPU_MS_PER_STEP.append(1e3 * (time.process_time() - cpu_start) / (args.windows * args.steps))
    return rates


def worker_horovodlike(args):
    import torch
    import horovodlike.torch as hvd
    torch.set_num_threads(1)
    hvd.init()
    device, finish = setup(args, hvd.local_rank())
    torch.manual_seed(0)
    model = build_model().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    rates = train(args, model, optimizer, hvd.rank(), hvd.size(), device, finish)
    if args.trace_dir:
        trace_steps(args, model, optimizer, hvd)
    if hvd.rank() == 0:
        from horovodlike import _core
        stats = _core.stats()
        _write(args.out, rates, model, {k: stats[k] for k in (
            "fusion_threshold_bytes", "cycle_time_ms", "cache_enabled", "autotune",
            "autotune_done")})
    hvd.shutdown()


def trace_steps(args, model, optimizer, hvd, steps=3):
    """A few more steps with the timeline recording (rank 0 writes it) and each phase's start
    and end on rank 0, in microseconds since the recording began (the timeline's own clock:
    both are CLOCK_MONOTONIC)."""
    import torch
    generator = torch.Generator().manual_seed(99)
    device = next(model.parameters()).device
    x = torch.randn(args.batch_size, WIDTHS[0], generator=generator).to(device)
    y = torch.randint(0, CLASSES, (args.batch_size,), generator=generator).to(device)
    loss_fn = torch.nn.CrossEntropyLoss()
    before = time.perf_counter()
    hvd.start_timeline(os.path.join(args.trace_dir, "timeline.json"))
    origin = (before + time.perf_counter()) / 2

    def now():
        return (time.perf_counter() - origin) * 1e6
    spans = []
    for _ in range(steps):
        start = now()
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        backward = now()
        loss.backward()
        backward_end = now()
        optimizer.step()
        spans.append({"forward": [start, backward], "backward": [backward, backward_end],
                      "wait_and_update": [backward_end, now()]})
    hvd.stop_timeline()
    if hvd.rank() == 0:
        with open(os.path.join(args.trace_dir, "steps.json"), "w") as f:
            json.dump(spans, f)


def worker_ddp(args):
    import torch
    import torch.distributed as dist
    device, finish = setup(args, int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl" if args.cuda else "gloo")
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(build_model().to(device))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    rates = train(args, model, optimizer, dist.get_rank(), dist.get_world_size(), device,
                  finish)
    if dist.get_rank() == 0:
        _write(args.out, rates, model)
    dist.destroy_process_group()


def worker_nosync(args):
    import torch
    device, finish = setup(args, int(os.environ["LOCAL_RANK"]))
    torch.manual_seed(0)
    model = build_model().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    rates = train(args, model, optimizer, rank, world, device, finish)
    if rank == 0:
        _write(args.out, rates, model)


def worker_exchange(args):
    import torch
    import horovodlike.torch as hvd
    torch.set_num_threads(1)
    hvd.init()
    device, finish = setup(args, hvd.local_rank())
    torch.manual_seed(0)
    model = build_model().to(device)
    grads = [(name, torch.randn_like(p)) for name, p in model.named_parameters()]

    def step():
        handles = [hvd.allreduce_async_(g, name=f"exchange.{name}") for name, g in grads]
        for handle in handles:
            hvd.synchronize(handle)

    rates = time_windows(args, step, hvd.size(), finish)
    if hvd.rank() == 0:
        _write(args.out, rates, model)
    hvd.shutdown()


WORKERS = {"horovodlike": worker_horovodlike, "ddp": worker_ddp, "nosync": worker_nosync,
           "exchange": worker_exchange}


def _write(path, rates, model, settings=None):
    params = list(model.parameters())
    with open(path, "w") as f:
        json.dump({"rates": rates, "tensors": len(params),
                   "cpu_ms_per_step": CPU_MS_PER_STEP[-1] if CPU_MS_PER_STEP else None,
                   "parameters": sum(p.numel() for p in params), "settings": settings}, f)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_job(kind, args, worker_args, launcher_args=()):
    """One job; `launcher_args`: extra horovodlikerun flags for the horovodlike job."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOROVOD_")}
    if kind in LAUNCHED:
        env.update(getattr(args, "env", None) or {})
    if kind == "variant":  # the horovodlike job again, with --variant's settings
        env.update(args.variant)
    worker = "horovodlike" if kind == "variant" else kind
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = jobs_pythonpath()
    me = os.path.abspath(__file__)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        tail = ["--worker", worker, "--out", out] + worker_args
        # Only the job itself is traced: the variant would write over its trace.
        if kind == "horovodlike" and getattr(args, "trace_dir", None):
            tail += ["--trace-dir", os.path.abspath(args.trace_dir)]
        if kind in LAUNCHED:
            procs = [subprocess.Popen([sys.executable, "-m", "horovodlike.runner.launch", "-np",
                                       str(args.np), *launcher_args, sys.executable, me] + tail,
                                      env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)]
        else:
            env.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()),
                        "WORLD_SIZE": str(args.np)})
            procs = [subprocess.Popen([sys.executable, me] + tail,
                                      env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                     for r in range(args.np)]
        outputs = [p.communicate(timeout=args.timeout)[0] for p in procs]
        if any(p.returncode != 0 for p in procs) or not os.path.exists(out):
            raise RuntimeError(f"{kind} failed:\n" + "\n".join(outputs)[-3000:])
        with open(out) as f:
            return json.load(f)


LABELS = {"horovodlike": "horovodlike DistributedOptimizer", "ddp": "torch DDP (Gloo)",
          "nosync": "no sync (ceiling)", "exchange": "exchange alone (no compute)"}
LAUNCHED = ("horovodlike", "variant", "exchange")  # the jobs horovodlikerun starts


def cuda_kinds(parser, args, kinds, env):
    """--cuda: fails clearly without a GPU; DDP runs over NCCL, and is left out (with a note)
    when ranks would share a GPU, which NCCL refuses."""
    from gpu_setup import horovodlike_gpu_report, require_cuda
    gpus = require_cuda(parser, env)
    print(f"{gpus} GPU(s) visible\n{horovodlike_gpu_report(env)}", flush=True)
    LABELS["ddp"] = "torch DDP (NCCL)"
    if "ddp" in kinds and args.np > gpus:
        print(f"skipped: torch DDP (NCCL): {args.np} ranks on {gpus} GPU(s), and NCCL refuses "
              "several ranks on one GPU", flush=True)
        kinds = [k for k in kinds if k != "ddp"]
    return kinds


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank (default 32)")
    parser.add_argument("--steps", type=int, default=10, help="steps per timed window")
    parser.add_argument("--windows", type=int, default=5, help="timed windows per job")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=3, help="rounds of all jobs (default 3)")
    parser.add_argument("--only", default="",
                        help="comma-separated: horovodlike,ddp,nosync,exchange (default: the "
                        "first three)")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--trace-dir", help="horovodlike job: after the timed windows, 3 steps "
                        "with the timeline recording; rank 0 writes timeline.json and steps.json "
                        "(its forward, backward and wait spans) here, for timeline_plot.py")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="a setting for the horovodlike job (repeatable), e.g. "
                        "HOROVOD_CYCLE_TIME=5; the caller's HOROVOD_* variables are not passed on")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=VALUE",
                        help="run the horovodlike job a second time in every round with these "
                        "settings (repeatable), to compare a setting within the same rounds")
    parser.add_argument("--cuda", action="store_true",
                        help="train on GPUs (rank r on GPU r mod the GPUs visible), DDP over NCCL")
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from allreduce import _base_env, env_settings, format_settings
    args.env = env_settings(parser, args.env)
    args.variant = env_settings(parser, args.variant)
    if args.worker:
        from allreduce import own_session
        own_session()  # as horovodlike's launched ranks are: see allreduce.own_session
        WORKERS[args.worker](args)
        return

    wanted = set(filter(None, args.only.split(",")))
    if wanted - set(WORKERS):
        parser.error(f"--only: {', '.join(sorted(wanted - set(WORKERS)))} is not one of "
                     f"{', '.join(WORKERS)}")
    kinds = [k for k in WORKERS if k in wanted or (not wanted and k != "exchange")]
    if args.cuda:
        kinds = cuda_kinds(parser, args, kinds, _base_env())
    if args.variant:
        kinds.insert(kinds.index("horovodlike") + 1 if "horovodlike" in kinds else 0, "variant")
        LABELS["variant"] = f"horovodlike with {format_settings(args.variant)}"
    worker_args = ["--batch-size", str(args.batch_size), "--steps", str(args.steps),
                   "--windows", str(args.windows), "--warmup", str(args.warmup)]
    worker_args += ["--cuda"] if args.cuda else []
    print(header(), flush=True)
    provenance = record()
    per_round = {k: [] for k in kinds}
    cpu = {k: [] for k in kinds}
    model_info = {}
    for round_ in range(args.repeat):
        # Every other round in the opposite order: a job that always follows the same one
        # inherits its aftermath (caches, the scheduler's placement, a machine warming up).
        for kind in (kinds[::-1] if round_ % 2 else kinds):
            start = time.time()
            result = run_job(kind, args, worker_args)
            per_round[kind].append(statistics.median(result["rates"]))
            cpu[kind].append(result.get("cpu_ms_per_step"))
            model_info = {"tensors": result["tensors"], "parameters": result["parameters"]}
            print(f"round {round_ + 1}/{args.repeat}: {LABELS[kind]}: "
                  f"{per_round[kind][-1]:.1f} samples/s, rank 0 CPU "
                  f"{cpu[kind][-1] or 0:.1f} ms per step ({time.time() - start:.0f} s)",
                  flush=True)

    table = {k: statistics.median(v) for k, v in per_round.items() if v}
    print()
    print(f"training throughput{' on GPUs' if args.cuda else ''}, {args.np} ranks, batch "
          f"{args.batch_size} per rank, "
          f"{model_info.get('parameters', 0) / 1e6:.1f}M parameters in "
          f"{model_info.get('tensors', 0)} tensors, SGD with momentum, median of "
          f"{args.repeat} rounds")
    rows = [["job", "samples/s", "vs DDP", "vs ceiling", "CPU ms/step (rank 0)"]]
    for kind, rate in table.items():
        if kind == "exchange":
            continue
        ratios = [f"{rate / table[k]:.2f}x" if k in table else "-" for k in ("ddp", "nosync")]
        cpu_ms = [c for c in cpu[kind] if c is not None]
        rows.append([LABELS[kind], f"{rate:.1f}", *ratios,
                     f"{statistics.median(cpu_ms):.1f}" if cpu_ms else "-"])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for i, row in enumerate(rows):
        print("| " + " | ".join(c.ljust(w) if j == 0 else c.rjust(w)
                                for j, (c, w) in enumerate(zip(row, widths))) + " |")
        if i == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    samples_per_step = args.batch_size * args.np
    if "exchange" in table:
        # The bound takes the fastest exchange seen: what a step could at best reach.
        exchange_ms = 1e3 * samples_per_step / table["exchange"]
        best_ms = 1e3 * samples_per_step / max(per_round["exchange"])
        print(f"\nexchange alone (the step's gradients allreduced as DistributedOptimizer does, "
              f"no compute): {exchange_ms:.1f} ms per step (best round {best_ms:.1f} ms)")
        if "nosync" in table:
            ceiling_ms = 1e3 * samples_per_step / table["nosync"]
            print(f"ceiling step {ceiling_ms:.1f} ms; with no core free for the exchange a step "
                  f"takes at least {ceiling_ms + best_ms:.1f} ms: at most "
                  f"{ceiling_ms / (ceiling_ms + best_ms):.2f}x of the ceiling")
    print_bound_per_round(per_round, samples_per_step)
    print(footer(), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**provenance, "np": args.np, "samples_per_s": table,
                       "per_round": per_round, "cpu_ms_per_step": cpu, **model_info}, f,
                      indent=1)


def print_bound_per_round(per_round: dict, samples_per_step: int) -> None:
    """Each round's horovodlike step against that round's bound (its ceiling step plus its
    exchange alone): every round, not only the medians."""
    if not all(per_round.get(k) for k in ("horovodlike", "nosync", "exchange")):
        return
    print("\nper round: horovodlike step / (ceiling step + exchange alone) of the same round")
    for i, (ours, ceiling, exchange) in enumerate(zip(per_round["horovodlike"],
                                                      per_round["nosync"],
                                                      per_round["exchange"])):
        step, bound = samples_per_step / ours, samples_per_step / ceiling + \
            samples_per_step / exchange
        print(f"round {i + 1}: {1e3 * step:.1f} ms / {1e3 * bound:.1f} ms = {step / bound:.3f}")


if __name__ == "__main__":
    main()
