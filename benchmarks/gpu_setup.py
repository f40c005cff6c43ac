"""What the benchmarks' --cuda modes share: finding the GPUs (or saying clearly why there are
none), putting each rank on one, timing a call until the GPU is done with it, and which
torch.distributed peers can run.

Rank r uses GPU r mod the GPUs visible, so a machine with fewer GPUs than ranks still runs the
horovodlike jobs (several ranks on one GPU, which horovodlike stages through host memory) while
NCCL, which refuses several ranks on one GPU, is left out.
"""

from __future__ import annotations

import subprocess
import sys


def cuda_device_count(env: dict) -> tuple[int, str]:
    """(GPUs PyTorch sees, why none when 0), probed in a child process with the jobs' `env`."""
    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.device_count() "
                            "if torch.cuda.is_available() else 0, torch.__version__)"],
                           env=env, capture_output=True, text=True)
    if probe.returncode != 0:
        return 0, "PyTorch does not import: " + (probe.stderr.strip().splitlines() or ["?"])[-1]
    count, version = probe.stdout.split()
    return int(count), f"this PyTorch ({version}) sees no CUDA device"


def require_cuda(parser, env: dict) -> int:
    """--cuda: the number of GPUs, or a clear error (through `parser`) when there is none."""
    count, why = cuda_device_count(env)
    if count == 0:
        parser.error(f"--cuda: {why}; run on a machine with a GPU and a CUDA build of PyTorch, "
                     "or leave out --cuda to measure on the host")
    return count


def horovodlike_gpu_report(env: dict) -> str:
    """What horovodlike's core found for CUDA and NCCL, as `horovodlikerun --check-build`
    prints it, from a child process with the jobs' `env` (the horovodlike they import)."""
    probe = subprocess.run([sys.executable, "-c", _GPU_REPORT], env=env, capture_output=True,
                           text=True)
    if probe.returncode != 0:
        return "horovodlike: the core does not load: " + \
            (probe.stderr.strip().splitlines() or ["?"])[-1]
    return probe.stdout.rstrip()


# Importing horovodlike.common hands the core NVIDIA's wheels' folders first.
_GPU_REPORT = """
import horovodlike.common, horovodlike._core as core
from horovodlike.runner.check_build import gpu_library_lines
if hasattr(core, "gpu_info"):
    print("\\n".join(gpu_library_lines(dict(core.gpu_info()))))
else:
    print("horovodlike: this build has no GPU support (its core has no gpu_info)")
"""


def bench_device(cuda: bool, local_rank: int):
    """(device, finish): with `cuda`, this rank's GPU made current and torch.cuda.synchronize
    (called after each timed call, so that its time is all in); else the CPU and nothing."""
    import torch
    if not cuda:
        return torch.device("cpu"), lambda: None
    index = local_rank % torch.cuda.device_count()
    torch.cuda.set_device(index)
    return torch.device("cuda", index), torch.cuda.synchronize


def in_full(call, finish):
    """`call` followed by `finish` (bench_device's), as one timed call."""
    def timed():
        call()
        finish()
    return timed


def torch_peers(np_: int, gpus: int) -> tuple[list[tuple[str, str]], list[str]]:
    """The torch.distributed peers of a --cuda run as (label, backend), and a note for each one
    left out: NCCL when every rank has a GPU of its own, Gloo with CUDA tensors from 2 ranks."""
    peers, skipped = [], []
    if np_ <= gpus:
        peers.append(("torch-nccl", "nccl"))
    else:
        skipped.append(f"torch.distributed NCCL: {np_} ranks on {gpus} GPU(s), and NCCL refuses "
                       "several ranks on one GPU")
    if np_ >= 2:
        peers.append(("torch-gloo-cuda", "gloo"))
    else:
        skipped.append("torch.distributed Gloo with CUDA tensors: needs 2 ranks or more")
    return peers, skipped
