"""Which transport a job really uses, and how it fails and recovers.

`report`: prints the transport in use (build_info, mpi_enabled, gloo_enabled) and the rank's
topology, and checks one allreduce.
`links`: runs a small and a large allreduce and an allgather, checks them, and prints which
providers ran them over which link (the labels whose run counts went up, e.g. SHM_ALLREDUCE).
`stall REPORT_DIR`: the last rank stops (SIGSTOP) for a few seconds; the others, with a short
peer timeout, give up on it, raise HorovodInternalError and tell it so: when it resumes, it
raises HorovodInternalError too instead of waiting for ever. Then every rank calls shutdown()
and init() and checks that collectives work again over the same transport.
"""

import os
import shlex
import signal
import subprocess
import sys
import time

import torch

import horovodlike.torch as hvd
from horovodlike.common.basics import build_info

mode = sys.argv[1]
if mode == "stall" and int(os.environ.get("OMPI_COMM_WORLD_RANK",
                                          os.environ.get("HOROVOD_RANK", "0"))) != \
        int(os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("HOROVOD_SIZE", "1"))) - 1:
    os.environ["HOROVOD_PEER_TIMEOUT_SECONDS"] = "2"  # read by init(): this rank gives up fast
hvd.init()
rank, size = hvd.rank(), hvd.size()
transport = build_info()["cpu_operations"]


def check_allreduce(name):
    out = hvd.allreduce(torch.full((1000,), float(rank + 1)), op=hvd.Sum, name=name)
    expected = size * (size + 1) / 2
    assert torch.all(out == expected), f"{name}: got {out[:3]}, expected {expected}"


if mode == "report":
    check_allreduce("report")
    print(f"rank {rank}: transport={transport} mpi_enabled={hvd.mpi_enabled()} "
          f"gloo_enabled={hvd.gloo_enabled()} size={size} local_rank={hvd.local_rank()} "
          f"local_size={hvd.local_size()} cross_rank={hvd.cross_rank()} "
          f"cross_size={hvd.cross_size()}; transport OK", flush=True)
    sys.exit(0)

if mode == "links":
    before = hvd.mpi_ops._core.stats()["provider_runs"]
    check_allreduce("small")  # 4 KB
    big = hvd.allreduce(torch.full((1 << 20,), float(rank + 1)), op=hvd.Sum, name="big")
    assert torch.all(big == size * (size + 1) / 2), big[:3]
    gathered = hvd.allgather(torch.full((2,), float(rank)), name="gathered")
    assert gathered.tolist() == [float(r) for r in range(size) for _ in range(2)], gathered
    after = hvd.mpi_ops._core.stats()["provider_runs"]
    ran = sorted(label for label, n in after.items() if n > before.get(label, 0))
    print(f"rank {rank}: transport={transport} ran={','.join(ran)}; links OK", flush=True)
    sys.exit(0)

assert mode == "stall", mode
report_dir = sys.argv[2]
check_allreduce("warmup")
stalled = rank == size - 1
if stalled:
    # A helper wakes this rank up again once the others have given up on it (each leaves a
    # file), however long that took on a busy machine; after 120 s in any case, so that a rank
    # that never gave up fails the test instead of leaving this one stopped.
    gave_up = " ".join(shlex.quote(os.path.join(report_dir, f"gave-up-{r}"))
                       for r in range(size) if r != rank)
    subprocess.Popen(["sh", "-c", f"n=0; for f in {gave_up}; do "
                                  f"while [ ! -e \"$f\" ] && [ $n -lt 2400 ]; do "
                                  f"sleep 0.05; n=$((n + 1)); done; done; "
                                  f"kill -CONT {os.getpid()}"])
    os.kill(os.getpid(), signal.SIGSTOP)
start = time.time()
try:
    for step in range(1000):
        hvd.allreduce(torch.ones(100000), name="during")
    outcome = "no error"
except hvd.HorovodInternalError as e:
    outcome = f"HorovodInternalError after {time.time() - start:.2f} s: {e}"
    open(os.path.join(report_dir, f"gave-up-{rank}"), "w").close()
# Every rank starts again: the failed runtime is shut down and a new one connects.
hvd.shutdown()
hvd.init()
check_allreduce("after.reinit")
recovered = f"recovered over {build_info()['cpu_operations']}"
with open(os.path.join(report_dir, f"rank{rank}.txt"), "w") as f:
    f.write(outcome + "\n" + recovered + "\n")
print(f"rank {rank}: {outcome}; {recovered}", flush=True)
hvd.shutdown()
