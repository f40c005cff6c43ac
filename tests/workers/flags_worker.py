"""What a rank sees of horovodlikerun's flags: prints `rank R: {json}` with the variables the
flags set, and with `init`, also what init() did (the background thread's CPUs, MPI's thread
level); with `stall`, rank 1 submits 3 s late so that rank 0 logs a stall warning."""

import json
import os
import sys
import time

NAMES = ["HOROVOD_STALL_CHECK_DISABLE", "HOROVOD_STALL_CHECK_TIME_SECONDS",
         "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "HOROVOD_LOG_HIDE_TIME", "NCCL_IB_DISABLE",
         "HOROVOD_GLOO_TIMEOUT_SECONDS", "HOROVOD_MPI_THREADS_DISABLE", "HOROVOD_AUTOTUNE",
         "HOROVOD_THREAD_AFFINITY", "HOROVOD_NUM_NCCL_STREAMS", "HOROVOD_TORUS_ALLREDUCE",
         "HOROVOD_GLOO_IFACE", "HOROVOD_CYCLE_TIME", "HOROVOD_FUSION_THRESHOLD",
         "HOROVOD_CACHE_CAPACITY", "HOROVOD_LOG_LEVEL", "HOROVOD_TIMELINE", "HOROVOD_ELASTIC",
         "HOROVOD_LOCAL_SIZE", "HOROVOD_CPU_OPERATIONS", "HOROVOD_TIMELINE_MARK_CYCLES"]


def cpus_of(task="self"):
    path = "/proc/self/status" if task == "self" else f"/proc/self/task/{task}/status"
    with open(path) as f:
        for line in f:
            if line.startswith("Cpus_allowed_list:"):
                return line.split(":", 1)[1].strip()


mode = sys.argv[1] if len(sys.argv) > 1 else "env"
seen = {name: os.environ.get(name) for name in NAMES}
seen["process_cpus"] = cpus_of()
if mode in ("init", "stall"):
    import numpy as np

    from horovodlike.common import basics
    from horovodlike.common import numpy_ops as ops
    basics.init()
    seen["mpi"] = basics.mpi_enabled()
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                name = f.read().strip()
        except (FileNotFoundError, ProcessLookupError):
            continue  # a short-lived thread that ended since the listing (open or read)
        if name == "hvdl-loop":
            seen["loop_cpus"] = cpus_of(task)
    if basics.mpi_enabled():
        from mpi4py import MPI
        seen["mpi_thread_level"] = MPI.Query_thread()
        seen["mpi_thread_multiple"] = MPI.THREAD_MULTIPLE
    if mode == "stall":
        if basics.rank() == 1:
            # Late by six stall check times (0.5 s): late enough for a warning even when rank 0
            # itself got to its call a second or two late on a busy machine.
            time.sleep(3)
        ops.allreduce(np.ones(2, np.float32), "late")
    basics.shutdown()
print(f"rank {os.environ.get('HOROVOD_RANK', os.environ.get('OMPI_COMM_WORLD_RANK'))}: "
      f"{json.dumps(seen)}", flush=True)
