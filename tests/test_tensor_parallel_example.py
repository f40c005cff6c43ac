"""examples/pytorch_tensor_parallel.py: tp x dp with ZeRO on 4 ranks takes the same steps as
one process (the epoch losses agree) and learns the digits."""

import re

from conftest import REPO, launch

EPOCH = re.compile(r"^\[0\]<stdout>:epoch (\d+): loss ([0-9.]+) test accuracy ([0-9.]+)%$")


def epochs(np, tp):
    # launch() runs scripts from tests/workers; the example lives elsewhere.
    result = launch(np, f"{REPO}/examples/pytorch_tensor_parallel.py", "--tp", tp,
                    "--epochs", 2)
    assert result.returncode == 0, result.stdout + result.stderr
    found = [EPOCH.match(line) for line in result.stdout.splitlines()]
    return [(float(m.group(2)), float(m.group(3))) for m in found if m]


def test_tensor_parallel_example_matches_one_process():
    split, single = epochs(4, 2), epochs(1, 1)
    assert len(split) == len(single) == 2, (split, single)
    for (loss, _), (expected, _) in zip(split, single):
        assert abs(loss - expected) <= 1e-3 * expected + 1e-4, (split, single)
    assert split[-1][1] > 90.0, split
