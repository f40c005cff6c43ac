"""examples/pytorch_digits.py run through the launcher with real processes."""

import os
import re
import subprocess
import sys

import numpy as np
import pytest

import horovodlike

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(REPO, "examples", "pytorch_digits.py")
# Ranks import the same horovodlike as this process, installed or from a source tree.
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(horovodlike.__file__)))
TIMEOUT_S = 300

RANK_LINE = re.compile(r"^\[(\d+)\]<stdout>:(.*)$")
EPOCH_LINE = re.compile(r"epoch (\d+): loss ([0-9.]+) test accuracy ([0-9.]+)%")


def job_env():
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOROVOD_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [PACKAGE_PARENT, env.get("PYTHONPATH")]))
    return env


def run_digits(num_proc, *args):
    """Runs the example on num_proc ranks; returns rank 0's (epoch, loss, accuracy) lines."""
    command = [sys.executable, "-m", "horovodlike.runner.launch", "-np", str(num_proc),
               sys.executable, EXAMPLE, *map(str, args)]
    result = subprocess.run(command, env=job_env(), cwd=REPO, capture_output=True, text=True,
                            timeout=TIMEOUT_S)
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{' '.join(command)} exited with {result.returncode}:\n{output}"

    epochs = []
    for line in result.stdout.splitlines():
        tagged = RANK_LINE.match(line)
        found = EPOCH_LINE.search(line)
        if not found:
            continue
        assert tagged is not None, f"untagged output line: {line!r}"
        assert tagged.group(1) == "0", f"only rank 0 reports, got: {line!r}"
        epochs.append((int(found.group(1)), float(found.group(2)), float(found.group(3))))
    assert epochs, f"no epoch lines from rank 0 in:\n{output}"
    return epochs


def load_weights(path):
    with np.load(path) as arrays:
        return {name: arrays[name] for name in arrays.files}


@pytest.mark.parametrize("num_proc", [1, 2, 4])
def test_reaches_95_percent_test_accuracy(num_proc):
    epochs = run_digits(num_proc)
    assert [e[0] for e in epochs] == list(range(1, len(epochs) + 1))
    final_epoch, final_loss, final_accuracy = epochs[-1]
    assert final_accuracy >= 95.0, f"-np {num_proc}: {epochs}"
    assert final_loss < epochs[0][1]


def test_two_ranks_of_16_train_like_one_rank_of_32(tmp_path):
    epochs = 3  # few enough that float rounding of the two summation orders stays below tolerance
    common = ["--epochs", epochs, "--seed", 3, "--lr", 0.2]
    one_rank = tmp_path / "np1_b32.npz"
    two_ranks = tmp_path / "np2_b16.npz"
    bigger_batch = tmp_path / "np2_b32.npz"

    log_one = run_digits(1, *common, "--batch-size", 32, "--save-weights", one_rank)
    log_two = run_digits(2, *common, "--batch-size", 16, "--save-weights", two_ranks)
    run_digits(2, *common, "--batch-size", 32, "--save-weights", bigger_batch)

    expected = load_weights(one_rank)
    got = load_weights(two_ranks)
    assert sorted(got) == sorted(expected) == ["0.bias", "0.weight", "2.bias", "2.weight"]
    for name in expected:
        diff = np.abs(got[name] - expected[name]).max()
        assert np.allclose(got[name], expected[name], rtol=1e-4, atol=1e-5), f"{name}: max diff {diff}"

    # The printed loss is the mean over ranks, hence the mean over the same global batches.
    assert len(log_one) == len(log_two) == epochs
    for (_, loss_one, _), (_, loss_two, _) in zip(log_one, log_two):
        assert loss_two == pytest.approx(loss_one, abs=2e-4)

    # A different global batch must give different weights, or the comparison above proves nothing.
    other = load_weights(bigger_batch)
    assert not all(np.allclose(other[name], expected[name], rtol=1e-4, atol=1e-5) for name in expected)


def test_cuda_without_a_gpu_fails_clearly():
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: --cuda would train on it")
    result = subprocess.run([sys.executable, EXAMPLE, "--cuda"], env=job_env(), cwd=REPO,
                            capture_output=True, text=True, timeout=TIMEOUT_S)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "--cuda: this PyTorch" in result.stderr and "sees no CUDA device" in result.stderr
