"""Data parallel alone vs pipeline x data parallel vs ZeRO, for a model whose gradients are large.

    python benchmarks/pipeline.py --np 4 --json results.json     # one job per layout
    HOROVOD_SHM_DISABLE=1 horovodlikerun -np 4 python benchmarks/pipeline.py   # all in one job

Every layout trains the same MLP (--layers Linear layers of --width, Adam) on the same global
batch, on the job's ranks:
  dp            every rank holds the whole model; DistributedOptimizer averages all gradients
  zero          as dp, with ZeroRedundancyOptimizer: the Adam state sharded over the ranks
  pp2xdp2 1f1b  ProcessMesh (pp=2, dp=2): half the model per rank, gradients averaged over the
                two replicas of each stage, activations sent between stages
  pp4 gpipe / pp4 1f1b   one pipeline over all ranks, to compare the schedules' activation memory
  pp4 interleaved        the same with two stages per rank (ScheduleInterleaved1F1B)
Per layout and rank: the median step time, bytes sent per step, the parameter, optimizer state
and peak activation bytes. Bytes sent are counted for point-to-point (the tensors each rank sent)
and computed for the collectives as the ring algorithm moves them (2 (N-1)/N of the reduced
bytes per rank for an allreduce, and for ZeRO's reduce-scatter plus allgather alike). Peak
activation bytes are the tensors autograd saved for one micro-batch's backward (weights aside),
measured with saved_tensors_hooks, times the most micro-batches the rank held at once (over
all its stages, following its schedule's actions in order). Run over TCP
(HOROVOD_SHM_DISABLE=1), the bytes are also measured on the wire: the kernel's count of what
each rank's sockets sent during the timed steps (wire_bytes.py). Peak RSS is each rank's
resident high-water mark while the layout ran (RSS before: what the process held when it
started). With --np each layout runs in a job of its own, over TCP, so both are its own; in one
job the high-water mark is reset between layouts once freed memory is handed back, but what
earlier layouts left behind (the core's buffers) still counts. Step times depend on the
machine's load (printed); the bytes and memory figures do not.
"""

import argparse
import ctypes
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

import horovodlike.torch as hvd
from horovodlike.common.basics import build_info
from horovodlike.torch.pipelining import (PipelineStage, Schedule1F1B, ScheduleGPipe,
                                          ScheduleInterleaved1F1B, split_sequential)
from wire_bytes import tcp_bytes_sent
from source_tree import jobs_pythonpath

OVER_TCP = False  # set in main(): the kernel's TCP counters then see every byte sent


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=64, help="global batch")
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--steps", type=int, default=6, help="timed steps (after 2 warm-up)")
    parser.add_argument("--json", help="rank 0 writes every rank's figures here")
    parser.add_argument("--np", type=int, help="run one job of this many ranks per layout "
                        "(over TCP) instead of running inside the job")
    parser.add_argument("--layout", help="inside a job: run only this layout")
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


def reset_peak_rss():
    """Hands the memory the previous layout freed back to the system (glibc keeps freed heap
    pages otherwise, and the next layout would reuse them unseen), then starts a new high-water
    mark of this process's resident memory (Linux: clear_refs 5). Returns the resident bytes
    left: torch, the job, and what the earlier layouts still hold."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status("VmRSS:")


def _status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    return 0


def peak_rss():
    return _status("VmHWM:")


def timed(args, one_step):
    """(median step seconds, bytes this rank's TCP sockets sent per timed step, or None when
    the job does not run over TCP, peak resident bytes while the layout ran)."""
    times = []
    settle = 0.2  # lets the last sends leave before a reading
    for step in range(args.steps + 2):
        if step == 2:
            time.sleep(settle)
            wire_start = tcp_bytes_sent()
        start = time.perf_counter()
        one_step(step)
        if step >= 2:
            times.append(time.perf_counter() - start)
    time.sleep(settle)
    wire = (tcp_bytes_sent() - wire_start) / args.steps if OVER_TCP else None
    return statistics.median(times), wire, peak_rss()


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
    seconds, wire, rss = timed(args, one_step)
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    x, _ = batch(args, 0)
    return {"step_s": seconds, "bytes_sent": ring_bytes(param_bytes, n),
            "wire_bytes_sent": wire, "peak_rss_bytes": rss,
            "param_bytes": param_bytes,
            "optimizer_state_bytes": state_bytes(optimizer.optim if zero else optimizer),
            "peak_activation_bytes": saved_bytes(model, x[rows])}


def peak_held(actions):
    """The most micro-batches whose activations this rank holds at once, over all its stages,
    when it runs ``actions`` in order (a forward keeps one, its backward frees it)."""
    held = peak = 0
    for kind, _, _ in actions:
        held += 1 if kind == "F" else -1
        peak = max(peak, held)
    return peak


def pipelined(args, pp, schedule_class, stages_per_rank=1):
    n = hvd.size()
    mesh = hvd.ProcessMesh((pp, n // pp), ("pp", "dp"))
    pp_set, dp_set = mesh.process_set("pp"), mesh.process_set("dp")
    index, replicas, replica = pp_set.rank(), n // pp, mesh.coordinate("dp")
    num_stages = pp * stages_per_rank
    # Stage i runs on the pipeline's rank i % pp: an interleaved rank holds every pp-th part.
    parts = split_sequential(build_model(args), num_stages)[index::pp]
    stages = [PipelineStage(part, index + k * pp, num_stages, process_set=pp_set)
              for k, part in enumerate(parts)]
    schedule = schedule_class(stages if stages_per_rank > 1 else stages[0], args.microbatches,
                              loss_fn=F.mse_loss)
    params = [p for part in parts for p in part.parameters()]
    optimizer = hvd.DistributedOptimizer(
        torch.optim.Adam(params, lr=1e-4),
        named_parameters=[(f"{k}.{name}", p) for k, part in enumerate(parts)
                          for name, p in part.named_parameters()],
        backward_passes_per_step=args.microbatches, process_set=dp_set)
    per_replica = args.batch // replicas
    rows = slice(replica * per_replica, (replica + 1) * per_replica)
    first = any(stage.is_first for stage in stages)
    last = any(stage.is_last for stage in stages)

    def one_step(step):
        x, y = batch(args, step)
        optimizer.zero_grad()
        if first and last:
            schedule.step(x[rows], target=y[rows])
        elif first:
            schedule.step(x[rows])
        elif last:
            schedule.step(target=y[rows])
        else:
            schedule.step()
        optimizer.step()
    seconds, wire, rss = timed(args, one_step)
    p2p_per_step = schedule.bytes_sent / (args.steps + 2)
    param_bytes = sum(p.numel() * p.element_size() for p in params)
    microbatch = torch.randn(per_replica // args.microbatches, args.width)
    held = peak_held(schedule.actions)
    # Every part has the same layers, so one part's saved bytes stand for each.
    return {"step_s": seconds, "bytes_sent": p2p_per_step + ring_bytes(param_bytes, replicas),
            "wire_bytes_sent": wire, "peak_rss_bytes": rss,
            "p2p_bytes_sent": p2p_per_step, "param_bytes": param_bytes,
            "optimizer_state_bytes": state_bytes(optimizer),
            "peak_microbatches": held,
            "peak_activation_bytes": held * saved_bytes(parts[0], microbatch)}


def layouts_for(args, n):
    """(name, run) of every layout a job of n ranks can take."""
    layouts = [("dp", lambda: data_parallel(args, zero=False)),
               ("zero", lambda: data_parallel(args, zero=True))]
    if n % 2 == 0 and n > 2:
        layouts.append((f"pp2xdp{n // 2} 1f1b", lambda: pipelined(args, 2, Schedule1F1B)))
    layouts += [(f"pp{n} gpipe", lambda: pipelined(args, n, ScheduleGPipe)),
                (f"pp{n} 1f1b", lambda: pipelined(args, n, Schedule1F1B))]
    if args.layers % (2 * n) == 0 and args.microbatches % n == 0:
        layouts.append((f"pp{n} interleaved", lambda: pipelined(
            args, n, ScheduleInterleaved1F1B, stages_per_rank=2)))
    return layouts


def print_table(args, n, load, results):
    mb = 1 << 20
    print(f"{n} ranks on {os.cpu_count()} cores (load average {load:.1f}), {args.layers} x "
          f"Linear({args.width}, {args.width}), Adam, global batch {args.batch}, "
          f"{args.microbatches} micro-batches; per rank: max (min) over ranks")
    print("sent: counted (tensors sent point-to-point, collectives at the ring's cost); "
          "on the wire: the kernel's TCP counters (negotiation included; only when the job "
          "runs over TCP, HOROVOD_SHM_DISABLE=1); peak RSS: the process's resident high-water "
          "mark while the layout ran (torch itself included), RSS before: what the process held "
          "when the layout started (freed memory returned; with --np each layout runs in a "
          "job of its own)")
    print(f"{'layout':<16}{'step ms':>20}{'sent MB/step':>14}{'on the wire':>14}"
          f"{'params MB':>13}{'Adam state MB':>15}{'peak act. MB':>14}{'held':>11}"
          f"{'peak RSS MB':>16}{'RSS before MB':>16}")
    for name, per_rank in results.items():
        def span(key, scale=1.0):
            values = [r[key] * scale for r in per_rank]
            if any(v is None for v in values):
                return "-"
            return f"{max(values):.1f} ({min(values):.1f})"
        print(f"{name:<16}{span('step_s', 1e3):>20}{span('bytes_sent', 1 / mb):>14}"
              f"{span('wire_bytes_sent', 1 / mb):>14}"
              f"{span('param_bytes', 1 / mb):>13}{span('optimizer_state_bytes', 1 / mb):>15}"
              f"{span('peak_activation_bytes', 1 / mb):>14}"
              f"{span('peak_microbatches') if 'peak_microbatches' in per_rank[0] else '-':>11}"
              f"{span('peak_rss_bytes', 1 / mb):>16}{span('rss_before_bytes', 1 / mb):>16}",
              flush=True)


def run_jobs(args):
    """--np N: one job of N ranks per layout, over TCP, so that each layout's peak memory is
    its own and the wire counters see every byte; then one table."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, HOROVOD_SHM_DISABLE="1", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = jobs_pythonpath()
    loads, results = [os.getloadavg()[0]], {}
    for name, _ in layouts_for(args, args.np):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "layout.json")
            subprocess.run([sys.executable, "-m", "horovodlike.runner.launch", "-np",
                            str(args.np), sys.executable, os.path.abspath(__file__),
                            "--layout", name, "--json", out, "--width", str(args.width),
                            "--layers", str(args.layers), "--batch", str(args.batch),
                            "--microbatches", str(args.microbatches), "--steps",
                            str(args.steps)], env=env, check=True, cwd=repo,
                           stdout=subprocess.DEVNULL)
            with open(out) as f:
                results.update(json.load(f)["results"])
        loads.append(os.getloadavg()[0])
    print_table(args, args.np, max(loads), results)
    return {"args": vars(args), "ranks": args.np, "cores": os.cpu_count(),
            "load_average": loads, "results": results}


def main():
    global OVER_TCP
    args = parse_args()
    if args.np:
        raw = run_jobs(args)
    else:
        hvd.init()
        OVER_TCP = build_info()["cpu_operations"] == "tcp"
        n = hvd.size()
        results = {}
        for name, run in layouts_for(args, n):
            if args.layout and name != args.layout:
                continue
            hvd.barrier()
            baseline = reset_peak_rss()
            figures = run()
            figures["rss_before_bytes"] = baseline
            results[name] = hvd.allgather_object(figures,
                                                 name=f"bench.{name.replace(' ', '_')}")
        if args.layout and not results:
            raise SystemExit(f"--layout {args.layout!r}: not one of "
                             f"{[name for name, _ in layouts_for(args, n)]}")
        if hvd.rank() != 0:
            return
        load = os.getloadavg()[0]
        if not args.layout:
            print_table(args, n, load, results)
        raw = {"args": vars(args), "ranks": n, "cores": os.cpu_count(),
               "load_average": load, "results": results}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(raw, f, indent=1)


if __name__ == "__main__":
    main()
