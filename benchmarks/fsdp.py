"""horovodlike's fully_shard beside PyTorch's FSDP2, DDP, DistributedOptimizer and
ZeroRedundancyOptimizer: step time, bytes sent, memory per rank and the losses, on one model.

    python benchmarks/fsdp.py [--ranks 2,4] [--repeat 3] [--steps 8] [--out results.txt]

Every library trains the same small transformer (blocks of LayerNorm, self-attention and an MLP,
then a LayerNorm and a linear head; float32, Adam) from the same seed on the same global batch,
each rank taking its equal slice, one thread per rank. The fully sharded ones wrap each block
and the head, then the root (which has no parameters of its own). PyTorch's jobs meet through
their own rendezvous (TCPStore, Gloo, ``init_device_mesh("cpu", (n,))``); horovodlike's go
through its launcher. Everything runs over TCP (HOROVOD_SHM_DISABLE=1), so that bytes sent per
rank are read from the kernel's socket counters (wire_bytes.py) around the timed steps.

Memory per rank, two ways: the tensors the model and the optimizer hold (distinct storages of
parameters, gathered parameters, gradients and optimizer state, a DTensor by its local shard),
sampled at every module's forward and backward boundaries and after each step, the peak kept;
and the peak resident set size, with its growth from just before the first step. The bound
checked for the fully sharded libraries is 1/N of the unsharded footprint (parameters,
gradients, Adam's two moments: 16 bytes a parameter) plus one wrapped module's unsharded
parameters and gradients (8 bytes a parameter), the largest.

Each round runs every library once per rank count, in turns, so that load hits them alike. The
losses of every run are checked against one process training the whole batch.
"""

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from wire_bytes import tcp_bytes_sent  # noqa: E402
from source_tree import jobs_pythonpath  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIBRARIES = ("hvd-fully_shard", "torch-fully_shard", "torch-ddp", "hvd-dp", "hvd-zero")
SHARDED = ("hvd-fully_shard", "torch-fully_shard")
WARMUP = 2
LOSS_RTOL = 1e-4


def build_model(dim, blocks, heads=4):
    """The benchmark's model, its parameters from seed 0."""
    import torch
    import torch.nn.functional as F

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1, self.norm2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
            self.qkv, self.proj = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)
            self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(),
                                           torch.nn.Linear(4 * dim, dim))

        def forward(self, x):
            b, t, d = x.shape
            q, k, v = (a.reshape(b, t, heads, d // heads).transpose(1, 2)
                       for a in self.qkv(self.norm1(x)).chunk(3, dim=-1))
            attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(attended.transpose(1, 2).reshape(b, t, d))
            return x + self.mlp(self.norm2(x))

    torch.manual_seed(0)
    return torch.nn.Sequential(*[Block() for _ in range(blocks)],
                               torch.nn.Sequential(torch.nn.LayerNorm(dim),
                                                   torch.nn.Linear(dim, dim)))


def batches(steps, batch, seq, dim):
    """The global batches, the same for every library and the reference."""
    import torch
    generator = torch.Generator().manual_seed(1)
    return [(torch.randn(batch, seq, dim, generator=generator),
             torch.randn(batch, seq, dim, generator=generator)) for _ in range(steps)]


def memory_bound(parameters, largest_module, ranks):
    """Bytes: 1/N of the unsharded footprint (parameters, gradients and Adam's two moments,
    float32) plus the largest wrapped module's unsharded parameters and gradients."""
    return 16 * parameters / ranks + 8 * largest_module


def reference_losses(args):
    """One process, the whole batch, plain Adam: the losses every library must reproduce."""
    import torch
    torch.set_num_threads(1)
    model = build_model(args.dim, args.blocks)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    losses = []
    for x, y in batches(WARMUP + args.steps + 1, args.batch, args.seq, args.dim):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


# ------------------------------------------------------------------ memory held by tensors

def _local(tensor):
    local = getattr(tensor, "_local_tensor", None)    # a DTensor: this rank's shard
    return tensor if local is None else local


def held_bytes(model, optimizer_state):
    """Bytes of the distinct storages that the modules (parameters, buffers, tensors set as
    attributes: gathered views) and their gradients, and the optimizer's state, reference."""
    import torch
    seen = {}

    def add(tensor):
        if torch.is_tensor(tensor):
            storage = _local(tensor).untyped_storage()
            if storage.nbytes():
                seen[storage.data_ptr()] = storage.nbytes()

    for module in model.modules():
        tensors = [*module._parameters.values(), *module._buffers.values(),
                   *(v for v in vars(module).values() if torch.is_tensor(v))]
        for tensor in tensors:
            for held in (tensor, getattr(tensor, "_base", None)):   # a view: its base too
                if held is not None:
                    add(held)
                    add(held.grad if held.is_leaf else None)
    for state in optimizer_state().values():
        for value in state.values():
            add(value)
    return sum(seen.values())


class PeakSampler:
    """Samples held_bytes at every module's forward and backward boundaries while on."""

    def __init__(self, model, optimizer_state):
        self.model, self.state, self.peak, self.on = model, optimizer_state, 0, False
        sample = lambda *_: self.sample()  # noqa: E731
        for module in model.modules():
            module.register_forward_pre_hook(sample)
            module.register_forward_hook(sample)
            if not list(module.children()):   # leaves: inside the wrapped modules
                module.register_full_backward_pre_hook(sample)
                module.register_full_backward_hook(sample)

    def sample(self):
        if self.on:
            self.peak = max(self.peak, held_bytes(self.model, self.state))


def _rss():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS"))


# ------------------------------------------------------------------ the ranks

def _setup(library, model, n, lr):
    """(optimizer, optimizer state getter, barrier, wrapped modules) for ``library``."""
    import torch
    if library.startswith("torch"):
        import torch.distributed as dist
        barrier = dist.barrier
    else:
        import horovodlike.torch as hvd
        barrier = hvd.barrier
    units = list(model)
    if library == "hvd-fully_shard":
        from horovodlike.torch.fsdp import fully_shard
        for unit in units:
            fully_shard(unit)
        fully_shard(model)
    elif library == "torch-fully_shard":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard as torch_fully_shard
        mesh = init_device_mesh("cpu", (n,))
        for unit in units:
            torch_fully_shard(unit, mesh=mesh)
        torch_fully_shard(model, mesh=mesh)
    elif library == "torch-ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    if library == "hvd-dp":
        optimizer = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=lr),
                                             named_parameters=model.named_parameters())
        return model, optimizer, lambda: optimizer.state, barrier
    if library == "hvd-zero":
        optimizer = hvd.ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, lr=lr)
        return model, optimizer, lambda: optimizer.optim.state, barrier
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    return model, optimizer, lambda: optimizer.state, barrier


def _train(model, optimizer, data, rank, n):
    import torch
    x, y = data
    share = x.shape[0] // n
    mine = slice(rank * share, (rank + 1) * share)
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x[mine]), y[mine])
    loss.backward()
    optimizer.step()
    return loss.item()


def worker(args):
    import torch
    torch.set_num_threads(1)
    if args.worker.startswith("torch"):
        import torch.distributed as dist
        dist.init_process_group("gloo")
        rank, n = dist.get_rank(), dist.get_world_size()
    else:
        import horovodlike.torch as hvd
        hvd.init()
        rank, n = hvd.rank(), hvd.size()
    plain = build_model(args.dim, args.blocks)
    parameters = sum(p.numel() for p in plain.parameters())
    largest = max(sum(p.numel() for p in unit.parameters()) for unit in plain)
    model, optimizer, state, barrier = _setup(args.worker, plain, n, args.lr)
    data = batches(WARMUP + args.steps + 1, args.batch, args.seq, args.dim)
    rss_before = _rss()
    losses = [_train(model, optimizer, d, rank, n) for d in data[:WARMUP]]
    barrier()
    sent_before, start = tcp_bytes_sent(), time.perf_counter()
    losses += [_train(model, optimizer, d, rank, n) for d in data[WARMUP:-1]]
    barrier()
    elapsed, sent = time.perf_counter() - start, tcp_bytes_sent() - sent_before
    sampler = PeakSampler(model, state)     # one more step, untimed, sampled
    sampler.on = True
    losses.append(_train(model, optimizer, data[-1], rank, n))
    sampler.sample()
    with open(f"{args.out}.{rank}", "w") as f:
        json.dump({"step_s": elapsed / args.steps, "sent_per_step": sent / args.steps,
                   "held_peak": sampler.peak, "held_after_step": held_bytes(model, state),
                   "rss_peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                   "rss_growth": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
                   - rss_before, "losses": losses, "parameters": parameters,
                   "largest_module": largest}, f)
    barrier()
    if args.worker.startswith("torch"):
        dist.destroy_process_group()
    else:
        hvd.shutdown()


# ------------------------------------------------------------------ the driver

def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker_command(library, out, args):
    return [sys.executable, os.path.abspath(__file__), "--worker", library, "--out", out,
            "--dim", str(args.dim), "--blocks", str(args.blocks), "--batch", str(args.batch),
            "--seq", str(args.seq), "--steps", str(args.steps), "--lr", str(args.lr)]


def run_job(library, ranks, args, timeout=600):
    """One job of ``library`` on ``ranks`` ranks: each rank's figures."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOROVOD_")}
    env.update(OMP_NUM_THREADS="1", HOROVOD_SHM_DISABLE="1", PYTHONPATH=jobs_pythonpath())
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rank")
        command = _worker_command(library, out, args)
        if library.startswith("torch"):    # the ranks meet through TCPStore on a free port
            env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()),
                       WORLD_SIZE=str(ranks))
            procs = [subprocess.Popen(command, env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True) for r in range(ranks)]
        else:
            procs = [subprocess.Popen([sys.executable, "-m", "horovodlike.runner.launch",
                                       "-np", str(ranks)] + command, env=env, cwd=REPO,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True)]
        deadline, outputs = time.time() + timeout, []
        try:
            for p in procs:
                outputs.append(p.communicate(timeout=max(1.0, deadline - time.time()))[0])
        finally:
            for p in procs:       # one rank failing must not leave the others waiting
                if p.poll() is None:
                    p.kill()
        if any(p.returncode for p in procs):
            raise RuntimeError(f"{library} on {ranks} ranks failed:\n"
                               + "\n".join(outputs)[-4000:])
        figures = []
        for r in range(ranks):
            with open(f"{out}.{r}") as f:
                figures.append(json.load(f))
        return figures


def summarize(figures, reference, ranks):
    """One job's row: the slowest rank's step time, the mean bytes sent, the largest memory,
    the global loss per step (the mean of the ranks' equal slices) and its worst relative
    difference from the reference, and whether the memory bound held."""
    losses = [sum(f["losses"][i] for f in figures) / ranks
              for i in range(len(figures[0]["losses"]))]
    bound = memory_bound(figures[0]["parameters"], figures[0]["largest_module"], ranks)
    held = max(f["held_peak"] for f in figures)
    return {"step_s": max(f["step_s"] for f in figures),
            "sent_per_step": sum(f["sent_per_step"] for f in figures) / ranks,
            "held_peak": held, "held_after_step": max(f["held_after_step"] for f in figures),
            "rss_peak": max(f["rss_peak"] for f in figures),
            "rss_growth": max(f["rss_growth"] for f in figures),
            "losses": losses, "bound": bound, "within_bound": held <= bound,
            "loss_rel_diff": max(abs(a - b) / abs(b) for a, b in zip(losses, reference))}


def _print_round(index, ranks, rows, unsharded):
    mib, kib = 1 << 20, 1 << 10
    print(f"round {index}, {ranks} ranks (unsharded footprint {unsharded / mib:.2f} MiB, "
          f"bound {rows[SHARDED[0]]['bound'] / mib:.2f} MiB)")
    print(f"  {'library':<18} {'step ms':>8} {'sent KiB/step':>14} {'held peak MiB':>14} "
          f"{'held after MiB':>15} {'RSS MiB':>8} {'RSS growth':>11} {'loss rel diff':>14}")
    for library, r in rows.items():
        print(f"  {library:<18} {r['step_s'] * 1e3:>8.1f} {r['sent_per_step'] / kib:>14.1f} "
              f"{r['held_peak'] / mib:>14.2f} {r['held_after_step'] / mib:>15.2f} "
              f"{r['rss_peak'] / mib:>8.0f} {r['rss_growth'] / mib:>11.1f} "
              f"{r['loss_rel_diff']:>14.1e}")
    ours, theirs = rows["hvd-fully_shard"], rows["torch-fully_shard"]
    print(f"  hvd-fully_shard held peak within bound: {ours['within_bound']}; step time "
          f"{ours['step_s'] / theirs['step_s']:.2f}x torch-fully_shard's; losses of every "
          f"library within {LOSS_RTOL:g} of one process: "
          f"{all(r['loss_rel_diff'] <= LOSS_RTOL for r in rows.values())}", flush=True)


def _git_commit():
    result = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                            cwd=REPO)
    return result.stdout.strip() or "unknown"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="2,4")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8, help="timed steps per job")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--batch", type=int, default=16, help="global batch, split evenly")
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--json", help="write the raw figures here")
    parser.add_argument("--worker", choices=LIBRARIES)
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    rank_counts = [int(r) for r in args.ranks.split(",")]
    bad = [r for r in rank_counts if r < 1 or args.batch % r]
    if bad:
        parser.error(f"--batch {args.batch} must split evenly over --ranks (not over {bad})")
    reference = reference_losses(args)
    raw = {"command": ["python"] + sys.argv, "commit": _git_commit(), "cores": os.cpu_count(),
           "reference_losses": reference, "rounds": []}
    print("$ python " + " ".join(sys.argv))
    print(f"commit {raw['commit']}, {os.cpu_count()} cores; {args.blocks} blocks of width "
          f"{args.dim}, batch {args.batch} x {args.seq} tokens, Adam, {args.steps} timed steps "
          f"after {WARMUP}; TCP only\n")
    for index in range(args.repeat):
        for ranks in rank_counts:
            load = os.getloadavg()
            rows = {lib: summarize(run_job(lib, ranks, args), reference, ranks)
                    for lib in LIBRARIES}
            unsharded = 16 * build_parameter_count(args)
            print(f"load average before: {' '.join(f'{v:.1f}' for v in load)}")
            _print_round(index, ranks, rows, unsharded)
            raw["rounds"].append({"round": index, "ranks": ranks, "load_before": load,
                                  "rows": rows})
    print("\nreference losses (one process): " + " ".join(f"{v:.6f}" for v in reference))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(raw, f, indent=1)


def build_parameter_count(args):
    return sum(p.numel() for p in build_model(args.dim, args.blocks).parameters())


if __name__ == "__main__":
    main()
