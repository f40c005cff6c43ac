"""What an idle job costs: the CPU time of each rank's threads while the program does nothing
(after init(), every rank asleep), and the loop's rounds in that time.

    python benchmarks/idle_cpu.py --np 2 --seconds 3 --repeat 3
    python benchmarks/idle_cpu.py --np 2 --builds ../hvdl-before/src,src   # two builds in turns
    python benchmarks/idle_cpu.py --np 4 --process-set     # a job with a process set

Each job: init(), one allreduce, then every rank sleeps --seconds while its threads' CPU time
(from /proc/self/task) and the runtime's loop rounds are counted; rank 0 and every other rank
report. A runtime whose background loop turns on its own takes this from every core the job
runs on, whatever the training does (a data loader, an evaluation on one rank, the compute
between a step's collectives).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from provenance import footer, header, record  # noqa: E402


def worker(args) -> None:
    import time

    import torch

    import horovodlike.torch as hvd
    from horovodlike import _core
    # A job with a process set keeps its loops at their pace (a set's collective needs the
    # ranks outside it in a round; docs/architecture.md).
    hvd.init(process_sets=[[0, 1]] if args.process_set else None)
    hvd.allreduce(torch.ones(1), name="warm")
    tick = os.sysconf("SC_CLK_TCK")

    def cpu_ms():
        total = 0.0
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick * 1e3
        return total

    rounds_before, cpu_before = _core.stats()["loop_rounds"], cpu_ms()
    time.sleep(args.seconds)
    rounds = _core.stats()["loop_rounds"] - rounds_before
    cpu = cpu_ms() - cpu_before
    gathered = hvd.allgather(torch.tensor([[cpu / args.seconds, rounds / args.seconds]],
                                          dtype=torch.float64), name="report")
    if hvd.rank() == 0:
        with open(args.out, "w") as f:
            json.dump(gathered.tolist(), f)
    hvd.shutdown()


def run_job(args, pythonpath: str) -> list:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOROVOD_")}
    env["PYTHONPATH"] = pythonpath
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        done = subprocess.run(
            [sys.executable, "-m", "horovodlike.runner.launch", "-np", str(args.np),
             sys.executable, os.path.abspath(__file__), "--worker", "--out", out,
             "--seconds", str(args.seconds)] + (["--process-set"] if args.process_set else []),
            env=env, capture_output=True, text=True, timeout=120 + 2 * args.seconds)
        if done.returncode != 0 or not os.path.exists(out):
            raise SystemExit(f"the job failed:\n{(done.stdout + done.stderr)[-3000:]}")
        with open(out) as f:
            return json.load(f)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--repeat", type=int, default=3, help="jobs per build (default 3)")
    parser.add_argument("--builds", default="",
                        help="comma-separated source folders (each with its built core), run "
                        "in turns; default: the jobs' usual one (this checkout's build, or the "
                        "installed package)")
    parser.add_argument("--process-set", action="store_true",
                        help="the job has a process set (ranks 0 and 1), as a model-parallel "
                             "job has its meshes")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    from source_tree import jobs_pythonpath
    builds = [b for b in args.builds.split(",") if b] or [None]
    paths = {b: (os.path.abspath(b) if b else jobs_pythonpath()) for b in builds}
    print(header(), flush=True)
    provenance = record()
    results = {str(b): [] for b in builds}
    for round_ in range(args.repeat):
        for build in builds:
            ranks = run_job(args, paths[build])
            results[str(build)].append(ranks)
            print(f"round {round_ + 1}/{args.repeat}, build {build or 'default'}: " + "; ".join(
                f"rank {r}: {cpu:.1f} ms CPU per second, {rounds:.0f} loop rounds per second"
                for r, (cpu, rounds) in enumerate(ranks)), flush=True)
    print(f"\n{args.np} ranks asleep for {args.seconds:g} s after init()"
          f"{' with a process set of ranks 0 and 1' if args.process_set else ''}; CPU time of "
          f"all of a rank's threads; median over ranks and jobs\n")
    print("| build | CPU ms per second per rank | worst rank and job | loop rounds per second |")
    print("|---|---:|---:|---:|")
    for build, jobs in results.items():
        cpu = [rank[0] for job in jobs for rank in job]
        rounds = [rank[1] for job in jobs for rank in job]
        print(f"| {build if build != 'None' else 'default'} | {statistics.median(cpu):.1f} | "
              f"{max(cpu):.1f} | {statistics.median(rounds):.0f} |")
    print(footer(), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**provenance, "np": args.np, "seconds": args.seconds,
                       "process_set": args.process_set,
                       "builds": results}, f, indent=1)


if __name__ == "__main__":
    main()
