"""Data parallel alone vs pipeline x data parallel vs ZeRO, for a model whose gradients are large.

    horovodlikerun -np 4 python benchmarks/pipeline.py --json results.json

Every layout trains the same MLP (--layers Linear layers of --width, Adam) on the same global
batch, on the job's ranks:
  dp            every rank holds the whole model; DistributedOptimizer averages all gradients
  zero          as dp, with ZeroRedundancyOptimizer: the Adam state sharded over the ranks
  pp2xdp2 1f1b  ProcessMesh (pp=2, dp=2): half the model per rank, gradients averaged over the
                two replicas of each stage, activations sent between stages
  pp4 gpipe / pp4 1f1b   one pipeline over all ranks, to compare the schedules' activation memory
Per layout and rank: the median step time, bytes sent per step, the parameter, optimizer state
and peak activation bytes. Bytes sent are counted for point-to-point (the tensors each rank sent)
and computed for the collectives as the ring algorithm moves them (2 (N-1)/N of the reduced
bytes per rank for an allreduce, and for ZeRO's reduce-scatter plus allgather alike). Peak
activation bytes are the tensors autograd saved for one micro-batch's backward (weights aside),
measured with saved_tensors_hooks, times the most micro-batches a stage held at once.
"""

import argparse
import json
import os
import statistics
import time

import torch
import torch.nn.functional as F

import horovodlike.torch as hvd
from horovodlike.torch.pipelining import (PipelineStage, Schedule1F1B, ScheduleGPipe,
                                          split_sequential)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=64, help="global batch")
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--steps", type=int, default=6, help="timed steps (after 2 warm-up)")
    parser.add_argument("--json", help="rank 0 writes every rank's figures here")
    return parser.parse_args()


def build_model(args):
    torch.manual_seed(0)
    layers = []
    for i in range(args.layers):
        layers.append(torch.nn.Sequential(torch.nn.Linear(args.width, args.width),
                                          torch.nn.ReLU()))
    return torch.nn.Sequential(*layers)


def batch(args, step):
    g = torch.Generator().manual_seed(step)
    return torch.randn(args.batch, args.width, generator=g), \
        torch.randn(args.batch, args.width, generator=g)


def saved_bytes(module, x):
    """Bytes of the tensors autograd keeps from one forward of ``module`` on ``x``, not counting
    the parameters it keeps references to (they are there anyway)."""
    total = [0]
    weights = {p.untyped_storage().data_ptr() for p in module.parameters()}

    def pack(t):
        if t.untyped_storage().data_ptr() not in weights:
            total[0] += t.numel() * t.element_size()
        return t
    x = x.detach().requires_grad_(True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(x)
    return total[0]


def state_bytes(optimizer):
    return sum(v.numel() * v.element_size() for state in optimizer.state.values()
               for v in state.values() if torch.is_tensor(v))


def ring_bytes(nbytes, n):
    return 2 * (n - 1) / n * nbytes if n > 1 else 0


def timed(args, one_step):
    times = []
    for step in range(args.steps + 2):
        start = time.perf_counter()
        one_step(step)
        if step >= 2:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def data_parallel(args, zero):
    model = build_model(args)
    n = hvd.size()
    if zero:
        optimizer = hvd.ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, lr=1e-4)
    else:
        optimizer = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=1e-4),
                                             named_parameters=model.named_parameters())
    rows = slice(hvd.rank() * args.batch // n, (hvd.rank() + 1) * args.batch // n)

    def one_step(step):
        x, y = batch(args, step)
        optimizer.zero_grad()
        F.mse_loss(model(x[rows]), y[rows]).backward()
        optimizer.step()
    seconds = timed(args, one_step)
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    x, _ = batch(args, 0)
    return {"step_s": seconds, "bytes_sent": ring_bytes(param_bytes, n),
            "param_bytes": param_bytes,
            "optimizer_state_bytes": state_bytes(optimizer.optim if zero else optimizer),
            "peak_activation_bytes": saved_bytes(model, x[rows])}


def pipelined(args, pp, schedule_class):
    n = hvd.size()
    mesh = hvd.ProcessMesh((pp, n // pp), ("pp", "dp"))
    pp_set, dp_set = mesh.process_set("pp"), mesh.process_set("dp")
    index, replicas, replica = pp_set.rank(), n // pp, mesh.coordinate("dp")
    part = split_sequential(build_model(args), pp)[index]
    stage = PipelineStage(part, index, pp, process_set=pp_set)
    schedule = schedule_class(stage, args.microbatches, loss_fn=F.mse_loss)
    optimizer = hvd.DistributedOptimizer(torch.optim.Adam(part.parameters(), lr=1e-4),
                                         named_parameters=part.named_parameters(),
                                         backward_passes_per_step=args.microbatches,
                                         process_set=dp_set)
    per_replica = args.batch // replicas
    rows = slice(replica * per_replica, (replica + 1) * per_replica)

    def one_step(step):
        x, y = batch(args, step)
        optimizer.zero_grad()
        if stage.is_first:
            schedule.step(x[rows])
        elif stage.is_last:
            schedule.step(target=y[rows])
        else:
            schedule.step()
        optimizer.step()
    seconds = timed(args, one_step)
    p2p_per_step = schedule.bytes_sent / (args.steps + 2)
    param_bytes = sum(p.numel() * p.element_size() for p in part.parameters())
    microbatch = torch.randn(per_replica // args.microbatches, args.width)
    return {"step_s": seconds, "bytes_sent": p2p_per_step + ring_bytes(param_bytes, replicas),
            "p2p_bytes_sent": p2p_per_step, "param_bytes": param_bytes,
            "optimizer_state_bytes": state_bytes(optimizer),
            "peak_microbatches": stage.peak_saved,
            "peak_activation_bytes": stage.peak_saved * saved_bytes(part, microbatch)}


def main():
    args = parse_args()
    hvd.init()
    n = hvd.size()
    layouts = [("dp", lambda: data_parallel(args, zero=False)),
               ("zero", lambda: data_parallel(args, zero=True))]
    if n % 2 == 0 and n > 2:
        layouts.append((f"pp2xdp{n // 2} 1f1b", lambda: pipelined(args, 2, Schedule1F1B)))
    layouts += [(f"pp{n} gpipe", lambda: pipelined(args, n, ScheduleGPipe)),
                (f"pp{n} 1f1b", lambda: pipelined(args, n, Schedule1F1B))]
    results = {}
    for name, run in layouts:
        hvd.barrier()
        results[name] = hvd.allgather_object(run(), name=f"bench.{name.replace(' ', '_')}")
    if hvd.rank() != 0:
        return
    mb = 1 << 20
    load = os.getloadavg()[0]
    print(f"{n} ranks on {os.cpu_count()} cores (load average {load:.1f}), {args.layers} x "
          f"Linear({args.width}, {args.width}), Adam, global batch {args.batch}, "
          f"{args.microbatches} micro-batches; per rank: max (min) over ranks")
    print(f"{'layout':<16}{'step ms':>10}{'sent MB/step':>16}{'params MB':>12}"
          f"{'Adam state MB':>16}{'peak act. MB':>16}")
    for name, per_rank in results.items():
        def span(key, scale=1.0):
            values = [r[key] * scale for r in per_rank]
            return f"{max(values):.1f} ({min(values):.1f})"
        print(f"{name:<16}{span('step_s', 1e3):>10}{span('bytes_sent', 1 / mb):>16}"
              f"{span('param_bytes', 1 / mb):>12}{span('optimizer_state_bytes', 1 / mb):>16}"
              f"{span('peak_activation_bytes', 1 / mb):>16}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "ranks": n, "cores": os.cpu_count(),
                       "load_average": load, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
