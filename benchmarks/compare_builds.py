"""Two builds of horovodlike, before and after a change, measured in turns on the same machine.

    python benchmarks/compare_builds.py --before OLD_TREE --after NEW_TREE [--rounds 3]

OLD_TREE and NEW_TREE are directories that hold a `horovodlike` package with its built core
(a checkout's `src/`, or the root of an older checkout). Each round runs every job once per
build, alternating which build goes first, so that a machine whose load drifts weighs on both
alike. Two kinds of job:
- `allreduce.py --only <label> --repeat 1` for each label (hvdl-shm, hvdl-tcp, hvdl-gloo,
  hvdl-mpi): the whole stack, each build with its own Python layers;
- with --core, the core alone over shared memory, TCP and Gloo: `_core.enqueue` +
  `_core.wait` on a NumPy buffer, the median per call, so the builds compare without their
  framework layers;
- with --p2p, point-to-point alone between ranks 0 and 1 of jobs over shared memory, TCP, Gloo
  and MPI (what carries the collectives; the messages go where each build sends them): a
  ping-pong of `_core.send`/`_core.recv` + `_core.wait` per size, the median of half a round
  trip (latency for small sizes; the size over it is the bandwidth for large ones).
- with --subsets, an allreduce over a process set of half the ranks (the first half), while
  the other half waits in a barrier ("idle"), or runs the same over its own set at once
  ("busy"); and over every rank ("global"), for reference: the median per call on rank 0,
  through horovodlike.torch. "paused": the first half's calls each after a 20 ms pause, while
  the other half waits for a point-to-point message (no collective of its own, so the loops
  may slow down): the mean per call. Needs an even --np of 4 or more.
With --hosts 2 the --subsets and --p2p jobs run on two emulated hosts (multihost.py's network
namespaces, joined by a link shaped to --rate; needs root), each half of the ranks on a host
of its own: the ping-pong's ranks 0 and 1 are then two ranks of one host in a job that also
has ranks on another.
The table gives, per size, each build's median over the rounds of the per-round medians and its
best round, and the ratios after/before of both.
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

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import allreduce as bench  # noqa: E402
from provenance import footer, header  # noqa: E402

CORE_LINKS = {"shm": {}, "tcp": {"HOROVOD_SHM_DISABLE": "1"},
              "gloo": {"HOROVOD_CPU_OPERATIONS": "gloo"}}
# The point-to-point jobs: settings and launcher flags.
P2P_LINKS = {"shm": ({}, []), "tcp": ({"HOROVOD_SHM_DISABLE": "1"}, []),
             "gloo": ({}, ["--gloo"]), "mpi": ({}, ["--mpi"])}


def core_worker(args):
    """One rank of the core-only job: the median per call of each size, from rank 0."""
    import numpy as np
    from horovodlike import _core
    _core.init()
    rank, size = _core.rank(), _core.size()
    # The codes of the older builds too: allreduce 0, float32 7, Sum 1 since the first release.
    allreduce, float32, total = 0, 7, 1
    results = {}
    for nbytes in args.sizes:
        buf = np.full(nbytes // 4, float(rank + 1), dtype=np.float32)
        ptr = buf.ctypes.data

        def one():
            handle = _core.enqueue(allreduce, "compare", ptr, ptr, float32, [buf.size], total)
            code, message = _core.wait(handle)
            _core.release(handle)
            if code != 0:
                raise RuntimeError(message)

        one()
        bench._check(float(buf[0]), size * (size + 1) / 2, f"core allreduce of {nbytes} B")
        results[nbytes] = median_call(one, nbytes, args)
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(results, f)
    _core.shutdown()


def median_call(one, nbytes, args):
    """The median time of one call of `one`, timed as allreduce.py times its calls."""
    return statistics.median(bench._time_loop(one, *bench.iterations(nbytes, args.iter_scale)))


def paused_call(one, calls=30, pause_s=0.02):
    """The mean time of `calls` calls of `one`, each after a pause in which the ranks' loops
    slow down: the mean, so that a call held up for a slowed loop's cycle counts."""
    total = 0.0
    for _ in range(calls):
        time.sleep(pause_s)
        start = time.perf_counter()
        one()
        total += time.perf_counter() - start
    return total / calls


def apply_job_settings(args):
    """The HOROVOD_ settings a worker on the emulated hosts was given as arguments (their jobs
    start with no HOROVOD_ variables)."""
    for setting in args.job_setting:
        name, value = setting.split("=", 1)
        os.environ[name] = value


def p2p_worker(args):
    """One rank of the point-to-point job: rank 0 sends each size to rank 1, which sends it
    back; the median of half a round trip per size, from rank 0. Ranks above 1 only join (on
    emulated hosts ranks 0 and 1 share the first host, the others are on the second)."""
    import numpy as np
    from horovodlike import _core
    apply_job_settings(args)
    _core.init()
    rank = _core.rank()
    uint8 = 0  # the dtype code of uint8 since the first release
    results = {}

    def done(handle):
        code, message = _core.wait(handle)
        _core.release(handle)
        if code != 0:
            raise RuntimeError(message)

    for nbytes in args.sizes:
        if rank > 1:
            break
        out = np.full(nbytes, rank + 1, dtype=np.uint8)
        into = np.zeros(nbytes, dtype=np.uint8)
        peer = 1 - rank

        def one():
            if rank == 0:
                done(_core.send(0, peer, 7, out.ctypes.data, uint8, [nbytes]))
                done(_core.recv(0, peer, 7, into.ctypes.data, uint8, [nbytes]))
            else:
                done(_core.recv(0, peer, 7, into.ctypes.data, uint8, [nbytes]))
                done(_core.send(0, peer, 7, into.ctypes.data, uint8, [nbytes]))

        one()
        # Both ranks end up with rank 0's bytes: rank 1 echoes what it received.
        bench._check(float(into[-1]), 1.0, f"p2p ping-pong of {nbytes} B")
        results[nbytes] = median_call(one, nbytes, args) / 2
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(results, f)
    _core.shutdown()


SUBSET_SCENARIOS = {
    "idle": "over the first half of the ranks, the other half waiting in a barrier",
    "busy": "over each half of the ranks at once, each its own process set",
    "paused": "over the first half of the ranks, a 20 ms pause before each call (the loops may "
              "slow down), the other half waiting for a point-to-point message; the mean per "
              "call of 30, not the median",
    "global": "over every rank",
}


def subset_worker(args):
    """One rank of the process-set job: the median per call of an allreduce over this rank's
    half of the ranks (or over every rank) in the scenario asked, from rank 0."""
    import numpy as np
    import torch
    os.environ["HOROVOD_DYNAMIC_PROCESS_SETS"] = "1"
    apply_job_settings(args)
    import horovodlike.torch as hvd
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    halves = [hvd.add_process_set(list(range(size // 2))),
              hvd.add_process_set(list(range(size // 2, size)))]
    mine = halves[0] if rank < size // 2 else halves[1]
    calls = mine if args.scenario != "global" else hvd.global_process_set
    works = args.scenario not in ("idle", "paused") or rank < size // 2
    results = {}
    for nbytes in args.sizes:
        buf = torch.full((nbytes // 4,), float(rank + 1))
        if works:
            members = (range(size) if args.scenario == "global" else
                       range(size // 2) if rank < size // 2 else range(size // 2, size))
            one = lambda: hvd.allreduce_(buf, op=hvd.Sum, process_set=calls, name="subset")
            buf.fill_(float(rank + 1))
            one()
            bench._check(float(buf[0]), float(sum(r + 1 for r in members)),
                         f"allreduce of {nbytes} B over ranks {list(members)}")
            results[nbytes] = (paused_call(one) if args.scenario == "paused" else
                               median_call(one, nbytes, args))
            if args.scenario == "paused" and rank == 0:
                for peer in range(size // 2, size):  # the other half may go on
                    hvd.send(torch.zeros(1), dst=peer)
        elif args.scenario == "paused":
            hvd.irecv(torch.zeros(1), src=0).wait()  # no collective meanwhile
        hvd.barrier()
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(results, f)
    hvd.shutdown()


def subset_job(build, scenario, sizes, args, settings):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.json")
        worker = [os.path.abspath(__file__), "--subset-worker", scenario, "--out", out,
                  "--sizes", args.sizes, "--iter-scale", str(args.iter_scale)]
        if args.hosts > 1:
            run_on_hosts(build, worker, settings, args)
        else:
            run(build, [sys.executable, "-m", "horovodlike.runner.launch", "-np",
                        str(args.np), sys.executable, *worker], settings, args.timeout)
        with open(out) as f:
            return {n: v for n, v in ((int(k), v) for k, v in json.load(f).items())}


def run_on_hosts(build: str, worker: list[str], settings: dict, args) -> None:
    """Runs `worker` (python arguments) with `build` as a job of --np ranks on --hosts emulated
    hosts (planner.run_job); each rank sets `settings` itself (apply_job_settings)."""
    from planner import run_job
    worker = worker + [f"--job-setting={k}={v}" for k, v in settings.items()]
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = build   # the job's PYTHONPATH starts with it
    try:
        run_job(worker, "two-hosts", args.rate, args.timeout, ranks=args.np,
                slots=args.np // args.hosts)
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH")
        else:
            os.environ["PYTHONPATH"] = saved


def run(build: str, command: list[str], env: dict, timeout: float) -> None:
    full = {k: v for k, v in os.environ.items() if not k.startswith("HOROVOD_")}
    full.update(env, PYTHONPATH=build, OMP_NUM_THREADS="1")
    result = subprocess.run(command, env=full, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} with {build} failed:\n"
                           f"{(result.stdout + result.stderr)[-3000:]}")


def allreduce_job(build, label, sizes, args, settings):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.json")
        run(build, [sys.executable, os.path.join(HERE, "allreduce.py"), "--np", str(args.np),
                    "--only", label, "--repeat", "1", "--sizes", args.sizes,
                    "--iter-scale", str(args.iter_scale), "--json", out,
                    *(f"--env={k}={v}" for k, v in settings.items())], {}, args.timeout)
        with open(out) as f:
            medians = json.load(f)["median_seconds"][label]
    return {n: medians[str(n)] for n in sizes}


def core_job(build, link, sizes, args, settings):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.json")
        run(build, [sys.executable, "-m", "horovodlike.runner.launch", "-np", str(args.np),
                    sys.executable, os.path.abspath(__file__), "--worker", "--out", out,
                    "--sizes", args.sizes, "--iter-scale", str(args.iter_scale)],
            {**settings, **CORE_LINKS[link]}, args.timeout)
        with open(out) as f:
            return {n: v for n, v in ((int(k), v) for k, v in json.load(f).items())}


def p2p_job(build, link, sizes, args, settings):
    env, flags = P2P_LINKS[link]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.json")
        worker = [os.path.abspath(__file__), "--p2p-worker", "--out", out, "--sizes",
                  args.sizes, "--iter-scale", str(args.iter_scale)]
        if args.hosts > 1:
            run_on_hosts(build, worker, {**settings, **env}, args)
        else:
            run(build, [sys.executable, "-m", "horovodlike.runner.launch", "-np",
                        str(args.np), *flags, sys.executable, *worker], {**settings, **env},
                args.timeout)
        with open(out) as f:
            return {n: v for n, v in ((int(k), v) for k, v in json.load(f).items())}


def print_table(title, per_round, sizes):
    """Medians and best rounds per build, and the same-round ratios: each round runs both builds
    back to back, so a round's after/before cancels most of a load that drifts between rounds."""
    print(f"\n{title}: median of the rounds' medians (best round); same round: median of the "
          "rounds' after/before, and the rounds in which after was faster")
    print("|    size |                before |                 after | after/before | best/best "
          "| same round | after faster |")
    print("|---------|-----------------------|-----------------------|--------------|-----------"
          "|------------|--------------|")
    for n in sizes:
        before, after = per_round["before"][n], per_round["after"][n]
        if not before or not after:
            continue
        mb, ma = statistics.median(before), statistics.median(after)
        paired = [a / b for a, b in zip(after, before)]
        faster = f"{sum(r < 1 for r in paired)} of {len(paired)}"
        cell = lambda median, best: f"{bench._fmt_time(median):>9} ({bench._fmt_time(best):>9})"
        print(f"| {bench.format_size(n):>7} | {cell(mb, min(before))} | {cell(ma, min(after))} | "
              f"{ma / mb:11.2f}x | {min(after) / min(before):8.2f}x | "
              f"{statistics.median(paired):9.2f}x | {faster:>12} |")


def describe_tree(where: str) -> str:
    """A build's tree as the raw output names it: the commit of the checkout it is in (and
    whether it differs from it), else the folder's name; never the machine's path."""
    git = ["git", "-C", where]
    head = subprocess.run(git + ["rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True)
    if head.returncode != 0:
        return os.path.basename(where.rstrip(os.sep))
    dirty = subprocess.run(git + ["status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return f"the checkout at {head.stdout.strip()}{' (modified)' if dirty else ''}"


def print_build(build, where, settings):
    """`before: TREE with NAME=VALUE`: which build ran, and with what settings."""
    extra = bench.format_settings(settings)
    print(f"{build + ':':7} {where}{' with ' + extra if extra else ''}")


def print_jobs(title, per_build, sizes):
    """Every job's median, per build and size, and the worst job over the median job."""
    print(f"\n{title}: every job (one per round), the worst over the median job")
    for build, per_size in per_build.items():
        for n in sizes:
            jobs = per_size[n]
            if not jobs:
                continue
            mid = statistics.median(jobs)
            print(f"{build:>6} {bench.format_size(n):>8}: worst/median {max(jobs) / mid:.2f}x; "
                  + " ".join(bench._fmt_time(t) for t in jobs))


def report(path):
    """The tables of a run saved with --json, printed again."""
    with open(path) as f:
        saved = json.load(f)
    for build, where in saved["builds"].items():
        print_build(build, os.path.basename(where.rstrip(os.sep)),
                    saved.get("settings", {}).get(build, {}))
    for title, per_round in saved["per_round"].items():
        sizes = [int(n) for n in per_round["before"]]
        print_table(title, {b: {int(n): v for n, v in r.items()} for b, r in per_round.items()},
                    sizes)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", help="directory holding the older build's horovodlike")
    parser.add_argument("--after", help="directory holding the newer build's horovodlike")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--sizes", default=bench.DEFAULT_SIZES)
    parser.add_argument("--iter-scale", type=float, default=1.0)
    parser.add_argument("--only", default="hvdl-shm,hvdl-tcp,hvdl-gloo,hvdl-mpi",
                        help="allreduce.py labels to run (empty: none)")
    parser.add_argument("--core", default="",
                        help="links for the core-only job, from shm,tcp,gloo (default: none)")
    parser.add_argument("--p2p", default="",
                        help="jobs for the point-to-point ping-pong, from shm,tcp,gloo,mpi "
                        "(default: none)")
    parser.add_argument("--subsets", default="",
                        help="process-set jobs, from " + ",".join(SUBSET_SCENARIOS) +
                        " (default: none; an even --np of 4 or more)")
    parser.add_argument("--hosts", type=int, default=1, choices=(1, 2),
                        help="--subsets and --p2p jobs on this many emulated hosts (2 needs "
                        "root; --p2p then takes shm and tcp)")
    parser.add_argument("--rate", default="1gbit",
                        help="with --hosts 2, the link between the hosts (tc rate)")
    parser.add_argument("--before-env", action="append", default=[], metavar="NAME=VALUE",
                        help="a setting for the before build's horovodlike jobs (repeatable)")
    parser.add_argument("--after-env", action="append", default=[], metavar="NAME=VALUE",
                        help="a setting for the after build's (the same tree twice with "
                        "different settings compares the settings)")
    parser.add_argument("--json", help="also write every round's medians to this file")
    parser.add_argument("--report", metavar="JSON",
                        help="print the tables of a run saved with --json again, and stop")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--p2p-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--subset-worker", choices=list(SUBSET_SCENARIOS), dest="scenario",
                        help=argparse.SUPPRESS)
    parser.add_argument("--job-setting", action="append", default=[], help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = [bench.parse_size(s) for s in args.sizes.split(",") if s.strip()]
    if args.worker or args.p2p_worker or args.scenario:
        args.sizes = sizes
        (core_worker if args.worker else p2p_worker if args.p2p_worker else
         subset_worker)(args)
        return
    if args.report:
        report(args.report)
        return
    if not (args.before and args.after):
        parser.error("--before and --after are required")
    for link in filter(None, args.core.split(",")):
        if link not in CORE_LINKS:
            parser.error(f"--core: {link!r} is not one of {', '.join(CORE_LINKS)}")
    jobs = [(f"allreduce.py {label}", allreduce_job, label)
            for label in filter(None, args.only.split(","))]
    for link in filter(None, args.p2p.split(",")):
        if link not in P2P_LINKS:
            parser.error(f"--p2p: {link!r} is not one of {', '.join(P2P_LINKS)}")
        if args.hosts > 1 and P2P_LINKS[link][1]:
            parser.error(f"--p2p {link} needs its launcher flag: not on emulated hosts")
    scenarios = list(filter(None, args.subsets.split(",")))
    for scenario in scenarios:
        if scenario not in SUBSET_SCENARIOS:
            parser.error(f"--subsets: {scenario!r} is not one of {', '.join(SUBSET_SCENARIOS)}")
    if scenarios and (args.np < 4 or args.np % 2):
        parser.error(f"--subsets needs an even --np of 4 or more, got {args.np}")
    jobs += [(f"allreduce {SUBSET_SCENARIOS[s]}", subset_job, s) for s in scenarios]
    jobs += [(f"core alone over {link}", core_job, link)
             for link in filter(None, args.core.split(","))]
    jobs += [(f"point-to-point, half a round trip, job over {link}", p2p_job, link)
             for link in filter(None, args.p2p.split(","))]
    print(header(), flush=True)
    builds = {"before": os.path.abspath(args.before), "after": os.path.abspath(args.after)}
    settings = {"before": bench.env_settings(parser, args.before_env),
                "after": bench.env_settings(parser, args.after_env)}
    results = {title: {b: {n: [] for n in sizes} for b in builds} for title, _, _ in jobs}
    for round_ in range(args.rounds):
        order = ["before", "after"] if round_ % 2 == 0 else ["after", "before"]
        for title, job, what in jobs:
            for build in order:
                medians = job(builds[build], what, sizes, args, settings[build])
                for n in sizes:
                    results[title][build][n].append(medians[n])
                print(f"round {round_ + 1}/{args.rounds}: {title}, {build} done "
                      f"(load {os.getloadavg()[0]:.1f})", flush=True)
    print()
    builds = {b: describe_tree(where) for b, where in builds.items()}
    for build in builds:
        print_build(build, builds[build], settings[build])
    for title, _, _ in jobs:
        print_table(title, results[title], sizes)
        print_jobs(title, results[title], sizes)
    print(footer(), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"builds": builds, "settings": settings, "rounds": args.rounds,
                       "per_round": results}, f,
                      indent=1)


if __name__ == "__main__":
    main()
