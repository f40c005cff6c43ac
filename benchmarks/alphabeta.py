"""An alpha-beta model fitted to multihost.py's measurements, its predictions for 16 to 1,024
ranks, and PNG plots of busbw against message size.

    python benchmarks/alphabeta.py benchmarks/results/multihost.json --plots benchmarks/results

Each algorithm's time for S bytes on N ranks in H hosts of g ranks is modelled as

    t = c + alpha * steps(N, H) + beta * S * wire(N, H)

where steps counts the exchanges one after the other and wire the bytes each host's link
carries per byte of the message (one direction; the links are full duplex):

    flat ring       steps = 2(N-1)                wire = 2(N-1)/N
    hierarchical    steps = 2(g-1) + 2(H-1)       wire = 2(H-1)/H    (g local rings at once)
    MPI             Open MPI's fixed decision: recursive doubling below 10,000 bytes
                    (steps = wire = log2 N, the whole message each step), ring above
    Gloo            steps = 2(N-1)                wire = 2(N-1)/N    (ring)

c, alpha and beta are fitted per algorithm and link rate, by non-negative least squares on the
relative error over every size and host count measured (so that 4 KiB and 8 MiB weigh alike).
beta is compared with the link's own 8/rate; alpha holds every per-step cost (wake-ups, the
kernel, and on a loaded machine the wait for a core). The predictions keep g = 2 ranks per host
as measured; they are extrapolations from N <= 8 and say so. An algorithm whose fit misses its
own measurements by more than --max-error (median) is left out of the ranking.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from allreduce import format_size, parse_size  # noqa: E402

from source_tree import jobs_pythonpath  # noqa: E402

# This checkout's source tree first when its core is built there (as its jobs get it).
sys.path[:0] = [p for p in jobs_pythonpath({}).split(os.pathsep) if p]
from horovodlike.torch.planner.links import fit_relative  # noqa: E402

MPI_RECURSIVE_DOUBLING_BELOW = 10000  # Open MPI 4's allreduce "intermediate message"
PREDICT_RANKS = [16, 32, 64, 128, 256, 512, 1024]
PREDICT_SIZES = [parse_size(s) for s in ("4K", "16K", "64K", "256K", "1M", "4M", "16M", "64M",
                                         "256M")]


def terms(algorithm: str, n: int, hosts: int, nbytes: int) -> tuple[float, float]:
    """(steps, wire bytes per message byte) of one allreduce."""
    g = n // hosts
    if algorithm == "hierarchical":
        return 2 * (g - 1) + 2 * (hosts - 1), 2 * (hosts - 1) / hosts
    if algorithm == "MPI" and nbytes < MPI_RECURSIVE_DOUBLING_BELOW:
        return math.log2(n), math.log2(n)
    return 2 * (n - 1), 2 * (n - 1) / n


def fit(points: list[tuple[int, int, int, float]], algorithm: str) -> dict:
    """points: (ranks, hosts, bytes, seconds). Returns c, alpha, beta and the fit's error,
    fitted as the planner fits its links (horovodlike.torch.planner.links.fit_relative)."""
    rows = []
    for n, h, s, _ in points:
        steps, wire = terms(algorithm, n, h, s)
        rows.append([1.0, steps, s * wire])
    (c, alpha, beta), median_error = fit_relative(rows, [t for *_, t in points])
    errors = [abs(predict({"c": c, "alpha": alpha, "beta": beta}, algorithm, n, h, s) / t - 1)
              for n, h, s, t in points]
    return {"c": c, "alpha": alpha, "beta": beta, "median_rel_error": median_error,
            "max_rel_error": float(max(errors))}


def predict(model: dict, algorithm: str, n: int, hosts: int, nbytes: int) -> float:
    steps, wire = terms(algorithm, n, hosts, nbytes)
    return model["c"] + model["alpha"] * steps + model["beta"] * nbytes * wire


def rate_bits(rate: str) -> float:
    for unit, scale in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if rate.endswith(unit):
            return float(rate[:-len(unit)]) * scale
    return float(rate)


def measured(data: dict) -> dict:
    """{(rate, algorithm): [(ranks, hosts, bytes, median seconds over rounds)]}"""
    grouped: dict = {}
    for r in data["results"]:
        for size, figures in r["sizes"].items():
            grouped.setdefault((r["rate"], r["algorithm"], r["ranks"], r["hosts"], int(size)),
                               []).append(figures["median_s"])
    points: dict = {}
    for (rate, algorithm, n, h, s), times in sorted(grouped.items()):
        points.setdefault((rate, algorithm), []).append((n, h, s, statistics.median(times)))
    return points


def busbw(n: int, nbytes: int, seconds: float) -> float:
    return nbytes / seconds * 2 * (n - 1) / n


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", help="multihost.py's --json output")
    parser.add_argument("--plots", help="write the PNG plots into this folder")
    parser.add_argument("--json", help="write the fitted models and predictions here")
    parser.add_argument("--max-error", type=float, default=0.3,
                        help="rank only the algorithms whose fit's median relative error is at "
                             "most this (default 0.3): a model that does not describe the "
                             "measurements predicts nothing")
    args = parser.parse_args()
    with open(args.results) as f:
        data = json.load(f)
    points = measured(data)
    rates = sorted({rate for rate, _ in points}, key=rate_bits)
    algorithms = [a for a in ("flat-ring", "hierarchical", "MPI", "Gloo")
                  if any(a == b for _, b in points)]
    models = {}
    print(f"alpha-beta fit of {args.results and os.path.basename(args.results)} "
          f"({data.get('command', '')})")
    print("t = c + alpha * steps + beta * bytes * wire; beta beside the link's 8/rate")
    print()
    print("| rate | algorithm | c | alpha (per step) | beta (ns/byte) | link 8/rate (ns/byte) "
          "| median / max rel. error |")
    print("|---|---|---|---|---|---|---|")
    for rate in rates:
        for a in algorithms:
            if (rate, a) not in points:
                continue
            m = fit(points[(rate, a)], a)
            models[(rate, a)] = m
            print(f"| {rate} | {a} | {m['c'] * 1e6:.0f} us | {m['alpha'] * 1e6:.0f} us | "
                  f"{m['beta'] * 1e9:.2f} | {8 / rate_bits(rate) * 1e9:.2f} | "
                  f"{m['median_rel_error'] * 100:.0f}% / {m['max_rel_error'] * 100:.0f}% |")

    predictions = {}
    for rate in rates:
        trusted = [a for a in algorithms if (rate, a) in models
                   and models[(rate, a)]["median_rel_error"] <= args.max_error]
        left_out = [a for a in algorithms if (rate, a) in models and a not in trusted]
        print()
        if len(trusted) < 2:
            print(f"{rate}: no prediction of a winner: only {', '.join(trusted) or 'none'} "
                  f"fit the measurements within {args.max_error:.0%} (median error); "
                  f"left out: {', '.join(left_out)}")
            continue
        print(f"predicted fastest algorithm at {rate}, 2 ranks per host, among the fits within "
              f"{args.max_error:.0%} median error ({', '.join(trusted)}"
              + (f"; left out: {', '.join(left_out)}" if left_out else "")
              + "): the winner's predicted time, and second best / winner in brackets")
        header = ["size"] + [str(n) for n in PREDICT_RANKS]
        rows = [header]
        for s in PREDICT_SIZES:
            row = [format_size(s)]
            for n in PREDICT_RANKS:
                times = {a: predict(models[(rate, a)], a, n, n // 2, s) for a in trusted}
                ranked = sorted(times, key=times.get)
                predictions[f"{rate} {n} {s}"] = times
                win = times[ranked[0]]
                second = times[ranked[1]] / win if len(ranked) > 1 else float("nan")
                shown = f"{win * 1e3:.2f} ms" if win >= 1e-3 else f"{win * 1e6:.0f} us"
                row.append(f"{ranked[0]} {shown} ({second:.1f}x)")
            rows.append(row)
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for row in rows[1:]:
            print("| " + " | ".join(row) + " |")

    if args.json:
        with open(args.json, "w") as f:
            json.dump({"models": {f"{r} {a}": m for (r, a), m in models.items()},
                       "predictions_s": predictions}, f, indent=1)
    if args.plots:
        plot(points, models, rates, algorithms, args.plots, args.max_error)


def plot(points, models, rates, algorithms, folder, max_error):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    os.makedirs(folder, exist_ok=True)
    markers = dict(zip(("flat-ring", "hierarchical", "MPI", "Gloo"), "osd^"))
    for rate in rates:
        hosts = sorted({h for (r, a), ps in points.items() if r == rate for _, h, _, _ in ps})
        fig, axes = plt.subplots(1, len(hosts), figsize=(5 * len(hosts), 4), squeeze=False)
        for ax, h in zip(axes[0], hosts):
            for a in algorithms:
                ps = sorted((s, n, t) for n, hh, s, t in points.get((rate, a), []) if hh == h)
                if not ps:
                    continue
                line, = ax.plot([s for s, _, _ in ps], [busbw(n, s, t) * 8 / 1e9 for s, n, t in ps],
                                marker=markers[a], label=f"{a} (measured)")
                sizes = np.geomspace(ps[0][0], ps[-1][0], 30)
                n = ps[0][1]
                ax.plot(sizes, [busbw(n, s, predict(models[(rate, a)], a, n, h, int(s))) * 8 / 1e9
                                for s in sizes], ls=":", color=line.get_color())
            ax.axhline(rate_bits(rate) / 1e9, color="grey", lw=0.8, ls="--", label="link rate")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("message size (bytes)")
            ax.set_ylabel("busbw (Gbit/s)")
            ax.set_title(f"{h} hosts x {ps[0][1] // h if ps else 2} ranks, {rate} links")
            ax.legend(fontsize=7)
        fig.suptitle("allreduce busbw, measured (markers) and fitted model (dotted)")
        fig.tight_layout()
        fig.savefig(os.path.join(folder, f"multihost-busbw-{rate}.png"), dpi=80)
        plt.close(fig)

        fig, axes = plt.subplots(1, 3, figsize=(15, 4))
        for ax, n in zip(axes, (16, 128, 1024)):
            for a in algorithms:
                if (rate, a) not in models:
                    continue
                error = models[(rate, a)]["median_rel_error"]
                ax.plot(PREDICT_SIZES, [busbw(n, s, predict(models[(rate, a)], a, n, n // 2, s))
                                        * 8 / 1e9 for s in PREDICT_SIZES],
                        marker=markers[a], ls="-" if error <= max_error else ":",
                        label=f"{a} (fit error {error:.0%})")
            ax.axhline(rate_bits(rate) / 1e9, color="grey", lw=0.8, ls="--", label="link rate")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("message size (bytes)")
            ax.set_ylabel("predicted busbw (Gbit/s)")
            ax.set_title(f"{n} ranks ({n // 2} hosts x 2), {rate} links")
            ax.legend(fontsize=7)
        fig.suptitle("alpha-beta model's prediction (extrapolated from 4 and 8 ranks; dotted: "
                     "fits outside the error bound)")
        fig.tight_layout()
        fig.savefig(os.path.join(folder, f"model-busbw-{rate}.png"), dpi=80)
        plt.close(fig)


if __name__ == "__main__":
    main()
