"""examples/pytorch_pipeline.py: pp=2 x dp=2 on 4 ranks learns the digits."""

import re

from conftest import launch

EPOCH_LINE = re.compile(r"epoch (\d+): loss ([0-9.]+) test accuracy ([0-9.]+)%")


def test_pipeline_example_learns():
    result = launch(4, "../../examples/pytorch_pipeline.py", "--epochs", 3, timeout=400)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    epochs = [tuple(float(v) for v in m.groups())
              for m in map(EPOCH_LINE.search, result.stdout.splitlines()) if m]
    # One line per epoch, from the last stage of the first pipeline only.
    assert [int(e[0]) for e in epochs] == [0, 1, 2], output[-6000:]
    assert epochs[-1][1] < epochs[0][1], epochs
    assert epochs[-1][2] >= 85.0, epochs
