"""1D, 2D and 3D tensor parallelism: bytes each rank sends, and step time, as the ranks grow.

    python benchmarks/tensor_parallel.py [--ranks 4,9] [--shapes 72x576x2304,...]

The layer pair of the seed document: activation (bs, h) through weights (h, e) and (e, h).
1D is Megatron's ColumnParallelLinear + RowParallelLinear over P ranks; 2D is two Linear2D on an
x * y mesh (the most square one, x <= y), with the seed's scheme (allgather activations,
reduce-scatter partial outputs, weights stay) and, on a square mesh, with SUMMA (allgather
activations and weights); 3D is two Linear3D on a q x q x q mesh (P = q^3: allgather activations
along y and weights along z, reduce-scatter partial outputs along x). Every collective the
layers issue is recorded and its bytes sent per rank counted with the ring algorithms the core
runs (allreduce 2(p-1)/p n, allgather (p-1)/p of the output, reducescatter (p-1)/p of the
input), and measured on the wire: the job runs over TCP and each rank reads the kernel's count
of the bytes its sockets sent (wire_bytes.py) around one more forward and backward pass; then
the median step time is measured. Beside them: the seed's per-device formulas for the pair's
forward pass, 2(P-1)bsh/P for 1D, 2bs[e(x-1)+h(y-1)]/xy for 2D and
2[bse(x-1)+bsh(y-1)+he(z-1)]/xyz for 3D (fp32), and what they predict for meshes this
machine cannot run, with the layout that sends least for each shape.
"""

import argparse
import itertools
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
SHAPE = (72, 576, 2304)         # bs, h, e
# Shapes for the formulas' predictions: the measured one, many tokens against small weights,
# and a wide output (a vocabulary projection) against few tokens.
PREDICTED_SHAPES = ((72, 576, 2304), (1024, 128, 512), (16384, 1024, 4096),
                    (2048, 1024, 65536))


def grid_2d(ranks):
    """The most square x * y = ranks with x <= y (x splits the inputs, y the outputs)."""
    x = max(d for d in range(1, math.isqrt(ranks) + 1) if ranks % d == 0)
    return x, ranks // x


def grid_3d(ranks):
    q = round(ranks ** (1 / 3))
    return (q, q, q) if q ** 3 == ranks else None


def formula(mode, grid, shape):
    """The seed's forward bytes per rank (fp32) for the pair on ``grid``."""
    bs, h, e = shape
    if mode == "1d":
        (p,) = grid
        return 2 * (p - 1) * bs * h / p * 4
    if mode == "2d":
        x, y = grid
        return 2 * bs * (e * (x - 1) + h * (y - 1)) / (x * y) * 4
    if mode == "3d":
        x, y, z = grid
        return 2 * (bs * e * (x - 1) + bs * h * (y - 1) + h * e * (z - 1)) / (x * y * z) * 4
    return float("nan")   # the seed has no formula for SUMMA


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


def _layers(mode, shape):
    """The pair for ``mode`` and this rank's part of a (bs, h) activation."""
    import torch
    import horovodlike.torch as hvd
    from horovodlike.torch.parallel import (ColumnParallelLinear, Linear2D, Linear3D,
                                            RowParallelLinear, split_2d, split_3d)
    bs, h, e = shape
    torch.manual_seed(0)
    x = torch.randn(bs, h)
    if mode == "1d":
        return ColumnParallelLinear(h, e), RowParallelLinear(e, h), x
    if mode == "3d":
        mesh = hvd.ProcessMesh(grid_3d(hvd.size()), ("x", "y", "z"))
        # The first layer's output is the input of a Linear3D with x and y swapped.
        return (Linear3D(h, e, mesh, dims=("x", "y", "z")),
                Linear3D(e, h, mesh, dims=("y", "x", "z")),
                split_3d(x, mesh, dims=("x", "y", "z")).detach())
    mesh = hvd.ProcessMesh(grid_2d(hvd.size()), ("x", "y"))
    # SUMMA keeps the block layout; allgather_reducescatter swaps it, so the pair swaps.
    algorithm = "summa" if mode == "summa" else "allgather_reducescatter"
    second_dims = ("x", "y") if mode == "summa" else ("y", "x")
    return (Linear2D(h, e, mesh, dims=("x", "y"), algorithm=algorithm),
            Linear2D(e, h, mesh, dims=second_dims, algorithm=algorithm),
            split_2d(x, mesh, dims=second_dims).detach())


def worker(mode, shape, steps, out):
    import torch
    import torch.nn.functional as F
    import horovodlike.torch as hvd
    torch.set_num_threads(1)
    hvd.init()
    counter = [0.0]
    _count_collectives(counter)
    first, second, inputs = _layers(mode, shape)
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


def _run(ranks, mode, shape, steps, env):
    """One job: the figures its rank 0 writes."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        subprocess.run([sys.executable, "-m", "horovodlike.runner.launch", "-np", str(ranks),
                        sys.executable, os.path.abspath(__file__), "--worker", mode,
                        "--shapes", "x".join(map(str, shape)), "--out", out,
                        "--steps", str(steps)],
                       env=env, check=True, cwd=REPO, stdout=subprocess.DEVNULL)
        with open(out) as f:
            return json.load(f)


def _modes(ranks):
    """(mode, grid, label) of every layout that runs on ``ranks``."""
    x, y = grid_2d(ranks)
    yield "1d", (ranks,), "1D"
    if x > 1:
        yield "2d", (x, y), f"2D {x}x{y}"
    if x == y:
        yield "summa", (x, y), f"SUMMA {x}x{y}"
    if grid_3d(ranks) and ranks > 1:
        yield "3d", grid_3d(ranks), "3D {}x{}x{}".format(*grid_3d(ranks))


def _measure(shapes, rank_counts, steps, raw):
    # Every byte over TCP, so that the kernel's socket counters see all of it.
    env = dict(os.environ, OMP_NUM_THREADS="1", HOROVOD_SHM_DISABLE="1")
    env["PYTHONPATH"] = jobs_pythonpath()
    print(f"{'P':>3} {'layout':<11} {'counted':>17} {'measured fwd':>17} {'measured bwd':>17} "
          f"{'idle':>5} {'seed fwd':>9} {'step ms':>8}")
    print(f"{'':>3} {'':<11} {'fwd':>8} {'bwd':>8} {'mean':>8} {'max':>8} {'mean':>8} "
          f"{'max':>8}")
    for shape in shapes:
        bs, h, e = shape
        print(f"activation ({bs}, {h}), weights ({h}, {e}) and ({e}, {h})")
        for ranks in rank_counts:
            for mode, grid, label in _modes(ranks):
                forward, backward, step, wire = _run(ranks, mode, shape, steps, env)
                seed = formula(mode, grid, shape)
                idle, wire_fwd, wire_bwd = ([w[i] for w in wire] for i in range(3))
                kib = lambda v: f"{v / 1024:>8.1f}"  # noqa: E731
                print(f"{ranks:>3} {label:<11} {kib(forward)} {kib(backward)} "
                      f"{kib(statistics.mean(wire_fwd))} {kib(max(wire_fwd))} "
                      f"{kib(statistics.mean(wire_bwd))} {kib(max(wire_bwd))} "
                      f"{statistics.mean(idle) / 1024:>5.1f} {seed / 1024:>9.1f} "
                      f"{step * 1e3:>8.2f}", flush=True)
                raw["rows"].append({"ranks": ranks, "layout": label, "shape": shape,
                                    "forward_bytes": forward, "backward_bytes": backward,
                                    "seed_forward_bytes": seed,
                                    "wire_forward_bytes": wire_fwd,
                                    "wire_backward_bytes": wire_bwd,
                                    "wire_idle_bytes": idle, "step_s": step})


def _best(mode, ranks, shape, dims):
    """The grid with every side >= 2 whose formula is least, and its bytes (None if none)."""
    grids = [g for g in itertools.product(range(2, ranks + 1), repeat=dims)
             if math.prod(g) == ranks]
    return min(((formula(mode, g, shape), g) for g in grids), default=(None, None))


def _predict(raw):
    """The formulas beyond what this machine runs: each layout on its best grid (sides >= 2,
    so that 2D and 3D are not 1D in disguise) and the one that sends least."""
    print("\nseed's formulas, forward KiB per rank, each layout on its best grid:")
    print(f"{'bs x h x e':>18} {'P':>3} {'1D':>9} {'2D':>9} {'grid':>6} {'3D':>9} "
          f"{'grid':>7}  least")
    for shape in PREDICTED_SHAPES:
        for ranks in (8, 27, 64):
            one = formula("1d", (ranks,), shape)
            two, grid2 = _best("2d", ranks, shape, 2)
            three, grid3 = _best("3d", ranks, shape, 3)
            options = {"1D": one, "2D": two, "3D": three}
            low = min(v for v in options.values() if v is not None)
            least = " = ".join(k for k, v in options.items()
                               if v is not None and math.isclose(v, low))
            show = lambda v: f"{v / 1024:>9.1f}" if v is not None else f"{'-':>9}"  # noqa
            name = lambda g: "x".join(map(str, g)) if g else "-"  # noqa: E731
            print(f"{'x'.join(map(str, shape)):>18} {ranks:>3} {show(one)} {show(two)} "
                  f"{name(grid2):>6} {show(three)} {name(grid3):>7}  {least}")
            raw["predicted"].append({"shape": shape, "ranks": ranks, "1d": one, "2d": two,
                                     "2d_grid": grid2, "3d": three, "3d_grid": grid3,
                                     "least": least})


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="4,9")
    parser.add_argument("--shapes", default="x".join(map(str, SHAPE)),
                        help="bs x h x e of the pairs to run, comma separated")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--worker")
    parser.add_argument("--out")
    parser.add_argument("--json", help="write the raw figures here")
    args = parser.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    if args.worker:
        return worker(args.worker, shapes[0], args.steps, args.out)
    raw = {"load_before": os.getloadavg(), "cores": os.cpu_count(), "rows": [],
           "predicted": []}
    print("fp32; KiB sent per rank for one forward and one backward pass of the pair: counted "
          "(the collectives the layers issue, at the ring's cost), measured on the wire (the "
          "kernel's TCP counters, mean and max over ranks, negotiation included; idle: what a "
          f"rank sent in {0.2:.1f} s doing nothing), the seed's formula; job over TCP\n")
    _measure(shapes, [int(r) for r in args.ranks.split(",")], args.steps, raw)
    _predict(raw)
    raw["load_after"] = os.getloadavg()
    print("\nload average (1, 5, 15 min) before: {:.1f} {:.1f} {:.1f}, after: {:.1f} {:.1f} "
          "{:.1f}; {} cores".format(*raw["load_before"], *raw["load_after"], raw["cores"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(raw, f, indent=1)


if __name__ == "__main__":
    main()
