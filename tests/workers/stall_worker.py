"""Stalls, with HOROVOD_STALL_CHECK_TIME_SECONDS=1 and HOROVOD_STALL_SHUTDOWN_TIME_SECONDS of
several seconds (tests/test_faults.py).

Phase 1: rank 1 submits a cached tensor ('cached', seen twice before) and a new one ('fresh')
2.5 s after rank 0 did: a warning, then both complete. Phase 2: rank 0 submits 'cached' and rank
1 'only1', which the other never submits: both raise HorovodInternalError at the shutdown time.
Writes argv[1]/rank<r>.json (phase 2's start and end as time.time()), then exits 1 as an
uncaught error would."""

import json
import os
import sys
import time

import numpy as np

from horovodlike.common import basics
from horovodlike.common import numpy_ops as ops
from horovodlike.common.exceptions import HorovodInternalError

basics.init()
rank = basics.rank()
result = {}
for _ in range(2):
    ops.allreduce(np.ones(4, np.float32), "cached", op=ops.Sum)

submitted = os.path.join(sys.argv[1], "rank0-submitted")
if rank == 1:
    while not os.path.exists(submitted):  # late from rank 0's submission, not from the above
        time.sleep(0.01)
    time.sleep(2.5)
handles = [ops.allreduce_async(np.ones(4, np.float32), "cached", op=ops.Sum),
           ops.allreduce_async(np.ones(2, np.float32), "fresh", op=ops.Sum)]
if rank == 0:
    open(submitted, "w").close()
outputs = ops.wait_all(handles)
result["phase1"] = "ok" if all((o == 2).all() for o in outputs) else repr(outputs)

result["phase2_started"] = time.time()
try:
    ops.allreduce(np.ones(4, np.float32), "cached" if rank == 0 else "only1", op=ops.Sum)
    result["phase2"] = "no error"
except HorovodInternalError as e:
    result["phase2"] = f"{type(e).__name__}: {e}"
result["phase2_ended"] = time.time()
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
    json.dump(result, f)
sys.exit(1)
