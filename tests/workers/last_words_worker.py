"""Rank 1 exits with code 3 after a first allreduce; every other rank's next allreduce fails
because of it, and that rank takes argv[1] seconds to say so before it exits 1 (as a test
runner printing its summary does). Numpy only, so that a job starts in well under a second."""

import os
import sys
import time

import numpy as np

from horovodlike.common import basics
from horovodlike.common import numpy_ops as ops
from horovodlike.common.exceptions import HorovodInternalError

basics.init()
rank = basics.rank()
ops.allreduce(np.ones(4, np.float32), "first")
if rank == 1:
    sys.exit(3)
try:
    ops.allreduce(np.ones(4, np.float32), "second")
except HorovodInternalError as error:
    print(f"rank {rank} caught: {str(error)[:80]}", flush=True)
    time.sleep(float(sys.argv[1]))
    print(f"rank {rank}: last words", flush=True)
    sys.exit(1)
print(f"rank {rank}: the second allreduce completed without rank 1", flush=True)
