"""ShardedEmbedding against a replicated table whose sparse gradients are allgathered (what
DistributedOptimizer does with sparse gradients, as Horovod does): lookups per second, bytes sent
and table memory per rank.

    python benchmarks/sharded_embedding.py [--ranks 2,4] [--rounds 3] [--rows 500000] [--dim 32]
        [--batch 4096] [--steps 10] [--out benchmarks/results/sharded_embedding]

Every rank looks up --batch ids a step, drawn from a Zipf law (P(k-th most frequent row) ~
1/k^1.05, the frequent rows spread over the table), and trains them with Adagrad on a random
linear loss: "sharded" is hvd.ShardedEmbedding(sparse=True) with a local Adagrad on each rank's
rows (an alltoall of ids, one of rows, one of gradient rows); "allgather" is a whole
nn.Embedding(sparse=True) on every rank with hvd.DistributedOptimizer(Adagrad), whose sparse
gradients go through an allgather of indices and values. Both start from the same table and see
the same ids; their tables' checksums after the steps are compared.

The jobs run over TCP (HOROVOD_SHM_DISABLE=1) so that the bytes each rank sends are read from
the kernel's socket counters (wire_bytes.py) around the timed steps. Lookups per second are the
ids of all ranks per step over the slowest rank's step time. Each round runs both kinds at every
rank count in turns, so that load hits them alike. Raw output: OUT.txt and OUT.json.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from wire_bytes import tcp_bytes_sent  # noqa: E402
from source_tree import jobs_pythonpath  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KINDS = ("sharded", "allgather")
WARMUP = 2


def _batches(args, rank):
    import torch
    weights = 1.0 / torch.arange(1, args.rows + 1, dtype=torch.float64) ** 1.05
    permutation = torch.randperm(args.rows, generator=torch.Generator().manual_seed(1))
    generator = torch.Generator().manual_seed(100 + rank)
    return [(permutation[torch.multinomial(weights, args.batch, replacement=True,
                                           generator=generator)],
             torch.randn(args.batch, args.dim, generator=generator) / args.batch)
            for _ in range(WARMUP + args.steps)]


def _setup(kind, args):
    """(module, optimizer, the tensors the table and its optimizer hold here)."""
    import torch
    import horovodlike.torch as hvd
    table = torch.randn(args.rows, args.dim, generator=torch.Generator().manual_seed(0))
    if kind == "sharded":
        module = hvd.ShardedEmbedding(args.rows, args.dim, sparse=True, _weight=table)
        optimizer = torch.optim.Adagrad(module.parameters(), lr=0.1)
    else:
        module = torch.nn.Embedding(args.rows, args.dim, sparse=True, _weight=table)
        optimizer = hvd.DistributedOptimizer(torch.optim.Adagrad(module.parameters(), lr=0.1),
                                             named_parameters=module.named_parameters())
    del table
    return module, optimizer


def worker(kind, args):
    import warnings
    import torch
    import horovodlike.torch as hvd
    # torch's sparse optimizers build their tensors without invariant checks, and say so.
    warnings.filterwarnings("ignore", message="Sparse invariant checks")
    torch.set_num_threads(1)
    hvd.init()
    rank, n = hvd.rank(), hvd.size()
    batches = _batches(args, rank)
    module, optimizer = _setup(kind, args)

    def step(ids, target):
        optimizer.zero_grad()
        (module(ids) * target).sum().backward()
        optimizer.step()

    for ids, target in batches[:WARMUP]:
        step(ids, target)
    hvd.barrier()
    sent, start = tcp_bytes_sent(), time.perf_counter()
    for ids, target in batches[WARMUP:]:
        step(ids, target)
    elapsed, sent = time.perf_counter() - start, tcp_bytes_sent() - sent
    held = module.weight.numel() * module.weight.element_size() + sum(
        v.numel() * v.element_size() for s in optimizer.state.values() for v in s.values()
        if torch.is_tensor(v) and v.dim() > 0)
    checksum = module.weight.detach().double().sum()
    if kind == "sharded":
        checksum = hvd.allreduce(checksum, op=hvd.Sum, name="checksum")
    unique = sum(len(torch.unique(ids)) for ids, _ in batches[WARMUP:]) / args.steps
    everyone = hvd.allgather_object((elapsed, sent, held, unique))
    if rank == 0:
        step_s = max(e for e, _, _, _ in everyone) / args.steps
        with open(args.out, "w") as f:
            json.dump({"step_s": step_s, "lookups_per_s": n * args.batch / step_s,
                       "sent_per_step": [s / args.steps for _, s, _, _ in everyone],
                       "held": [h for _, _, h, _ in everyone],
                       "unique_ids_per_step": [u for _, _, _, u in everyone],
                       "step_s_per_rank": [e / args.steps for e, _, _, _ in everyone],
                       "checksum": float(checksum)}, f)
    hvd.shutdown()


def _run(kind, ranks, args, env):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        subprocess.run([sys.executable, "-m", "horovodlike.runner.launch", "-np", str(ranks),
                        sys.executable, os.path.abspath(__file__), "--worker", kind,
                        "--result", out, "--rows", str(args.rows), "--dim", str(args.dim),
                        "--batch", str(args.batch), "--steps", str(args.steps)],
                       env=env, check=True, cwd=REPO, stdout=subprocess.DEVNULL)
        with open(out) as f:
            return json.load(f)


def _git(*command):
    return subprocess.run(["git", *command], capture_output=True, text=True,
                          cwd=REPO).stdout.strip()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="2,4")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rows", type=int, default=500_000)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", help="writes OUT.txt and OUT.json")
    parser.add_argument("--worker", choices=KINDS)
    parser.add_argument("--result")
    args = parser.parse_args()
    if args.worker:
        args.out = args.result
        return worker(args.worker, args)
    # The caller's HOROVOD_* settings are dropped: none changes a figure unseen.
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOROVOD_")}
    env.update(OMP_NUM_THREADS="1", HOROVOD_SHM_DISABLE="1", PYTHONPATH=jobs_pythonpath())
    report = {"command": ["python", *sys.argv], "commit": _git("rev-parse", "HEAD"),
              "dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
              "cores": os.cpu_count(), "rows": args.rows, "dim": args.dim,
              "batch": args.batch, "steps": args.steps, "warmup": WARMUP, "rounds": []}
    lines = [f"$ {' '.join(report['command'])}",
             f"commit {report['commit']}{' (dirty)' if report['dirty'] else ''}, "
             f"{report['cores']} cores; table {args.rows} x {args.dim} float32, {args.batch} "
             f"Zipf ids per rank per step, Adagrad, {args.steps} timed steps after {WARMUP}; "
             "TCP only", ""]
    print("\n".join(lines), flush=True)
    for round_number in range(args.rounds):
        for ranks in [int(r) for r in args.ranks.split(",")]:
            entry = {"round": round_number, "ranks": ranks, "load_before": os.getloadavg(),
                     "rows": {kind: _run(kind, ranks, args, env) for kind in KINDS}}
            entry["load_after"] = os.getloadavg()
            report["rounds"].append(entry)
            text = _round_text(entry)
            print(text, flush=True)
            lines.append(text)
    if args.out:
        with open(args.out + ".json", "w") as f:
            json.dump(report, f, indent=1)
        with open(args.out + ".txt", "w") as f:
            f.write("\n".join(lines) + "\n")


def _round_text(entry):
    mib, kib = 1 << 20, 1 << 10
    rows = entry["rows"]
    text = [f"round {entry['round']}, {entry['ranks']} ranks, load before "
            f"{' '.join(f'{v:.1f}' for v in entry['load_before'])}",
            f"  {'kind':<10} {'step ms':>8} {'lookups/s':>10} {'sent KiB/step/rank':>19} "
            f"{'table+state MiB/rank':>21} {'unique ids/rank':>16}"]
    for kind, r in rows.items():
        text.append(f"  {kind:<10} {r['step_s'] * 1e3:>8.1f} {r['lookups_per_s']:>10.0f} "
                    f"{max(r['sent_per_step']) / kib:>19.1f} {max(r['held']) / mib:>21.1f} "
                    f"{sum(r['unique_ids_per_step']) / len(r['unique_ids_per_step']):>16.0f}")
    a, b = rows["sharded"]["checksum"], rows["allgather"]["checksum"]
    text.append(f"  tables agree after the steps: checksum rel diff {abs(a - b) / abs(b):.1e}")
    return "\n".join(text)


if __name__ == "__main__":
    main()
