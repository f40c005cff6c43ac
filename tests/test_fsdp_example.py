"""examples/pytorch_fsdp.py on 4 real ranks: every rank stays under its memory budget while
the whole model would not fit in it, the loss falls, and the trained weights equal one process
training the whole batch with plain PyTorch; on 2 ranks the same budget is too small and the
job stops with the budget's error."""

import importlib.util
import os
import re
import subprocess
import sys

import torch
import torch.nn.functional as F

from test_examples import job_env

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(REPO, "examples", "pytorch_fsdp.py")
STEPS, LR = 12, 3e-3


def _example_module():
    spec = importlib.util.spec_from_file_location("pytorch_fsdp_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(num_proc, *args):
    command = [sys.executable, "-m", "horovodlike.runner.launch", "-np", str(num_proc),
               sys.executable, EXAMPLE, "--steps", str(STEPS), "--lr", str(LR),
               *map(str, args)]
    return subprocess.run(command, env=job_env(), cwd=REPO, capture_output=True, text=True,
                          timeout=240)


def _single_process(example):
    """The same steps in one process on the whole batch, unsharded: the reference."""
    model = example.build_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    x, y = example.batch()
    for _ in range(STEPS):
        optimizer.zero_grad()
        F.mse_loss(model(x), y).backward()
        optimizer.step()
    return model.state_dict()


def test_fsdp_example_trains_under_the_budget_and_matches_one_process(tmp_path):
    saved = tmp_path / "full.pt"
    result = _run(4, "--save", saved)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    whole, budget = map(float, re.search(r"whole model with Adam: ([0-9.]+) MiB; budget per "
                                         r"rank ([0-9.]+) MiB", result.stdout).groups())
    assert whole > budget == 2.5
    peaks = {int(r): (int(p), int(b)) for r, p, b in re.findall(
        r"rank (\d): peak held (\d+) bytes, budget (\d+)", result.stdout)}
    assert sorted(peaks) == [0, 1, 2, 3], output[-6000:]
    example = _example_module()
    shard_footprint = example.footprint(example.build_model()) / 4
    for peak, limit in peaks.values():
        # At least this rank's quarter of parameters, gradients and Adam state; under the cap.
        assert shard_footprint <= peak <= limit == 2.5 * (1 << 20)
    losses = [float(v) for v in re.findall(r"step \d+: loss ([0-9.]+)", result.stdout)]
    assert len(losses) == STEPS
    assert all(b < a for a, b in zip(losses, losses[1:])) and losses[-1] < 0.6 * losses[0]

    full = torch.load(saved)
    reference = _single_process(example)
    assert full.keys() == reference.keys()
    for name, value in reference.items():
        torch.testing.assert_close(full[name], value, rtol=1e-5, atol=1e-6, msg=name)


def test_fsdp_example_stops_when_a_rank_goes_over_its_budget():
    # On 2 ranks each holds half of the 8 MiB: over 2.5 MiB once Adam's state exists.
    result = _run(2, "--steps", 2)
    assert result.returncode != 0
    assert "over its budget of 2.50 MiB" in result.stdout + result.stderr
