"""Runs the TensorFlow and Keras examples through the launcher, as a user would."""

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import job_env

REPO = Path(__file__).resolve().parents[1]
RANK_LINE = re.compile(r"^\[(\d+)\]<stdout>:(.*)$")
EPOCH_LINE = re.compile(r"epoch (\d+): loss ([0-9.]+) test accuracy ([0-9.]+)%")


def run_example(script, num_proc, *args):
    """Runs examples/<script> on num_proc ranks; returns rank 0's (epoch, loss, accuracy)."""
    command = [sys.executable, "-m", "horovodlike.runner.launch", "-np", str(num_proc),
               "--start-timeout", "120", sys.executable, str(REPO / "examples" / script),
               *map(str, args)]
    result = subprocess.run(command, cwd=REPO, env=job_env(), capture_output=True, text=True,
                            timeout=400)
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{' '.join(command)} exited with {result.returncode}:\n" \
                                   f"{output[-6000:]}"
    epochs = []
    for line in result.stdout.splitlines():
        found = EPOCH_LINE.search(line)
        if found:
            tagged = RANK_LINE.match(line)
            assert tagged is not None and tagged.group(1) == "0", f"not from rank 0: {line!r}"
            epochs.append((int(found.group(1)), float(found.group(2)), float(found.group(3))))
    assert [e[0] for e in epochs] == list(range(1, len(epochs) + 1)) and epochs, output[-6000:]
    return epochs


def check_same_weights(one_path, two_path, one_log, two_log):
    """The -np 1 and -np 2 runs ended with the same weights and logged the same losses."""
    with np.load(one_path) as one, np.load(two_path) as two:
        assert sorted(one.files) == sorted(two.files) and len(one.files) == 4, one.files
        for name in one.files:
            diff = np.abs(one[name] - two[name]).max()
            assert np.allclose(two[name], one[name], rtol=1e-4, atol=1e-5), \
                f"{name}: max difference {diff}"
    assert len(one_log) == len(two_log)
    for (_, loss_one, _), (_, loss_two, _) in zip(one_log, two_log):
        assert loss_two == pytest.approx(loss_one, abs=2e-4)
