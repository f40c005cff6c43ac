"""The GPU path without a GPU: the core loads the stand-in CUDA runtime and NCCL that
tests/gpu_standins/ builds (through HOROVOD_CUDART_PATH / HOROVOD_NCCL_PATH, or from a wheel's
folder), and real multi-process jobs run every collective on their "device" memory, compared
with NumPy. Ordering is checked from the stand-in's own record of what ran when."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import PACKAGE_PARENT, assert_all_ranks, job_env, launch



def gpu_env(standins, devices, **extra):
    env = {"HOROVOD_CUDART_PATH": standins["cudart"], "HOROVOD_NCCL_PATH": standins["nccl"],
           "HVDL_STANDIN_CUDA_DEVICES": str(devices)}
    env.update({k: str(v) for k, v in extra.items()})
    return env


def test_nccl_one_rank_per_gpu(standins, tmp_path):
    # Two GPUs, one rank each: NCCL runs every collective it can; int16 and a scaled Min are
    # staged through host memory; a process set of its own gets its own communicator.
    result = launch(3, "gpu_worker.py", "nccl", tmp_path, env=gpu_env(standins, 3))
    assert_all_ranks(result, 3, "gpu nccl ok")


def test_ranks_sharing_a_gpu_are_staged(standins, tmp_path):
    # NCCL refuses two ranks on one GPU: the set stages through pinned host memory, and says why.
    result = launch(2, "gpu_worker.py", "staged", tmp_path, env=gpu_env(standins, 1))
    assert_all_ranks(result, 2, "gpu staged ok")
    assert "share the GPU" in (tmp_path / "rank0.txt").read_text()


def test_staging_forced_by_gpu_operations(standins, tmp_path):
    result = launch(2, "gpu_worker.py", "staged", tmp_path,
                    env=gpu_env(standins, 2, HOROVOD_GPU_OPERATIONS="staged"))
    assert_all_ranks(result, 2, "gpu staged ok")
    assert "HOROVOD_GPU_OPERATIONS=staged" in (tmp_path / "rank0.txt").read_text()


def test_old_nccl_stages_what_it_cannot_do(standins, tmp_path):
    # NCCL 2.9 has neither ncclAvg nor PreMulSum: Average and scaled sums go through host
    # memory, plain sums through NCCL, and the results are the same.
    result = launch(2, "gpu_features_worker.py", "old", tmp_path,
                    env=gpu_env(standins, 2, HVDL_STANDIN_NCCL_VERSION=20903))
    assert_all_ranks(result, 2, "old nccl ok")


def test_hierarchical_allreduce_nccl_inside_hosts(standins, tmp_path):
    # Two emulated hosts of two ranks, each rank on its own GPU of its host.
    result = launch(4, "gpu_features_worker.py", "host", tmp_path,
                    env=gpu_env(standins, 2, HOROVOD_HIERARCHICAL_ALLREDUCE=1),
                    launcher_args=["-H", "localhost:2,127.0.0.1:2"], transport="tcp")
    assert_all_ranks(result, 4, "by host ok")


def test_join_and_adasum_on_gpu_tensors(standins, tmp_path):
    result = launch(2, "gpu_features_worker.py", "join", tmp_path, env=gpu_env(standins, 2))
    assert_all_ranks(result, 2, "join and adasum ok")


def test_nccl_error_fails_every_rank_fast(standins, tmp_path):
    # Rank 1's NCCL reports an asynchronous error and its kernel never ends: the core aborts the
    # communicator and every rank's pending handle fails within seconds instead of hanging.
    result = launch(2, "gpu_features_worker.py", "fail", tmp_path, env=gpu_env(standins, 2),
                    timeout=120)
    output = result.stdout + result.stderr
    for rank in range(2):
        report = (tmp_path / f"rank{rank}.txt").read_text()
        assert report.startswith("HorovodInternalError after"), output[-4000:]
        assert float(report.split()[2]) < 10.0, report
    assert "NCCL reported an error" in (tmp_path / "rank1.txt").read_text(), output[-4000:]


def gpu_info(env, asked_early=False):
    """_core.gpu_info() in a fresh process with `env`; `asked_early`: the core was asked for
    NCCL before it knew where NVIDIA's wheels are (it looks again once it knows)."""
    early = ("from horovodlike.common import gpu_libraries as g; c.set_gpu_library_dirs([], []); "
             "c.build_info(); c.set_gpu_library_dirs(g.cudart_folders(), g.nccl_folders()); ")
    code = ("import json, horovodlike._core as c; " + (early if asked_early else "") +
            "print(json.dumps(c.gpu_info()))")
    out = subprocess.run([sys.executable, "-c", code], env=job_env(env), capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_loader_reports_versions_and_paths(standins):
    info = gpu_info(gpu_env(standins, 1))
    assert info["cuda"]["found"] and info["cuda"]["devices"] == 1, info
    assert info["cuda"]["path"] == standins["cudart"] and info["cuda"]["version"] == "12.8", info
    assert info["nccl"]["path"] == standins["nccl"] and info["nccl"]["version"] == "2.23.5", info


def test_loader_refuses_an_nccl_too_old_or_incomplete(standins):
    info = gpu_info(gpu_env(standins, 1, HVDL_STANDIN_NCCL_VERSION=20605))
    assert not info["nccl"]["found"], info
    assert "2.6.5" in info["nccl"]["error"] and "2.7 or newer" in info["nccl"]["error"], info
    env = gpu_env(standins, 1, HOROVOD_NCCL_PATH=standins["nccl_omit_allgather"])
    info = gpu_info(env)
    assert not info["nccl"]["found"], info
    assert "lacks ncclAllGather" in info["nccl"]["error"], info
    assert standins["nccl_omit_allgather"] in info["nccl"]["error"], info


def test_loader_finds_nvidia_wheel_folders(standins, tmp_path):
    # The layout of NVIDIA's wheels (nvidia/nccl/lib, nvidia/cuda_runtime/lib, namespace
    # packages without __init__.py) on the path, and no override: both are found there.
    for package, key, name in [("nccl", "nccl", "libnccl.so.2"),
                               ("cuda_runtime", "cudart", "libcudart.so.12")]:
        lib = tmp_path / "nvidia" / package / "lib"
        lib.mkdir(parents=True)
        shutil.copy(standins[key], lib / name)
    env = {"PYTHONPATH": os.pathsep.join([str(PACKAGE_PARENT), str(tmp_path)]),
           "HVDL_STANDIN_CUDA_DEVICES": "1",
           "LD_LIBRARY_PATH": ""}
    wheel_nccl = str(tmp_path / "nvidia" / "nccl" / "lib" / "libnccl.so.2")
    info = gpu_info(env)
    assert info["nccl"]["path"] == wheel_nccl, info
    assert info["cuda"]["path"].startswith(str(tmp_path)), info
    # Asked before it knew the wheels' folders, the core took the system's copy where the
    # machine has one (a machine with CUDA installed), and looks again in the wheels' folders
    # once it knows them where it has none.
    system = subprocess.run([sys.executable, "-c", "import ctypes; ctypes.CDLL('libnccl.so.2')"],
                            env=job_env(env), capture_output=True).returncode == 0
    info = gpu_info(env, asked_early=True)
    if system:
        assert info["nccl"]["found"] and info["nccl"]["path"] != wheel_nccl, info
    else:
        assert info["nccl"]["path"] == wheel_nccl, info


def test_a_gpu_tensor_without_a_gpu_says_what_is_missing(standins):
    code = """
import horovodlike._core as c
from horovodlike.common import basics
basics.init()
try:
    c.enqueue(0, "x", 1 << 20, 1 << 20, 7, [4], device=0)
except ValueError as e:
    print("ValueError:", e)
basics.shutdown()
"""
    for env, expect in [(gpu_env(standins, 0), "no GPU is usable"),
                        ({"HOROVOD_CUDART_PATH": "/nonexistent/libcudart.so.12"},
                         "HOROVOD_CUDART_PATH=/nonexistent/libcudart.so.12"),
                        ({"HOROVOD_CUDART_PATH": "/nonexistent/libcudart.so.12"},
                         "pip install nvidia-cuda-runtime-cu12")]:
        out = subprocess.run([sys.executable, "-c", code], env=job_env(env), capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert expect in out.stdout, out.stdout


@pytest.mark.parametrize("np_,devices,mode", [(1, 1, "nccl"), (2, 1, "staged"), (2, 2, "nccl")])
def test_every_dtype_and_shape_as_horovods_suites_send_them(standins, np_, devices, mode):
    # What Horovod's test_torch.py sends on a GPU: each dtype, dims 1-3, Sum, Average, Min, Max,
    # scaled sums, gathers, broadcasts, uneven alltoalls, reducescatters; each result equal to
    # the same call on host buffers.
    result = launch(np_, "gpu_dtypes_worker.py", mode, env=gpu_env(standins, devices))
    assert_all_ranks(result, np_, "gpu dtypes ok")


@pytest.mark.parametrize("version", [22809, 22907])
def test_one_rank_averages_on_nccls_with_and_without_the_tail_bug(standins, version):
    # NCCL before 2.29.7 leaves the tail of a one-rank PreMulSum past 16 KiB unwritten (the
    # stand-in does the same; NVIDIA/nccl#1950): the core sums instead of averaging with one
    # rank, and stages scaled sums; 2.29.7 runs them all. Both must equal the host's results.
    result = launch(1, "gpu_dtypes_worker.py", "nccl",
                    env=gpu_env(standins, 1, HVDL_STANDIN_NCCL_VERSION=version))
    assert_all_ranks(result, 1, "gpu dtypes ok")
