"""How long search_layers takes on chains of 100 and 1,000 layers.

    python benchmarks/planner_search.py [--layers 100 1000] [--world-sizes 4 8] [--rounds 3]
                                        [--out benchmarks/results/planner_search]

The chains are synthetic transformer blocks (LayerNorm, Linear 1024 -> 4096, GELU,
Linear 4096 -> 1024: four layers each, 16 MiB of parameters a Linear, activations of 2 MiB and
8 MiB, a sequence dimension of 512) over a 10 GB/s link. Every (pp, dp, tp) layout of the
world size and every ZeRO level is searched, without a memory limit and with one: the least
of 1/2, 3/4 and 9/10 of the fastest plan's memory that some plan fits, else that memory itself
(a limit the fastest plan just meets: the search then ranks paths by memory too, which is
what a limit costs, without changing the plan).
Each round is timed on its own, wall clock and this process's CPU time (the machine may be
shared); the text and JSON outputs keep every round, the chosen plan, the command, the commit
(and whether the tree had changes) and the load average before and after.
"""

import argparse
import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "src"))

from horovodlike.torch.planner import LayerSpec, LinkProfile, search_layers  # noqa: E402

MB = 1 << 20
LINK = LinkProfile(latency_s=20e-6, bus_bytes_per_s=10e9)


def chain(count):
    """``count`` layers of transformer-like blocks on a batch of 8 x 512 tokens."""
    block = [("norm", 0.4e-3, 8 * 1024, 2 * MB, 2 * MB, 0, 0),
             ("linear", 3e-3, 16 * MB, 2 * MB, 8 * MB, 4096, 1024),
             ("elementwise", 0.6e-3, 0, 8 * MB, 8 * MB, 0, 0),
             ("linear", 3e-3, 16 * MB, 8 * MB, 2 * MB, 1024, 4096)]
    return [LayerSpec(str(i), kind, compute, params, x, y, colwise_size=col, rowwise_size=row,
                      sequence_size=512)
            for i, (kind, compute, params, x, y, col, row) in
            ((i, block[i % 4]) for i in range(count))]


def _git(*args):
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout


def run_case(layers, world_size, memory_limit, rounds):
    specs = chain(layers)
    times, cpu_times, found = [], [], None
    for _ in range(rounds):
        start, cpu = time.perf_counter(), time.process_time()
        found = search_layers(layers=specs, batch=8, world_size=world_size, link=LINK,
                              memory_limit=memory_limit)
        times.append(time.perf_counter() - start)
        cpu_times.append(time.process_time() - cpu)
    styles = {}
    for choice in found.layers:
        styles[choice.style] = styles.get(choice.style, 0) + 1
    return {"layers": layers, "world_size": world_size, "memory_limit": memory_limit,
            "seconds": times, "cpu_seconds": cpu_times, "layout": found.layout,
            "balance": found.balance,
            "styles": styles, "step_s": found.step_s, "memory_bytes": found.memory_bytes,
            "settings_searched": len(found.candidates)}


def binding_limit(layers, world_size):
    """The smallest of 1/2, 3/4 and 9/10 of the fastest plan's memory that some plan fits."""
    fastest = search_layers(layers=chain(layers), batch=8, world_size=world_size, link=LINK)
    for fraction in (0.5, 0.75, 0.9):
        limit = int(fastest.memory_bytes * fraction)
        try:
            search_layers(layers=chain(layers), batch=8, world_size=world_size, link=LINK,
                          memory_limit=limit)
            return limit
        except ValueError:
            continue
    return fastest.memory_bytes


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=os.path.join(REPO, "benchmarks", "results",
                                                      "planner_search"))
    args = parser.parse_args()
    raw = {"command": " ".join(["python", "benchmarks/planner_search.py", *sys.argv[1:]]),
           "commit": _git("rev-parse", "HEAD").strip(),
           "dirty": bool(_git("status", "--porcelain", "--untracked-files=no").strip()),
           "cores": os.cpu_count(), "load_before": os.getloadavg(), "cases": []}
    lines = [f"$ {raw['command']}", f"commit {raw['commit']}{' (dirty)' if raw['dirty'] else ''}",
             f"load before {raw['load_before']}, {raw['cores']} cores",
             f"{'layers':>6} {'ranks':>5} {'limit MiB':>10} {'rounds: wall s':<22} "
             f"{'cpu s':<22} {'plan':<22} {'balance':<18} styles"]
    for layers in args.layers:
        for world_size in args.world_sizes:
            for limit in (None, binding_limit(layers, world_size)):
                case = run_case(layers, world_size, limit, args.rounds)
                raw["cases"].append(case)
                rounds = " ".join(f"{t:.2f}" for t in case["seconds"])
                cpu = " ".join(f"{t:.2f}" for t in case["cpu_seconds"])
                balance = ",".join(map(str, case["balance"]))
                lines.append(f"{layers:>6} {world_size:>5} "
                             f"{'-' if limit is None else f'{limit / MB:.0f}':>10} "
                             f"{rounds:<22} {cpu:<22} {case['layout']:<22} {balance[:18]:<18} "
                             f"{case['styles']}")
                print(lines[-1], flush=True)
    raw["load_after"] = os.getloadavg()
    lines.append(f"load after {raw['load_after']}")
    with open(args.out + ".txt", "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(args.out + ".json", "w") as f:
        json.dump(raw, f, indent=1)


if __name__ == "__main__":
    main()
