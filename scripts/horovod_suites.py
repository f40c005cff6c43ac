#!/usr/bin/env python3
"""Runs Horovod's own test files, unmodified, against horovodlike and counts the results.

    python scripts/horovod_suites.py HOROVOD_CHECKOUT test_torch.py [more files] \
        [--np 2] [--gloo | --mpi] [-k PATTERN] [--timeout 90] [--check]

HOROVOD_CHECKOUT is a checkout of Horovod (or any folder holding its test/parallel and
test/utils). The files are copied to a scratch folder, where `import horovod.X as hvd` becomes
`import horovodlike.X as hvd` and the few private Horovod helpers the tests import come from
stand-ins written next to them. Each test then runs as its own job under horovodlikerun, so a
test that leaves the ranks out of step costs only itself. A test passes when every rank passes
it, and counts as skipped when a rank skips it.

--check exits 1 when a test fails that is not in KNOWN_FAILURES (a regression); the known ones
are tests that cannot pass here for reasons outside horovodlike, each with its reason.
"""

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Tests that cannot pass on today's frameworks, whatever horovodlike does, and why.
KNOWN_FAILURES = {
    "test_torch.py": {
        "test_broadcast_state": "builds every torch.optim optimizer on 1-D parameters; torch "
                                "2.13's Muon accepts only 2-D ones (Horovod 0.28.1 fails too)",
        "test_broadcast_state_options": "same Muon constructor error as test_broadcast_state",
        "test_force_allreduce": "same Muon constructor error as test_broadcast_state",
    },
}

# Private Horovod helpers that the suites import, and where the stand-ins come from.
STAND_INS = '''"""Stand-ins for private Horovod helpers imported by its test suites (test utilities)."""
import contextlib
import os
import threading


def in_thread(target, args=(), name=None, daemon=True, silent=False):
    thread = threading.Thread(target=target, args=args, name=name, daemon=daemon)
    thread.start()
    return thread


def is_version_greater_equal_than(ver, target):
    from packaging import version
    return version.parse(ver) >= version.parse(target)


def _executing_eagerly():
    import tensorflow as tf
    return tf.executing_eagerly()


@contextlib.contextmanager
def env(**kwargs):
    saved = {k: os.environ.get(k) for k in kwargs}
    os.environ.update({k: str(v) for k, v in kwargs.items()})
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def get_env_rank_and_size():
    for rank, size in (("HOROVOD_RANK", "HOROVOD_SIZE"), ("OMPI_COMM_WORLD_RANK",
                                                           "OMPI_COMM_WORLD_SIZE")):
        if rank in os.environ and size in os.environ:
            return int(os.environ[rank]), int(os.environ[size])
    return None
'''

REWRITES = [
    (r"^from horovod\.runner\.util\.threads import in_thread", "from hvd_stand_ins import in_thread"),
    (r"^from horovod\.common\.util +import is_version_greater_equal_than",
     "from hvd_stand_ins import is_version_greater_equal_than"),
    (r"^from horovod\.tensorflow\.util import _executing_eagerly",
     "from hvd_stand_ins import _executing_eagerly"),
    (r"^from horovod\.common\.util import env$", "from hvd_stand_ins import env"),
    (r"^from horovod\.runner\.common\.util\.env import get_env_rank_and_size",
     "from hvd_stand_ins import get_env_rank_and_size"),
    (r"^from horovod\.torch\.mpi_ops import", "from horovodlike.torch.mpi_ops import"),
    (r"^(\s*)import horovod\.([a-z_.]+) as", r"\1import horovodlike.\2 as"),
    (r"'horovod\._keras'", "'horovodlike._keras'"),
]

SUMMARY = re.compile(r"^\[(\d+)\]<stdout>:(?:=+ )?(\d+ (?:passed|failed|skipped|error).*) in "
                     r"[0-9.]+s")


def prepare(checkout, work):
    source = checkout / "test" if (checkout / "test" / "parallel").is_dir() else checkout
    if not (source / "parallel").is_dir():
        sys.exit(f"{checkout}: no test/parallel folder; point at a checkout of Horovod")
    for sub in ("parallel", "utils"):
        if (source / sub).is_dir():
            shutil.copytree(source / sub, work / sub)
    parallel = work / "parallel"
    if (work / "utils" / "common.py").exists():
        shutil.copy(work / "utils" / "common.py", parallel / "common.py")
    (parallel / "hvd_stand_ins.py").write_text(STAND_INS)
    for path in parallel.glob("*.py"):
        text = path.read_text()
        for pattern, replacement in REWRITES:
            text = re.sub(pattern, replacement, text, flags=re.MULTILINE)
        path.write_text(text)
    return parallel


def collect(parallel, suite, pattern):
    command = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
               suite] + (["-k", pattern] if pattern else [])
    out = subprocess.run(command, cwd=parallel, capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "::" in line]


def run_one(parallel, test_id, args, launcher_flags):
    command = [sys.executable, "-m", "horovodlike.runner.launch", "-np", str(args.np),
               *launcher_flags, sys.executable, "-m", "pytest", "-q", "-rs", "--color=no",
               "-p", "no:cacheprovider", test_id]
    # A session of its own: a test that times out is ended with every rank it started.
    process = subprocess.Popen(command, cwd=parallel, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = process.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                break
            time.sleep(2)
        out, _ = process.communicate()
        return "failed", out + f"\n(timed out after {args.timeout:g} s)"
    code = process.returncode
    per_rank = {}
    for line in out.splitlines():
        match = SUMMARY.match(line)
        if match:
            per_rank[int(match.group(1))] = match.group(2)
    if code == 0 and len(per_rank) == args.np:
        if all(s.startswith("1 passed") for s in per_rank.values()):
            return "passed", out
        if any("skipped" in s for s in per_rank.values()):
            return "skipped", out
    return "failed", out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkout", type=Path)
    parser.add_argument("suites", nargs="+")
    parser.add_argument("--np", type=int, default=2)
    transport = parser.add_mutually_exclusive_group()
    transport.add_argument("--gloo", action="store_true")
    transport.add_argument("--mpi", action="store_true")
    parser.add_argument("-k", dest="pattern", help="pytest -k filter")
    parser.add_argument("--timeout", type=float, default=90, help="seconds per test")
    parser.add_argument("--log", type=Path, help="write every non-passing test's output here")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when a test outside KNOWN_FAILURES fails")
    args = parser.parse_args(argv)
    flags = ["--gloo"] if args.gloo else ["--mpi"] if args.mpi else []
    regressions = []
    with tempfile.TemporaryDirectory(prefix="horovod_suites_") as scratch:
        parallel = prepare(args.checkout.resolve(), Path(scratch))
        log = open(args.log, "w") if args.log else None
        for suite in args.suites:
            ids = collect(parallel, suite, args.pattern)
            if not ids:
                sys.exit(f"no tests collected from {suite} (is horovodlike importable, with "
                         "pytest, mock, parameterized and packaging installed?)")
            counts = {"passed": 0, "failed": 0, "skipped": 0}
            known = KNOWN_FAILURES.get(suite, {})
            started = time.monotonic()
            for test_id in ids:
                result, out = run_one(parallel, test_id, args, flags)
                counts[result] += 1
                name = test_id.rsplit("::", 1)[-1]
                if result == "failed":
                    reason = known.get(name)
                    print(f"  FAILED {name}" + (f"  (known: {reason})" if reason else ""),
                          flush=True)
                    if reason is None:
                        regressions.append(f"{suite}::{name}")
                if log and result != "passed":
                    log.write(f"==== {result.upper()} {test_id}\n{out[-6000:]}\n")
                    log.flush()
            print(f"{suite} (-np {args.np}{' ' + flags[0] if flags else ''}): "
                  f"{counts['passed']} passed, {counts['failed']} failed, "
                  f"{counts['skipped']} skipped in {time.monotonic() - started:.0f} s",
                  flush=True)
    if args.check and regressions:
        print("regressions (failing, not known to be impossible): " + ", ".join(regressions))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
