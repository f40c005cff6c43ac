"""1D against 2D tensor parallelism: bytes each rank sends, and step time, as the ranks grow.

    python benchmarks/tensor_parallel.py [--ranks 4,9]

The layer pair of the seed document: activation (bs, h) through weights (h, e) and (e, h).
1D is Megatron's ColumnParallelLinear + RowParallelLinear over P ranks; 2D is two Linear2D on a
q x q mesh (P = q^2), with the seed's scheme (allgather activations, reduce-scatter partial
outputs, weights stay) and with SUMMA (allgather activations and weights). Every collective the
layers issue is recorded and its bytes sent per rank counted with the ring algorithms the core
runs (allreduce 2(p-1)/p n, allgather (p-1)/p of the output, reducescatter (p-1)/p of the
input), and measured on the wire: the job runs over TCP and each rank reads the kernel's count
of the bytes its sockets sent (wire_bytes.py) around one more forward and backward pass; then
the median step time is measured. Beside them: the seed's per-device formulas
for the pair's forward pass, 2(P-1)bsh/P for 1D and 2bs[e(x-1)+h(y-1)]/xy for 2D (fp32).
"""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from wire_bytes import tcp_bytes_sent  # noqa: E402
from source_tree import jobs_pythonpath  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BS, H, E = 72, 576, 2304


def _count_collectives(counter):
    """Wraps the tensor-parallel mappings' collectives to add up the bytes this rank sends."""
    from horovodlike.torch.parallel import mappings

    def wrap(name, sent):
        original = getattr(mappings, name)

        def counted(tensor, process_set):
            p = mappings.group_size(process_set)
            out = original(tensor, process_set)
            counter[0] += sent(tensor, out, p) if p > 1 else 0
            return out
        setattr(mappings, name, counted)
    size = lambda t: t.numel() * t.element_size()  # noqa: E731
    wrap("_allreduce_sum", lambda t, out, p: 2 * (p - 1) / p * size(t))
    wrap("_gather_first", lambda t, out, p: (p - 1) / p * size(out))
    wrap("_reduce_scatter_first", lambda t, out, p: (p - 1) / p * size(t))


def worker(mode, steps, out):
    import torch
    import torch.nn.functional as F
    import horovodlike.torch as hvd
    from horovodlike.torch.parallel import (ColumnParallelLinear, Linear2D, RowParallelLinear,
                                            split_2d)
    torch.set_num_threads(1)
    hvd.init()
    counter = [0.0]
    _count_collectives(counter)
    torch.manual_seed(0)
    x = torch.randn(BS, H)
    if mode == "1d":
        first, second = ColumnParallelLinear(H, E), RowParallelLinear(E, H)
        inputs = x
    else:
        q = math.isqrt(hvd.size())
        mesh = hvd.ProcessMesh((q, q), ("x", "y"))
        # SUMMA keeps the block layout; allgather_reducescatter swaps it, so the pair swaps.
        algorithm = "summa" if mode == "summa" else "allgather_reducescatter"
        second_dims = ("x", "y") if mode == "summa" else ("y", "x")
        first = Linear2D(H, E, mesh, dims=("x", "y"), algorithm=algorithm)
        second = Linear2D(E, H, mesh, dims=second_dims, algorithm=algorithm)
        inputs = split_2d(x, mesh, dims=second_dims).detach()
    params = list(first.parameters()) + list(second.parameters())
    forward_bytes = backward_bytes = 0.0
    times = []
    for step in range(steps + 2):
        hvd.barrier()
        start = time.perf_counter()
        counter[0] = 0.0
        y = second(F.gelu(first(inputs.requires_grad_())))
        forward_bytes = counter[0]
        y.pow(2).mean().backward()
        backward_bytes = counter[0] - forward_bytes
        for p in params:
            p.grad = None
        elapsed = max(hvd.allgather_object(time.perf_counter() - start))
        if step >= 2:
            times.append(elapsed)
    # One more pass, untimed, measured on the wire: the kernel's count of what this rank's
    # sockets sent, with pauses so that each pass's last sends have left before the reading.
    settle = 0.2
    hvd.barrier()
    time.sleep(settle)
    idle_start = tcp_bytes_sent()
    time.sleep(settle)
    before = tcp_bytes_sent()
    y = second(F.gelu(first(inputs.requires_grad_())))
    time.sleep(settle)
    after_forward = tcp_bytes_sent()
    y.pow(2).mean().backward()
    time.sleep(settle)
    after_backward = tcp_bytes_sent()
    wire = hvd.allgather_object((before - idle_start, after_forward - before,
                                 after_backward - after_forward))
    if hvd.rank() == 0:
        with open(out, "w") as f:
            json.dump([forward_bytes, backward_bytes, statistics.median(times), wire], f)
    hvd.shutdown()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="4,9")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--worker")
    parser.add_argument("--out")
    parser.add_argument("--json", help="write the raw figures here")
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker, args.steps, args.out)
    # Every byte over TCP, so that the kernel's socket counters see all of it.
    env = dict(os.environ, OMP_NUM_THREADS="1", HOROVOD_SHM_DISABLE="1")
    env["PYTHONPATH"] = jobs_pythonpath()
    raw = {"load_before": os.getloadavg(), "cores": os.cpu_count(), "rows": []}
    print(f"activation ({BS}, {H}), weights ({H}, {E}) and ({E}, {H}), fp32; KiB sent per rank "
          "for one forward and one backward pass of the pair: counted (the collectives the "
          "layers issue, at the ring's cost), measured on the wire (the kernel's TCP counters, "
          "mean and max over ranks, negotiation included; idle: what a rank sent in "
          f"{0.2:.1f} s doing nothing), the seed's formula; job over TCP\n")
    print(f"{'P':>3} {'layout':<11} {'counted':>17} {'measured fwd':>17} {'measured bwd':>17} "
          f"{'idle':>5} {'seed fwd':>9} {'step ms':>8}")
    print(f"{'':>3} {'':<11} {'fwd':>8} {'bwd':>8} {'mean':>8} {'max':>8} {'mean':>8} "
          f"{'max':>8}")
    for ranks in [int(r) for r in args.ranks.split(",")]:
        q = math.isqrt(ranks)
        for mode in ("1d", "2d", "summa"):
            if mode != "1d" and q * q != ranks:
                continue
            with tempfile.TemporaryDirectory() as tmp:
                out = os.path.join(tmp, "result.json")
                subprocess.run([sys.executable, "-m", "horovodlike.runner.launch", "-np",
                                str(ranks), sys.executable, os.path.abspath(__file__),
                                "--worker", mode, "--out", out, "--steps", str(args.steps)],
                               env=env, check=True, cwd=REPO, stdout=subprocess.DEVNULL)
                with open(out) as f:
                    forward, backward, step, wire = json.load(f)
            if mode == "1d":
                seed = 2 * (ranks - 1) * BS * H / ranks * 4
            elif mode == "summa":
                seed = float("nan")   # the seed has no formula for it
            else:
                seed = 2 * BS * (E * (q - 1) + H * (q - 1)) / (q * q) * 4
            label = {"1d": "1D", "2d": f"2D {q}x{q}", "summa": f"SUMMA {q}x{q}"}[mode]
            idle, wire_fwd, wire_bwd = ([w[i] for w in wire] for i in range(3))
            kib = lambda v: f"{v / 1024:>8.1f}"  # noqa: E731
            print(f"{ranks:>3} {label:<11} {kib(forward)} {kib(backward)} "
                  f"{kib(statistics.mean(wire_fwd))} {kib(max(wire_fwd))} "
                  f"{kib(statistics.mean(wire_bwd))} {kib(max(wire_bwd))} "
                  f"{statistics.mean(idle) / 1024:>5.1f} {seed / 1024:>9.1f} {step * 1e3:>8.2f}",
                  flush=True)
            raw["rows"].append({"ranks": ranks, "layout": label, "forward_bytes": forward,
                                "backward_bytes": backward, "seed_forward_bytes": seed,
                                "wire_forward_bytes": wire_fwd, "wire_backward_bytes": wire_bwd,
                                "wire_idle_bytes": idle, "step_s": step})
    # The seed's formulas beyond what this machine runs: where 2D starts to send less.
    print("\nseed's formulas, forward KiB per rank:")
    for ranks in (4, 9, 16, 25, 36, 49, 64):
        q = math.isqrt(ranks)
        print(f"{ranks:>3}  1D {2 * (ranks - 1) * BS * H / ranks * 4 / 1024:>8.1f}  "
              f"2D {2 * BS * (E * (q - 1) + H * (q - 1)) / (q * q) * 4 / 1024:>8.1f}")
    raw["load_after"] = os.getloadavg()
    print("\nload average (1, 5, 15 min) before: {:.1f} {:.1f} {:.1f}, after: {:.1f} {:.1f} "
          "{:.1f}; {} cores".format(*raw["load_before"], *raw["load_after"], raw["cores"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(raw, f, indent=1)


if __name__ == "__main__":
    main()
