"""The runtime's life cycle under threads: init does not block other callers while it waits
for the other ranks; a caller holding the runtime survives a shutdown(); the fusion buffer
gives memory back after one large step."""

import sys
import threading
import time

import torch

import horovodlike.torch as hvd
from horovodlike import _core
from horovodlike._core import _testing
from common import check
import os

rank = int(os.environ["HOROVOD_RANK"])

# 1. Rank 1 arrives only once rank 0 has called into the core from another thread while its
# init() waits for rank 1: a core that held its lock for the whole connect would answer only
# after rank 1 gave up waiting and the connect ended (True); it must answer False at once.
entered = os.path.join(os.environ["RUNTIME_WORKER_DIR"], "rank0-in-init")
ready = os.path.join(os.environ["RUNTIME_WORKER_DIR"], "rank0-asked")
if rank == 1:
    # Timed from rank 0's call into the core, however late it started on a busy machine (a
    # rank 0 that failed before it ends the job through the launcher).
    while not os.path.exists(entered):
        time.sleep(0.05)
    deadline = time.monotonic() + 30  # not for ever: a blocked rank 0 must fail, not hang
    while not os.path.exists(ready) and time.monotonic() < deadline:
        time.sleep(0.05)
    hvd.init()
else:
    in_core_init = threading.Event()

    def on_call(frame, event, arg):
        # The init thread's call into the core's init(), which connects to rank 1.
        if event == "c_call" and arg is _core.init:
            in_core_init.set()

    def init_watched():
        sys.setprofile(on_call)
        try:
            hvd.init()
        finally:
            sys.setprofile(None)
            in_core_init.set()  # an init() that raised wakes rank 0's main thread as well

    init_thread = threading.Thread(target=init_watched)
    init_thread.start()
    in_core_init.wait()
    open(entered, "w").close()
    time.sleep(0.5)  # then let it go on to the rendezvous, where it waits for rank 1
    during = hvd.is_initialized()
    open(ready, "w").close()
    check(not during, f"is_initialized() during init returned {during}")
    init_thread.join()
check(hvd.is_initialized() and hvd.size() == 2, "init did not complete")

# 2. The fusion buffer grows for a large reducescatter and shrinks once small steps follow.
size = hvd.size()
big = hvd.reducescatter(torch.ones(4 << 20), op=hvd.Sum, name="big")  # 16 MiB of float32
check(torch.all(big == size).item(), "large reducescatter wrong")
grown = _core.stats()["fusion_buffer_bytes"]
check(grown >= 16 << 20, f"fusion buffer after the large step: {grown} bytes")
for step in range(140):  # two windows of 64 collectives (fusion_buffer.h)
    out = hvd.allreduce(torch.full((8,), float(rank)), op=hvd.Sum, name=f"small.{step}")
check(out.tolist() == [1.0] * 8, f"small allreduce wrong: {out}")
shrunk = _core.stats()["fusion_buffer_bytes"]
check(shrunk < 1 << 20, f"fusion buffer still {shrunk} bytes after 140 small steps")

# 3. A thread holding the runtime while another calls shutdown(): its later call fails with
# the shutdown status instead of touching freed memory; init() works again after.
held = threading.Event()
codes = []
holder = threading.Thread(
    target=lambda: codes.append(_testing.hold_runtime(1.0, held.set)))
holder.start()
held.wait()
hvd.shutdown()
holder.join()
check(codes == [_core.STATUS_SHUTDOWN], f"held runtime after shutdown: {codes}")
hvd.init()
out = hvd.allreduce(torch.tensor([float(rank)]), op=hvd.Sum, name="after")
check(out.item() == 1.0, "allreduce after re-init wrong")
print(f"rank {rank}: runtime OK", flush=True)
