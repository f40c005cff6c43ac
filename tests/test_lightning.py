"""HorovodStrategy (horovodlike.lightning) with Lightning's Trainer on real ranks started by the
launcher: training against a single-process run, logging with sync_dist against NumPy over
every rank's values, checkpoints written by rank 0 alone and loaded on another number of
ranks, and examples/lightning_digits.py's accuracy."""

import json
import re
import time

import numpy as np

from conftest import REPO, assert_all_ranks, launch

EXAMPLE = REPO / "examples" / "lightning_digits.py"
# Importing Lightning takes its ranks a while before they join the job; on a loaded machine
# over the launcher's default 30 s.
SLOW_START = ("--start-timeout", "180")
ACCURACY_LINE = re.compile(r"^\[0\]<stdout>:test accuracy ([0-9.]+)% on 2 ranks$", re.M)


def test_fit_logging_and_checkpoints_on_two_ranks_then_one(tmp_path):
    # tests/workers/lightning_worker.py: fit (accumulate_grad_batches=2, a per-step learning
    # rate, Trainer(strategy="horovod")) matches one process on the global batches to rtol
    # 1e-5; predict, validate, test run; the strategy's collectives match their definitions.
    result = launch(2, "lightning_worker.py", "train", tmp_path, timeout=400,
                    launcher_args=SLOW_START)
    for marker in ("fit matches the single-process run OK", "logging and checkpoints OK",
                   "collectives OK"):
        assert_all_ranks(result, 2, marker)
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]

    # self.log(..., sync_dist=True): every rank's epoch value is the one over all ranks' steps
    # (a mean weighted by batch size, the max, the sum), as is the torchmetrics metric's.
    values, sizes = np.array([step for report in reports for step in report["seen"]]).T
    mean = (values * sizes).sum() / sizes.sum()
    own_means = [np.average(np.array(r["seen"])[:, 0], weights=np.array(r["seen"])[:, 1])
                 for r in reports]
    assert not np.isclose(own_means[0], own_means[1], rtol=1e-3)  # the ranks logged apart
    for report in reports:
        logged = report["validated"]
        np.testing.assert_allclose(logged["val_loss"], mean, rtol=1e-5)
        np.testing.assert_allclose(logged["val_metric"], mean, rtol=1e-5)
        np.testing.assert_allclose(logged["val_max"], values.max(), rtol=1e-6)
        assert logged["val_batches"] == len(values)
    assert reports[0]["accuracy_mean"] == reports[1]["accuracy_mean"]

    # Checkpoints: rank 0 wrote every file; both ranks name the same last one.
    assert not (tmp_path / "saved_by_rank1.txt").exists()
    written = (tmp_path / "saved_by_rank0.txt").read_text().split()
    assert len(written) == 2, written  # one per epoch
    assert reports[0]["checkpoint"] == reports[1]["checkpoint"] == written[-1]

    # Loaded on one rank: the weights rank 0 had, its optimizer state, training goes on.
    result = launch(1, "lightning_worker.py", "reload", tmp_path, timeout=400,
                    launcher_args=SLOW_START)
    assert_all_ranks(result, 1, "reload on 1 ranks OK")


def test_a_rank_that_raises_ends_the_job(tmp_path):
    # Rank 1 raises inside fit; rank 0, waiting for its gradients, must not hang: the failing
    # rank skips the strategy's closing barrier and exits, and the launcher stops the job.
    started = time.monotonic()
    result = launch(2, "lightning_worker.py", "fail", tmp_path, timeout=400,
                    launcher_args=SLOW_START)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "RuntimeError: rank 1 fails on purpose" in output
    assert "rank 1 (on localhost) exited with code 1" in result.stderr, output
    assert "fit returned" not in result.stdout, output
    assert time.monotonic() - started < 60, output


def test_example_reaches_95_percent_test_accuracy():
    result = launch(2, EXAMPLE, "--epochs", 5, timeout=400, launcher_args=SLOW_START)
    assert result.returncode == 0, result.stdout + result.stderr
    found = ACCURACY_LINE.findall(result.stdout)
    assert len(found) == 1, result.stdout + result.stderr  # rank 0 alone reports it
    assert float(found[0]) >= 95.0, result.stdout
