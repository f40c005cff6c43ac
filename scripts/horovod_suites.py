#!/usr/bin/env python3
"""Runs Horovod's own test files, unmodified, against horovodlike and counts the results.

    python scripts/horovod_suites.py HOROVOD_CHECKOUT test_torch.py [more files] \
        [--np 2] [--gloo | --mpi] [-k PATTERN] [--timeout 90] [--batch N] [--check] \
        [--expect [FILE]] [--update-expectations [FILE]]

HOROVOD_CHECKOUT is a checkout of Horovod (or any folder holding its test/parallel and
test/utils). The files are copied to a scratch folder, where `import horovod.X as hvd` becomes
`import horovodlike.X as hvd` and the few private Horovod helpers the tests import come from
stand-ins written next to them. A test passes when every rank passes it, and counts as
skipped when a rank skips it.

Tests run in batches, many to a launcher job, as Horovod's own CI runs them, so that the ranks
start (and import torch) once per batch instead of once per test. Every rank writes each test's
outcome to a file as soon as it is known. A test that fails in a batch, and the test a batch was
in when it died or stopped making progress for --timeout seconds, are then run again each in a
job of its own, and that run decides; the tests after a batch's end go on in a new batch. A
failure may leave the ranks out of step, so a later test that fails in the same batch runs
alone too; one that passes on every rank keeps its pass; three failures in a row send the tests
from the second of them on to a new batch. The tests in KNOWN_FAILURES run alone from the
start. --batch 1 runs every test alone.

--check exits 1 when a test fails that is not in KNOWN_FAILURES (a regression); the known ones
are tests that cannot pass here for reasons outside horovodlike, each with its reason.

--expect compares every test's outcome with scripts/horovod_suites_expected.json, kept per suite
and transport (default, --gloo, --mpi) on 2 ranks, and per transport and number of ranks on
others ("default np4"): it exits 1 when a test that passed fails or skips, when
a test fails or skips in a new way, or when fewer tests pass; when tests do better, it says to
update the expectations (--update-expectations writes this run's outcomes there).

--record FILE writes a raw output to keep: the command that produced it, the versions, the
machine's load, what was printed, and the output of every test that did not pass. Paths of the
machine are written as placeholders there (the checkout as path/to/horovod, the Python
installation's packages as site-packages/), so that the file says nothing about where it ran.
"""

import argparse
import datetime
import json
import os
import platform
import resource
import shlex
import site
import sysconfig
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
                                "2.13's Muon accepts only 2-D ones (fails in torch, before "
                                "any horovodlike call)",
        "test_broadcast_state_options": "same Muon constructor error as test_broadcast_state",
        "test_force_allreduce": "same Muon constructor error as test_broadcast_state",
    },
    "test_tensorflow.py": {
        "test_horovod_syncbn_cpu": "passes fused=False to Keras' BatchNormalization, which "
                                   "Keras 3 removed",
        "test_partial_distributed_gradient_tape": "calls variable.ref() on Keras 3 variables "
                                                  "(model.trainable_weights), which have no ref",
    },
    "test_tensorflow2_keras.py": {
        "test_sparse_as_dense": "builds keras.optimizers.RMSprop(lr=...); Keras 3 removed lr",
        "test_sparse_as_dense_with_grad_aggregation": "builds RMSprop(lr=...); Keras 3 removed lr",
        "test_legacy_optimizer": "uses keras.optimizers.legacy, which Keras 3 removed",
        "test_train_model_lr_schedule": "uses keras.losses.mean_squared_error, absent from "
                                        "Keras 3's tf.keras",
        **{f"test_gradient_aggregation{local}_{i}":
           "its Optimizer subclass calls super().__init__ without learning_rate (required in "
           "Keras 3) and defines a two-argument update_step" for local in ("", "_with_local_vars")
           for i in (0, 1)},
        "test_partial_distributed_optimizer": "calls variable.ref() on Keras 3 variables "
                                              "(model.trainable_weights), which have no ref",
        "test_broadcast_global_variables_callback_with_local_vars":
            "calls variable.ref() on Keras 3 variables (model.variables), which have no ref",
    },
    "test_tensorflow_process_sets.py": {
        "test_horovod_reducescatter_grad_cpu_process_sets":
            "checks a float16 gradient's error (exactly 0.0) with assertLess(err, 1e-08); NumPy "
            "2 compares a float16 scalar with a Python float in float16 (NEP 50), where 1e-08 "
            "is 0.0, so 0.0 < 0.0 fails (the float32 and float64 cases pass)",
    },
    "test_tensorflow2_keras_process_sets.py": {
        "test_process_set_optimizer": "its Optimizer subclass calls super().__init__ without "
                                      "learning_rate, which Keras 3 requires",
    },
}

# Private Horovod helpers that the suites import, and where the stand-ins come from.
# Loaded into every rank's pytest (-p): appends "OUTCOME NODEID<TAB>SKIP REASON" to a file of the
# process's own as each test ends (failed if any phase failed, else skipped if any phase skipped).
RESULTS_PLUGIN = '''"""Records each test's outcome as it ends (test utility)."""
import os

_worst = {}
_reason = {}
_RANK = {"passed": 0, "skipped": 1, "failed": 2}


def pytest_runtest_logreport(report):
    folder = os.environ.get("HVD_SUITE_RESULTS")
    if not folder:
        return
    previous = _worst.get(report.nodeid, "passed")
    if _RANK[report.outcome] > _RANK[previous]:
        previous = report.outcome
    _worst[report.nodeid] = previous
    if report.outcome == "skipped" and isinstance(report.longrepr, tuple):
        _reason[report.nodeid] = str(report.longrepr[-1]).replace("\\n", " ")
    if report.when == "teardown":
        reason = _reason.pop(report.nodeid, "")
        with open(os.path.join(folder, f"{os.getpid()}.txt"), "a") as out:
            out.write(f"{_worst.pop(report.nodeid)} {report.nodeid}\\t{reason}\\n")
'''

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
'''

REWRITES = [
    (r"^from horovod\.runner\.util\.threads import in_thread", "from hvd_stand_ins import in_thread"),
    (r"^from horovod\.common\.util +import is_version_greater_equal_than",
     "from hvd_stand_ins import is_version_greater_equal_than"),
    (r"^from horovod\.tensorflow\.util import _executing_eagerly",
     "from hvd_stand_ins import _executing_eagerly"),
    (r"^from horovod\.common\.util import env$", "from hvd_stand_ins import env"),
    # Public modules, and the private ones horovodlike has at Horovod's path
    # (horovodlike.runner.common.util.env).
    (r"^(\s*)from horovod\.([a-z_.]+) import", r"\1from horovodlike.\2 import"),
    (r"^(\s*)import horovod\.([a-z_.]+) as", r"\1import horovodlike.\2 as"),
    (r"'horovod\._keras'", "'horovodlike._keras'"),
]

SUMMARY = re.compile(r"^\[(\d+)\]<stdout>:(?:=+ )?(\d+ (?:passed|failed|skipped|error).*) in "
                     r"[0-9.]+s")


def scrubber(checkout, scratch):
    """A function that writes this machine's paths in a text as placeholders."""
    repo = Path(__file__).resolve().parent.parent
    places = [(Path(scratch), "path/to/scratch"), (checkout, "path/to/horovod"),
              (repo, "path/to/horovodlike")]
    packages = set(site.getsitepackages() + [site.getusersitepackages()])
    packages.update(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
    places += [(Path(p), "site-packages") for p in packages]
    places += [(Path(sysconfig.get_paths()["stdlib"]), "python-lib"),
               (Path(sys.prefix), "python-prefix"), (Path(sys.base_prefix), "python-prefix"),
               (Path(tempfile.gettempdir()), "tmp"), (Path.home(), "~")]
    pairs = []
    for path, label in places:
        for form in {str(path), str(path.resolve())}:
            if len(form) > 1:
                pairs.append((form, label))
    pairs.sort(key=lambda pair: -len(pair[0]))  # the longest, most specific path first
    pattern = re.compile("|".join(re.escape(form) for form, _ in pairs))
    labels = dict(pairs)
    return lambda text: pattern.sub(lambda match: labels[match.group(0)], text)


def load_average():
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def versions():
    from importlib import metadata
    parts = []
    for package in ("torch", "tensorflow-cpu", "tensorflow"):
        try:
            parts.append(f"{package.split('-')[0]} {metadata.version(package)}")
            break
        except metadata.PackageNotFoundError:
            continue
    parts.append(f"Python {platform.python_version()}")
    here = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, cwd=here).stdout.strip()
        changed = subprocess.run(["git", "status", "--porcelain", "--", "src"],
                                 capture_output=True, text=True, cwd=here).stdout.strip()
    except OSError:
        commit = changed = ""
    if commit:
        parts.append(f"horovodlike commit {commit}" +
                     (" with uncommitted changes in src" if changed else ""))
    return ", ".join(parts)


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
    (parallel / "hvd_suite_results.py").write_text(RESULTS_PLUGIN)
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


def launcher(args, launcher_flags, test_ids):
    # A generous start timeout: some tests never call init(), and on a busy machine importing
    # torch alone can outlast the launcher's default wait for a rank to check in.
    return [sys.executable, "-m", "horovodlike.runner.launch", "-np", str(args.np),
            "--start-timeout", "300", *launcher_flags, sys.executable, "-m", "pytest", "-q",
            "-rs", "--color=no", "-p", "no:cacheprovider", "-p", "hvd_suite_results",
            *test_ids]


def end_session(process):
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            break
        time.sleep(2)


def run_batch(parallel, test_ids, args, launcher_flags):
    """Runs test_ids in one job; returns {test id: [outcome of each rank that reported it]}.
    The job is ended when no rank has reported a test for --timeout seconds."""
    with tempfile.TemporaryDirectory(prefix="results_", dir=parallel) as folder, \
            tempfile.TemporaryFile("w+") as output:
        env = dict(os.environ, HVD_SUITE_RESULTS=folder)
        process = subprocess.Popen(launcher(args, launcher_flags, test_ids), cwd=parallel,
                                   env=env, stdout=output, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        reported, last_progress = -1, time.monotonic()
        while process.poll() is None:
            time.sleep(1)
            size = sum(f.stat().st_size for f in Path(folder).glob("*.txt"))
            if size != reported:
                reported, last_progress = size, time.monotonic()
            elif time.monotonic() - last_progress > args.timeout:
                end_session(process)
                break
        process.wait()
        results = {}
        for path in Path(folder).glob("*.txt"):
            for line in path.read_text().splitlines():
                outcome, _, rest = line.partition(" ")
                test_id, _, reason = rest.partition("\t")
                results.setdefault(test_id, []).append((outcome, reason))
        return results


def run_tests(parallel, ids, args, launcher_flags, alone_first=()):
    """Every test's (outcome, output to log); and how many tests ran alone. The tests in
    `alone_first` (known failures) run alone from the start: in a batch, each would end it and
    run every test after it again in a new one."""
    outcomes, alone = {}, [test_id for test_id in ids if test_id in alone_first]
    remaining = [test_id for test_id in ids if test_id not in alone_first]
    while remaining:
        size = args.batch if args.batch > 0 else len(remaining)
        batch, remaining = remaining[:size], remaining[size:]
        if len(batch) == 1:
            alone.append(batch[0])
            continue
        started = time.monotonic()
        results = run_batch(parallel, batch, args, launcher_flags)
        progress(args, f"a batch of {len(batch)} ran {time.monotonic() - started:.0f} s")
        remaining = _sort_batch(batch, results, args, outcomes, alone) + remaining
    for test_id in alone:
        started = time.monotonic()
        outcomes[test_id] = run_one(parallel, test_id, args, launcher_flags)
        result, out = outcomes[test_id]
        progress(args, f"  {test_id} alone: {result} in {time.monotonic() - started:.0f} s")
        if result == "failed":
            progress(args, "\n".join("    " + line for line in out.splitlines()[-40:]))
    return outcomes, len(alone)


def progress(args, line):
    """--progress: each outcome as soon as it is known (a run cut short still says where)."""
    if getattr(args, "progress", False):
        print(line, flush=True)


# Failures in a row in one batch: the ranks are out of step, and the tests from the second
# on go to a new batch instead of each running alone.
OUT_OF_STEP = 3


def _sort_batch(batch, results, args, outcomes, alone):
    """Takes a batch's outcomes into `outcomes` (passes and skips) and `alone` (failures, and
    the test the batch ended in); returns the tests to run in a new batch.

    A failure may leave the ranks out of step (one rank's collective still in flight), which
    fails the tests after it for no fault of their own: a failed test runs again alone, and
    that run decides. Tests after it that passed on every rank keep their pass (ranks out of
    step fail, they do not pass), so scattered failures cost no new batch; OUT_OF_STEP failures
    in a row send the tests from the second of them on to a new batch."""
    streak = []
    for position, test_id in enumerate(batch):
        reports = results.get(test_id, [])
        ranks = [outcome for outcome, _ in reports]
        if len(ranks) < args.np:
            progress(args, f"  {test_id}: the batch ended in it (ranks {' '.join(ranks)})")
            alone.append(test_id)
            return batch[position + 1:]
        progress(args, f"  {test_id}: {' '.join(ranks)}")
        if all(r == "passed" for r in ranks):
            outcomes[test_id], streak = ("passed", ""), []
        elif "failed" not in ranks:
            reasons = sorted({reason for outcome, reason in reports if outcome == "skipped"})
            outcomes[test_id] = ("skipped", f"skipped in a batch: {'; '.join(reasons)}")
            streak = []
        else:
            streak.append(position)
            if len(streak) == OUT_OF_STEP:
                alone.remove(batch[streak[1]])
                progress(args, f"  {OUT_OF_STEP} failures in a row: the ranks are out of step; "
                               f"from {batch[streak[1]]} on in a new batch")
                return batch[streak[1]:]
            alone.append(test_id)
    return []


def run_one(parallel, test_id, args, launcher_flags):
    # A session of its own: a test that times out is ended with every rank it started.
    process = subprocess.Popen(launcher(args, launcher_flags, [test_id]), cwd=parallel, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = process.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        end_session(process)
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


# What each suite gives on each transport, test by test (--expect, --update-expectations).
EXPECTATIONS = Path(__file__).with_name("horovod_suites_expected.json")
OUTCOMES = ("passed", "skipped", "failed")


def transport_name(args):
    return "gloo" if args.gloo else "mpi" if args.mpi else "default"


def expectation_key(args):
    """The expectations' entry for this run: the transport's name on 2 ranks (Horovod's own
    CI), with the number of ranks after it on any other ("default np4")."""
    transport = transport_name(args)
    return transport if args.np == 2 else f"{transport} np{args.np}"


def compare(expected, outcomes):
    """(regressions, improvements) of this run's {test name: outcome} against `expected`
    ({"passed": [names], "skipped": [...], "failed": [...]}). Any change to a test that passed,
    any new outcome other than passing, a new test that does not pass, and a test gone from the
    suite are regressions; a test that passes now and did not before is an improvement."""
    before = {name: outcome for outcome in OUTCOMES for name in expected.get(outcome, [])}
    regressions, improvements = [], []
    for name, now in sorted(outcomes.items()):
        was = before.get(name)
        if was == now:
            continue
        change = f"{name}: {was or 'new test'} -> {now}"
        (improvements if now == "passed" else regressions).append(change)
    regressions += [f"{name}: {before[name]} -> gone from the suite"
                    for name in sorted(set(before) - set(outcomes))]
    passed = sum(outcome == "passed" for outcome in outcomes.values())
    if passed < len(expected.get("passed", [])):
        regressions.append(f"{passed} passed, fewer than the {len(expected['passed'])} expected")
    return regressions, improvements


def load_expectations(path, parser):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as error:
        parser.error(f"--expect {path}: {error}")


def check_expectations(expected, results, args, say):
    """Says how this run's outcomes differ from the expected ones; False on a regression."""
    transport, ok = transport_name(args), True
    for suite, outcomes in results.items():
        entry = expected.get(suite, {}).get(expectation_key(args))
        where = f"{suite} on the {transport} transport"
        if entry is None or entry.get("np") != args.np:
            say(f"EXPECTATIONS: none for {where} with -np {args.np}; record them with "
                f"--update-expectations")
            ok = False
            continue
        regressions, improvements = compare(entry, outcomes)
        for change in regressions:
            say(f"  REGRESSION {change}")
        if regressions:
            say(f"EXPECTATIONS: {where}: {len(regressions)} regression(s) (listed above)")
            ok = False
        if improvements:
            say(f"EXPECTATIONS: {where} does better than expected: "
                f"{'; '.join(improvements)}. Update the expectations: python3 "
                f"scripts/horovod_suites.py path/to/horovod {suite} --np {args.np} "
                f"{'--' + transport + ' ' if transport != 'default' else ''}"
                f"--update-expectations, and commit {EXPECTATIONS.name}")
        if not regressions and not improvements:
            say(f"EXPECTATIONS: {where} as expected")
    return ok


def update_expectations(path, results, args):
    expected = json.loads(path.read_text()) if path.exists() else {}
    for suite, outcomes in results.items():
        entry = {"np": args.np}
        for outcome in OUTCOMES:
            entry[outcome] = sorted(name for name, now in outcomes.items() if now == outcome)
        expected.setdefault(suite, {})[expectation_key(args)] = entry
    path.write_text(json.dumps(expected, indent=1, sort_keys=True) + "\n")


def make_parser():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkout", type=Path)
    parser.add_argument("suites", nargs="+")
    parser.add_argument("--np", type=int, default=2)
    transport = parser.add_mutually_exclusive_group()
    transport.add_argument("--gloo", action="store_true")
    transport.add_argument("--mpi", action="store_true")
    parser.add_argument("-k", dest="pattern", help="pytest -k filter")
    parser.add_argument("--timeout", type=float, default=90, help="seconds per test")
    parser.add_argument("--batch", type=int, default=0,
                        help="tests per launcher job (default 0: as many as there are)")
    parser.add_argument("--progress", action="store_true",
                        help="print each test's outcome as soon as it is known")
    parser.add_argument("--log", type=Path, help="write every non-passing test's output here")
    parser.add_argument("--record", type=Path,
                        help="write the command, versions, summary and the output of every test "
                             "that did not pass here, with this machine's paths as placeholders")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when a test outside KNOWN_FAILURES fails")
    parser.add_argument("--expect", nargs="?", type=Path, const=EXPECTATIONS,
                        help="exit 1 when a test fails or skips that the expectations file "
                             f"(default {EXPECTATIONS.name}) says passes, or passed before "
                             "and is gone; say so when tests do better than it says")
    parser.add_argument("--update-expectations", nargs="?", type=Path, const=EXPECTATIONS,
                        help="write this run's outcomes to the expectations file")
    return parser


def run_suite(suite, parallel, args, flags, say, log, logged, scrub):
    """Runs one suite; prints its summary; returns {test name: outcome} and the names of the
    tests that failed without being in KNOWN_FAILURES."""
    ids = collect(parallel, suite, args.pattern)
    if not ids:
        sys.exit(f"no tests collected from {suite} (is horovodlike importable, with "
                 "pytest, mock, parameterized and packaging installed?)")
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    known = KNOWN_FAILURES.get(suite, {})
    started = time.monotonic()
    known_ids = {test_id for test_id in ids if test_id.rsplit("::", 1)[-1] in known}
    outcomes, alone = run_tests(parallel, ids, args, flags, alone_first=known_ids)
    by_name, regressions = {}, []
    for test_id in ids:
        result, out = outcomes[test_id]
        counts[result] += 1
        name = test_id.rsplit("::", 1)[-1]
        by_name[name] = result
        if result == "failed":
            reason = known.get(name)
            say(f"  FAILED {name}" + (f"  (known: {reason})" if reason else ""))
            if reason is None:
                regressions.append(f"{suite}::{name}")
        if result != "passed":
            entry = scrub(f"==== {result.upper()} {test_id}\n{out[-6000:]}\n")
            logged.append(entry)
            if log:
                log.write(entry)
                log.flush()
    say(f"{suite} (-np {args.np}{' ' + flags[0] if flags else ''}): "
        f"{counts['passed']} passed, {counts['failed']} failed, "
        f"{counts['skipped']} skipped in {time.monotonic() - started:.0f} s "
        f"({alone} run alone)")
    return by_name, regressions


def main(argv=None):
    parser = make_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if (args.expect or args.update_expectations) and args.pattern:
        parser.error("--expect and --update-expectations compare whole suites: leave out -k")
    flags = ["--gloo"] if args.gloo else ["--mpi"] if args.mpi else []
    regressions, printed, logged, results = [], [], [], {}
    started_at = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ")
    load_before = load_average()
    expected = load_expectations(args.expect, parser) if args.expect else None

    def say(line):
        print(line, flush=True)
        printed.append(line)

    with tempfile.TemporaryDirectory(prefix="horovod_suites_") as scratch:
        checkout = args.checkout.resolve()
        scrub = scrubber(checkout, scratch)
        parallel = prepare(checkout, Path(scratch))
        log = open(args.log, "w") if args.log else None
        for suite in args.suites:
            results[suite], unknown = run_suite(suite, parallel, args, flags, say, log, logged,
                                                scrub)
            regressions += unknown
        status = 0
        if args.check and regressions:
            say("regressions (failing, not known to be impossible): " + ", ".join(regressions))
            status = 1
        if expected is not None and not check_expectations(expected, results, args, say):
            status = 1
        if args.update_expectations:
            update_expectations(args.update_expectations, results, args)
            say(f"wrote the outcomes of this run to {args.update_expectations.name}")
        if args.record:
            write_record(args, argv, status, started_at, load_before, printed, logged, scrub)
    return status


def write_record(args, argv, status, started_at, load_before, printed, logged, scrub):
    given = argv if argv is not None else sys.argv[1:]
    shown = ["path/to/horovod" if Path(a) == args.checkout else
             args.record.name if Path(a) == args.record else a for a in given]
    command = " ".join(shlex.quote(a) for a in ["python", "scripts/horovod_suites.py", *shown])
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = usage.ru_utime + usage.ru_stime
    header = [f"$ {scrub(command)}",
              f"# exit status {status}; started {started_at}; load average before: "
              f"{load_before}, after: {load_average()} ({os.cpu_count()} cores); "
              f"CPU time of the processes it started: {cpu:.0f} s",
              f"# {versions()}", ""]
    args.record.write_text(
        "\n".join(header + printed) + "\n\n---- LOG: the output of every test that did "
        "not pass\n" + "".join(logged))


if __name__ == "__main__":
    sys.exit(main())
