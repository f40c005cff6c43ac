"""Rank 1 is killed in the middle of the job; the others must raise HorovodInternalError
(and write what they saw to a file), never hang."""

import os
import signal
import sys

import torch

import horovodlike.torch as hvd
from common import kill_self, seconds_since_kill

report_dir = sys.argv[1]
hvd.init()
rank = hvd.rank()
# The launcher stops the job when rank 1 dies; ignore its SIGTERM long enough to report.
signal.signal(signal.SIGTERM, signal.SIG_IGN)
big = torch.ones(4 * 1024 * 1024)
for step in range(2):
    hvd.allreduce(big, name="warmup")
if rank == 1:
    kill_self(report_dir)
try:
    for step in range(100000):
        hvd.allreduce(big, name="during")
    outcome = "no error"
except hvd.HorovodInternalError as e:
    outcome = f"HorovodInternalError after {seconds_since_kill(report_dir):.2f} s: {e}"
except Exception as e:  # anything else is a failure of the test
    outcome = f"{type(e).__name__}: {e}"
# Later calls fail at once too.
try:
    hvd.allreduce(torch.ones(1), name="after")
    later = "no error"
except hvd.HorovodInternalError:
    later = "HorovodInternalError"
with open(os.path.join(report_dir, f"rank{rank}.txt"), "w") as f:
    f.write(outcome + "\n" + later + "\n")
