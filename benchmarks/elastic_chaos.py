"""An elastic job under fire: workers killed or stopped at random while it trains.

    python benchmarks/elastic_chaos.py --duration 900 --out benchmarks/results/elastic-chaos.json

starts `horovodlikerun` with up to --max-np workers (elastic: --min-np 2, a host discovery
script that reads a hosts file) training a small model with commits. Every --interval seconds
(on average) it picks a live worker at random and kills it (SIGKILL) or stops it (SIGSTOP, as a
hung worker), then offers one more slot in the hosts file so that the driver starts a worker in
its place; the next attack comes once the job has committed again (within --recovery-limit
seconds, or the run fails). After --duration it asks the job to finish at its next commit and
checks:

- the launcher exits 0;
- every committed step is recorded exactly once (step numbers 0..n-1, each once), every
  completed epoch used each sample exactly once and the last one no sample twice;
- the final weights equal a single-process replay of the committed steps (float64, 1e-9);
- every stopped worker was ended by the driver (none is left behind).

It never attacks when fewer than --min-np workers would be left running, nor the last worker
holding committed state (the job would start over: elastic state lives in the workers).

It reports the attacks survived and the recovery time of each: from the attack to the first
commit after it (the state saved, even when the commit then re-forms the job to take in new
workers). The raw output (commit, load, every attack) goes to --out as JSON. The test suite runs
it for a few seconds (tests/test_elastic_chaos.py); the figures in docs/elastic.md come from a
long run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

N, FEATURES, CLASSES, BATCH, COMMIT_EVERY, LR, MOMENTUM = 48, 5, 3, 2, 3, 0.2, 0.9


# ---------------------------------------------------------------------------------- the worker
def worker_main(workdir: Path, step_time: float) -> None:
    import torch

    import horovodlike.torch as hvd
    from horovodlike.common.exceptions import HostsUpdatedInterrupt
    from horovodlike.data import ElasticSampler

    worker = os.environ["HOROVOD_ELASTIC_WORKER_ID"]
    (workdir / "pids" / worker.replace("/", "_")).write_text(str(os.getpid()))
    hvd.init()
    torch.set_num_threads(1)
    X, Y = dataset()
    torch.manual_seed(1)
    model = torch.nn.Linear(FEATURES, CLASSES).double()
    # Each rank's loss is its part of the global batch's summed loss over the global batch's
    # size: the summed gradients are the global mean however the batch is split.
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM),
        named_parameters=model.named_parameters(), op=hvd.Sum)
    sampler = ElasticSampler(range(N), shuffle=True, seed=7)
    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0,
                                   steps=[], done=False)
    commits = workdir / "commits.log"

    holder = workdir / "holders" / worker.replace("/", "_")

    def saved():
        if not holder.exists():  # this worker now holds committed state
            holder.write_text("")
        if hvd.rank() == 0:
            with open(commits, "a") as f:
                f.write(f"{time.time():.3f} {len(state.steps)} {hvd.size()}\n")

    def commit():
        try:
            state.commit()
        except HostsUpdatedInterrupt:
            saved()  # saved, then told to re-form with the new workers
            raise
        saved()
        state.done = hvd.broadcast_object((workdir / "stop").exists(), 0, name="chaos.stop")

    @hvd.elastic.run
    def train(state):
        while not state.done:
            # After a reset the sampler splits what is left of the epoch: batches count from 0.
            for b in range(sampler.batches_per_epoch(BATCH)):
                idx = sampler.get_indices(b, BATCH)
                total = sampler.global_batch_size(b, BATCH)
                optimizer.zero_grad()
                loss = torch.nn.functional.cross_entropy(model(X[idx]), Y[idx], reduction="sum")
                (loss / total).backward()
                optimizer.step()
                state.steps.append([len(state.steps), state.epoch,
                                    hvd.allgather_object(idx, name="chaos.indices")])
                sampler.record_batch(b, BATCH)
                state.batch += 1
                time.sleep(step_time)
                if state.batch % COMMIT_EVERY == 0:
                    commit()
                    if state.done:
                        return
            state.epoch += 1
            state.batch = 0
            sampler.set_epoch(state.epoch)
            commit()

    train(state)
    if hvd.rank() == 0:
        (workdir / "report.json").write_text(json.dumps({
            "steps": state.steps, "size": hvd.size(),
            "weights": {k: v.tolist() for k, v in model.state_dict().items()}}))


def dataset():
    import torch
    gen = torch.Generator().manual_seed(0)
    X = torch.randn(N, FEATURES, generator=gen, dtype=torch.float64)
    Y = torch.randint(0, CLASSES, (N,), generator=gen)
    return X, Y


# ---------------------------------------------------------------------------------- the checks
def replay(steps):
    """The committed steps in one process: one SGD step on each global batch's mean loss."""
    import torch
    X, Y = dataset()
    torch.manual_seed(1)
    model = torch.nn.Linear(FEATURES, CLASSES).double()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    for _, _, per_rank in steps:
        idx = [i for part in per_rank for i in part]
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(X[idx]), Y[idx]).backward()
        opt.step()
    return model.state_dict()


def check_report(report) -> list[str]:
    """What is wrong with the job's record of its committed steps (empty when nothing is)."""
    import torch
    problems = []
    steps = report["steps"]
    numbers = [s[0] for s in steps]
    if numbers != list(range(len(steps))):
        problems.append(f"committed steps are not 0..{len(steps) - 1}, each once: {numbers[:20]}")
    epochs: dict[int, list[int]] = {}
    for _, epoch, per_rank in steps:
        epochs.setdefault(epoch, []).extend(i for part in per_rank for i in part)
    last = max(epochs, default=-1)
    for epoch, indices in sorted(epochs.items()):
        if len(set(indices)) != len(indices):
            problems.append(f"epoch {epoch} used a sample twice")
        elif epoch < last and sorted(indices) != list(range(N)):
            skipped = sorted(set(range(N)) - set(indices))
            problems.append(f"epoch {epoch} skipped samples: {skipped}")
    if sorted(epochs) != list(range(last + 1)):
        problems.append(f"epochs are not 0..{last}: {sorted(epochs)}")
    expected = replay(steps)
    for name, value in report["weights"].items():
        got = torch.tensor(value, dtype=torch.float64)
        if not torch.allclose(got, expected[name], rtol=1e-9, atol=1e-10):
            problems.append(f"{name} differs from the single-process replay by "
                            f"{(got - expected[name]).abs().max().item():.3g}")
    return problems


# ---------------------------------------------------------------------------------- the driver
def _state(pid: int) -> str | None:
    """The process's state letter from /proc (None when it is gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def alive(pid: int) -> bool:
    """Whether the process exists and is neither a zombie nor stopped."""
    return _state(pid) not in (None, "Z", "T", "t", "X")


def exists(pid: int) -> bool:
    return _state(pid) not in (None, "Z", "X")


def live_workers(workdir: Path) -> dict[str, int]:
    found = {}
    for path in (workdir / "pids").iterdir():
        try:
            pid = int(path.read_text())
        except ValueError:  # being written
            continue
        if alive(pid):
            found[path.name.replace("_", "/")] = pid
    return found


def _log_lines(stream, path: Path) -> None:
    """The launcher's output with the time of each line, to set beside the attacks'."""
    with open(path, "w") as log:
        for line in stream:
            log.write(f"{time.time():.3f} {line}")
            log.flush()


def write_atomically(path: Path, text: str) -> None:
    """The discovery script must never read a half-written file: no slots would stop them all."""
    temporary = path.with_suffix(".new")
    temporary.write_text(text)
    os.replace(temporary, path)


def read_commits(workdir: Path) -> list[tuple[float, int, int]]:
    path = workdir / "commits.log"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 3:
            rows.append((float(parts[0]), int(parts[1]), int(parts[2])))
    return rows


def run(args) -> dict:
    rng = random.Random(args.seed)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="elastic-chaos-"))
    (workdir / "pids").mkdir(parents=True, exist_ok=True)
    (workdir / "holders").mkdir(exist_ok=True)
    slots = args.max_np
    hosts = workdir / "hosts.txt"
    hosts.write_text(f"localhost:{slots}\n")
    discover = workdir / "discover.sh"
    discover.write_text(f"#!/bin/sh\ncat '{hosts}'\n")
    discover.chmod(0o755)
    env = dict(os.environ, HOROVOD_PEER_TIMEOUT_SECONDS=str(args.peer_timeout),
               OMP_NUM_THREADS="1")
    command = [sys.executable, "-m", "horovodlike.runner.launch", "-np", str(args.max_np),
               "--min-np", str(args.min_np), "--max-np", str(args.max_np),
               "--host-discovery-script", str(discover), "--elastic-timeout", "60",
               "--start-timeout", str(args.start_timeout),
               sys.executable, os.path.abspath(__file__), "--worker", str(workdir),
               "--step-time", str(args.step_time)]
    started = time.time()
    job = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
    logger = threading.Thread(target=_log_lines, args=(job.stdout, workdir / "launcher.log"))
    logger.start()
    attacks, stopped_pids, stuck = [], [], None
    try:
        # The first commit: the job is up.
        while not read_commits(workdir) and job.poll() is None:
            time.sleep(0.1)
        deadline = time.time() + args.duration
        while time.time() < deadline and job.poll() is None:
            time.sleep(rng.uniform(0.5, 1.5) * args.interval)
            try:
                if attacks and not _recovered(workdir, attacks[-1], args.recovery_limit):
                    continue
            except _NoRecovery as error:
                stuck = str(error)
                break
            workers = live_workers(workdir)
            holders = {w for w in workers if (workdir / "holders" / w.replace("/", "_")).exists()}
            if len(workers) <= args.min_np or time.time() >= deadline:
                continue  # wait for the replacements: never fewer than --min-np
            # Never the last worker holding committed state: the job would start over.
            worker = rng.choice(sorted(workers if len(holders) > 1 else set(workers) - holders))
            action = rng.choice(["kill", "stop"])
            os.kill(workers[worker], signal.SIGKILL if action == "kill" else signal.SIGSTOP)
            attacks.append({"time": time.time(), "worker": worker, "pid": workers[worker],
                            "action": action, "live_before": len(workers)})
            if action == "stop":
                stopped_pids.append(workers[worker])
            slots += 1  # a new slot for its replacement
            write_atomically(hosts, f"localhost:{slots}\n")
        (workdir / "stop").write_text("")
        try:
            code = job.wait(timeout=args.finish_timeout)
        except subprocess.TimeoutExpired:
            job.send_signal(signal.SIGINT)
            code = job.wait(timeout=30)
    finally:
        if job.poll() is None:
            job.kill()
        logger.join(timeout=10)
    ended = time.time()
    time.sleep(1.0)
    commits = read_commits(workdir)
    for attack in attacks:
        after = [t for t, _, _ in commits if t > attack["time"]]
        attack["recovery_s"] = round(after[0] - attack["time"], 3) if after else None
    problems = [] if code == 0 else [f"horovodlikerun exited with {code}"]
    if stuck:
        problems.append(stuck)
    report_path = workdir / "report.json"
    report = json.loads(report_path.read_text()) if report_path.exists() else None
    if report is None:
        problems.append("the job wrote no report")
    else:
        problems += check_report(report)
    left = [pid for pid in stopped_pids if exists(pid)]
    if left:
        problems.append(f"stopped workers left behind: {left}")
    recoveries = sorted(a["recovery_s"] for a in attacks if a["recovery_s"] is not None)
    return {
        "command": " ".join(["python", "benchmarks/elastic_chaos.py", *sys.argv[1:]]),
        "commit": _git_commit(), "load_before": _load(), "cpus": os.cpu_count(),
        "seconds": round(ended - started, 1), "attacks": attacks,
        "kills": sum(a["action"] == "kill" for a in attacks),
        "stops": sum(a["action"] == "stop" for a in attacks),
        "committed_steps": len(report["steps"]) if report else None,
        "epochs": (report["steps"][-1][1] + 1) if report and report["steps"] else None,
        "final_size": report["size"] if report else None,
        "recovery_s": {"min": recoveries[0], "median": recoveries[len(recoveries) // 2],
                       "max": recoveries[-1]} if recoveries else None,
        "problems": problems, "workdir": None if args.workdir is None else str(workdir),
        "launcher_log_tail": (workdir / "launcher.log").read_text()[-3000:] if problems else "",
    }


def _recovered(workdir: Path, attack: dict, limit: float) -> bool:
    """Whether the job has committed since `attack` (then the next one may come). A job that
    has not within `limit` seconds has failed to recover: the run stops there."""
    if any(t > attack["time"] for t, _, _ in read_commits(workdir)):
        return True
    if time.time() - attack["time"] > limit:
        raise _NoRecovery(f"no commit within {limit:g} s of attack {attack}")
    return False


class _NoRecovery(Exception):
    pass


def _git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    except OSError:
        return "unknown"


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=60.0,
                        help="seconds of attacks (default 60)")
    parser.add_argument("--interval", type=float, default=4.0,
                        help="mean seconds between attacks, once the job has committed since "
                             "the last one (default 4)")
    parser.add_argument("--max-np", type=int, default=4)
    parser.add_argument("--min-np", type=int, default=2)
    parser.add_argument("--peer-timeout", type=float, default=3.0,
                        help="HOROVOD_PEER_TIMEOUT_SECONDS: when a stopped worker counts as failed")
    parser.add_argument("--start-timeout", type=float, default=10.0,
                        help="horovodlikerun --start-timeout: how long the ranks of a round wait "
                             "for one another to connect (default 10)")
    parser.add_argument("--recovery-limit", type=float, default=120.0,
                        help="seconds after an attack by which the job must commit again "
                             "(default 120)")
    parser.add_argument("--step-time", type=float, default=0.05,
                        help="seconds each training step sleeps, as a model's compute would")
    parser.add_argument("--finish-timeout", type=float, default=120.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", help="keep the job's files here (default: a temp folder)")
    parser.add_argument("--out", help="write the JSON result here too")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker_main(Path(args.worker), args.step_time)
        return 0
    result = run(args)
    text = json.dumps(result, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text if result["problems"] else json.dumps(
        {k: v for k, v in result.items() if k != "attacks"}, indent=1))
    return 1 if result["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
