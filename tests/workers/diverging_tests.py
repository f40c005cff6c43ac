"""A test file run whole with pytest on 2 ranks (tests/test_divergence.py), failing the way
Horovod's own suites fail when one rank's assertion fails: rank 1 fails test_one before its
collective and moves on to test_two's, while rank 0 waits in test_one's."""

import numpy as np

from horovodlike.common import basics
from horovodlike.common import numpy_ops as ops


def test_one():
    basics.init()
    assert basics.rank() == 0, "rank 1 fails before the collective"
    ops.allreduce(np.ones(2, np.float32), "one")


def test_two():
    basics.init()
    ops.allreduce(np.ones(2, np.float32), "two")


def test_three():
    basics.init()
    ops.allreduce(np.ones(2, np.float32), "three")
