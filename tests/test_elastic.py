"""Elastic training with real processes: a worker killed mid-epoch, a worker that stops
responding (SIGSTOP) mid-epoch, and a host added by the discovery script. The final model must
equal a single-process replay of the committed steps, and each epoch must use every sample
exactly once."""

import json
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import WORKERS, job_env
import subprocess

N, FEATURES, CLASSES = 60, 5, 3


def run_elastic(tmp_path, scenario, np_, hosts, min_np, max_np, extra=(),
                worker="elastic_worker.py", env=None):
    hosts_file = tmp_path / "hosts.txt"
    hosts_file.write_text(hosts + "\n")
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat {hosts_file}\n")
    script.chmod(0o755)
    report = tmp_path / "report.json"
    command = [sys.executable, "-m", "horovodlike.runner.launch", "-np", str(np_),
               "--min-np", str(min_np), "--max-np", str(max_np),
               "--host-discovery-script", str(script), *extra,
               sys.executable, str(WORKERS / worker), str(report), scenario,
               str(hosts_file)]
    started = time.monotonic()
    result = subprocess.run(command, env=job_env(env), capture_output=True, text=True,
                            timeout=240)
    result.elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return json.loads(report.read_text()), result


def replay(steps):
    """The same steps in one process: the mean loss over each global batch."""
    gen = torch.Generator().manual_seed(0)
    X = torch.randn(N, FEATURES, generator=gen, dtype=torch.float64)
    Y = torch.randint(0, CLASSES, (N,), generator=gen)
    torch.manual_seed(1)
    model = torch.nn.Linear(FEATURES, CLASSES).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    for _, per_rank in steps:
        idx = [i for part in per_rank for i in part]
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(X[idx]), Y[idx]).backward()
        opt.step()
    return model.state_dict()


def check_report(report, directory=None):
    if directory is not None:  # the committed steps never went back (a sync from a new worker)
        counts = [int(line) for line in (directory / "commits.txt").read_text().split()]
        assert counts == sorted(counts), counts
    epochs = {}
    for epoch, per_rank in report["steps"]:
        epochs.setdefault(epoch, []).extend(i for part in per_rank for i in part)
    for epoch, indices in epochs.items():
        assert sorted(indices) == list(range(N)), f"epoch {epoch} repeated or skipped samples"
    expected = replay(report["steps"])
    for name, value in report["weights"].items():
        assert torch.allclose(torch.tensor(value, dtype=torch.float64), expected[name],
                              rtol=1e-9, atol=1e-10), f"{name} differs from the replay"


def test_killed_worker_job_finishes_with_the_others(tmp_path):
    report, result = run_elastic(tmp_path, "kill", 3, "localhost:3", min_np=2, max_np=3)
    sizes = [len(per_rank) for _, per_rank in report["steps"]]
    assert sizes[0] == 3 and sizes[-1] == 2 and report["size"] == 2, sizes
    assert "worker localhost/2 was killed by signal 9" in result.stderr
    check_report(report, tmp_path)


def test_stopped_worker_is_failed_after_the_peer_timeout(tmp_path):
    """Worker localhost/2 stops (SIGSTOP) just after a commit, as a hung worker would. The others
    give up on it after HOROVOD_PEER_TIMEOUT_SECONDS and report it; the driver stops it rather
    than waiting for it to ask for the next round, and the job goes on with the other two from
    the last commit."""
    report, result = run_elastic(tmp_path, "stop", 3, "localhost:3", min_np=2, max_np=3,
                                 extra=["--elastic-timeout", "30"],
                                 env={"HOROVOD_PEER_TIMEOUT_SECONDS": "3"})
    sizes = [len(per_rank) for _, per_rank in report["steps"]]
    assert sizes[0] == 3 and sizes[-1] == 2 and report["size"] == 2, sizes
    assert "horovodlikerun: worker localhost/2 (rank 2 of round 0) stopped responding: rank " \
           in result.stderr, result.stderr[-4000:]
    assert "was killed by signal" not in result.stderr, result.stderr[-4000:]
    stopped = int((tmp_path / "stopped.pid").read_text())
    assert not Path(f"/proc/{stopped}").exists(), "the stopped worker is still there"
    check_report(report)
    # The peer timeout, the grace, the stop and one more round: far less than the survivors'
    # wait for a round (--elastic-timeout) and the driver's wait for enough workers after it.
    assert result.elapsed < 45, result.elapsed


def test_new_worker_that_hangs_before_joining_is_stopped(tmp_path):
    """The worker the discovery script adds stops (SIGSTOP) before init(): it never asks for a
    round. The others wait --start-timeout for it, then the driver stops it and forms the round
    without it; the job ends with the two it had."""
    report, result = run_elastic(tmp_path, "hang_new", 2, "localhost:2", min_np=2, max_np=3,
                                 extra=["--start-timeout", "8"])
    assert report["size"] == 2, report["size"]
    assert "worker localhost/2 did not ask for its first round within --start-timeout (8 s)" \
        in result.stderr, result.stderr[-4000:]
    stopped = int((tmp_path / "stopped.pid").read_text())
    assert not Path(f"/proc/{stopped}").exists(), "the stopped worker is still there"
    check_report(report, tmp_path)


def test_new_worker_given_rank_0_takes_the_committed_state(tmp_path):
    """Host 127.0.0.2, first in the host order, leaves and comes back: its new worker is rank 0
    of the next round with nothing committed. The others must not take its fresh state: the
    state is synchronized from the ranks holding the latest commit, and the number of committed
    steps never goes back."""
    report, result = run_elastic(tmp_path, "rejoin", 3, "127.0.0.2:1,localhost:2", min_np=2,
                                 max_np=3)
    sizes = [len(per_rank) for _, per_rank in report["steps"]]
    assert 2 in sizes and sizes[-1] == 3 and report["size"] == 3, sizes
    assert "round 2: 3 workers (127.0.0.2/0, localhost/0, localhost/1)" in result.stdout
    check_report(report, tmp_path)


def test_host_added_by_discovery_joins(tmp_path):
    report, result = run_elastic(tmp_path, "grow", 2, "localhost:2", min_np=2, max_np=3)
    sizes = [len(per_rank) for _, per_rank in report["steps"]]
    assert sizes[0] == 2 and sizes[-1] == 3 and report["size"] == 3, sizes
    check_report(report)


def numpy_replay(report):
    """The committed steps of tests/workers/tf_elastic_worker.py in NumPy: a linear layer, softmax
    cross-entropy averaged over each global batch, SGD with momentum as Keras defines it."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(N, FEATURES))
    Y = rng.integers(0, CLASSES, N)
    initial = np.random.default_rng(1)
    kernel, bias = initial.normal(size=(FEATURES, CLASSES)), initial.normal(size=CLASSES)
    velocity = [np.zeros_like(kernel), np.zeros_like(bias)]
    for per_rank in report["steps"]:
        idx = [i for part in per_rank for i in part]
        assert len(idx) == report["global_batch"]
        logits = X[idx] @ kernel + bias
        p = np.exp(logits - logits.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        p[np.arange(len(idx)), Y[idx]] -= 1.0
        p /= len(idx)
        for i, (w, g) in enumerate([(kernel, X[idx].T @ p), (bias, p.sum(0))]):
            velocity[i] = report["momentum"] * velocity[i] - report["lr"] * g
            w += velocity[i]
    return kernel, bias


def test_tensorflow_keras_state_killed_worker_job_finishes_with_the_others(tmp_path):
    pytest.importorskip("tensorflow")
    report, result = run_elastic(tmp_path, "kill", 3, "localhost:3", min_np=2, max_np=3,
                                 extra=["--start-timeout", "120"], worker="tf_elastic_worker.py")
    sizes = [len(per_rank) for per_rank in report["steps"]]
    # Steps 0-3 with three ranks, then the fifth step rolled back and redone by two.
    assert sizes == [3] * 4 + [2] * 8 and report["size"] == 2, sizes
    assert "worker localhost/2 was killed by signal 9" in result.stderr
    for global_step, per_rank in enumerate(report["steps"]):
        assert [i for part in per_rank for i in part] == \
            [(global_step * report["global_batch"] + k) % N for k in range(report["global_batch"])]
    kernel, bias = numpy_replay(report)
    assert np.allclose(report["weights"][0], kernel, rtol=1e-9, atol=1e-10)
    assert np.allclose(report["weights"][1], bias, rtol=1e-9, atol=1e-10)
