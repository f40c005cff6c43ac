"""What every raw output of the benchmarks starts with: the command, the commit and whether the
tree differed from it, the machine, and the load; and the load again at the end."""

from __future__ import annotations

import os
import platform
import shlex
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _git(*args: str) -> str:
    try:
        done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True,
                              timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def commit() -> dict:
    """{"commit": full hash or "unknown", "dirty": [changed tracked files]}."""
    changed = [line.split(maxsplit=1)[1] for line in
               _git("status", "--porcelain", "--untracked-files=no").splitlines()
               if line.strip()]
    return {"commit": _git("rev-parse", "HEAD") or "unknown", "dirty": changed}


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def record() -> dict:
    """The same facts as header(), for a JSON output."""
    return {"command": command_line(), **commit(), "cpus": os.cpu_count(),
            "cpu_model": cpu_model(), "load_before": list(os.getloadavg())}


def command_line() -> str:
    script = os.path.relpath(os.path.abspath(sys.argv[0]), REPO)
    return "python3 " + " ".join(shlex.quote(a) for a in [script] + sys.argv[1:])


def header() -> str:
    """Lines to print first: `$ command`, the commit (and the files that differed from it), the
    machine and the load before the run."""
    facts = commit()
    # A raw output redirected into its committed file (`> benchmarks/results/x.txt`) has
    # changed that file before this runs: said apart from changes to the code that ran.
    results = [f for f in facts["dirty"] if f.startswith("benchmarks/results/")]
    code = [f for f in facts["dirty"] if f not in results]
    dirty = ("tree clean" if not code else
             "tree DIRTY: " + ", ".join(code[:8]) + (" ..." if len(code) > 8 else ""))
    if results:
        dirty += "; results being rewritten: " + ", ".join(results[:4]) + \
            (" ..." if len(results) > 4 else "")
    from source_tree import horovodlike_in_use
    return (f"$ {command_line()}\n"
            f"commit {facts['commit']} ({dirty})\n"
            f"horovodlike: {horovodlike_in_use()}\n"
            f"machine: {os.cpu_count()} CPUs, {cpu_model()}\n"
            f"load before: {load()}")


def footer() -> str:
    return f"load after: {load()}"


def cross_core_ns() -> float | None:
    """A cache line's round trip between the first two CPUs this process may use, in
    nanoseconds (horovodlike's machine probe, in a process of its own with the jobs' path), or
    None without two CPUs or a core that loads. On a virtual machine the host may place the
    guest's CPUs on one die or across dies and move them while jobs run: taken between jobs,
    the probe says which phase each job ran in."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None
    from source_tree import jobs_pythonpath
    env = {**os.environ, "PYTHONPATH": jobs_pythonpath()}
    code = ("import horovodlike._core as c; print(c._testing.core_to_core_round_trip_ns("
            f"{cpus[0]}, {cpus[1]}))")
    try:
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                              text=True, timeout=60)
        ns = float(done.stdout.split()[-1]) if done.returncode == 0 else -1
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None
    return ns if ns > 0 else None
