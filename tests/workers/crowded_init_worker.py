"""init() while a crowd of silent connections sits on rank 0's peer listener and on the launcher's
rendezvous server. Writes argv[1]/rank<r>.json; argv[2] is the crowd's size per address.

Both ranks run three generations of init(), allreduce, shutdown(). Generation 0 warms up. Before
generations 1 and 2, rank 1 waits until rank 0 has published its listening address (rank 0 is
then inside init(), accepting), so that rank 1's init() times the same steps each time:
generation 1 is the baseline; before generation 2, a helper process
(tests/helpers/silent_connections.py) opens the crowd on rank 0's listening port and on the
rendezvous server, and keeps it open, silent, through rank 1's init() and the allreduces.
Rank 0 reports the most files it had open during those two init() calls.
"""

import json
import os
import subprocess
import sys
import threading
import time

import numpy as np

HELPERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "helpers")
sys.path.insert(0, HELPERS)
from rendezvous_client import RendezvousClient  # noqa: E402

from horovodlike.common import basics  # noqa: E402
from horovodlike.common import numpy_ops as ops  # noqa: E402

report_dir, crowd = sys.argv[1], int(sys.argv[2])
rank = int(os.environ["HOROVOD_RANK"])


def check_allreduces(generation):
    for name, count in (("small", 10), ("large", 1 << 20)):
        values = np.arange(count, dtype=np.float64) * (rank + 1) + generation
        out = ops.allreduce(values, f"{name}.{generation}", op=ops.Sum)
        expected = np.arange(count, dtype=np.float64) * 3 + 2 * generation
        assert np.array_equal(out, expected), (name, generation, out[:4])


def rank0_address(generation):
    client = RendezvousClient.from_env()
    value = client.get(f"addr/{generation}/0", 30000)
    client.close()
    assert value.startswith("VALUE "), value
    return value[len("VALUE "):]


def start_crowd(generation):
    rendezvous = f"{os.environ['HOROVOD_RENDEZVOUS_ADDR']}:{os.environ['HOROVOD_RENDEZVOUS_PORT']}"
    helper = subprocess.Popen(
        [sys.executable, os.path.join(HELPERS, "silent_connections.py"), str(crowd),
         rank0_address(generation), rendezvous],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    words = helper.stdout.readline().split()
    assert words[:1] == ["connected"], words
    return helper, [int(n) for n in words[1:]]


def timed_init():
    started = time.monotonic()
    basics.init()
    return time.monotonic() - started


def init_counting_open_files():
    """init(), returning the most files this process had open meanwhile (sampled)."""
    peak, done = [0], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], len(os.listdir("/proc/self/fd")))
            time.sleep(0.002)
    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        basics.init()
    finally:
        done.set()
        sampler.join()
    return peak[0]


report = {}
for generation in range(3):
    helper = None
    if rank == 1 and generation > 0:
        if generation == 2:
            helper, report["connected"] = start_crowd(generation)
        else:
            rank0_address(generation)
        report[f"init seconds {generation}"] = timed_init()
    elif rank == 0 and generation > 0:
        report[f"open files {generation}"] = init_counting_open_files()
    else:
        basics.init()
    check_allreduces(generation)
    if helper is not None:
        helper.stdin.close()
        words = helper.stdout.readline().split()
        helper.wait(timeout=30)
        report["closed by server"] = [int(n) for n in words[1:]]
    basics.shutdown()

with open(os.path.join(report_dir, f"rank{rank}.json"), "w") as f:
    json.dump(dict(outcome="ok", **report), f)
