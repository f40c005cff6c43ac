"""Finding NVIDIA's CUDA runtime and NCCL wheels (common/gpu_libraries.py), and what
nccl_built() / cuda_built() report from the core's gpu_info(). The wheels are faked by folders
laid out as pip installs them, in a child process so that the fake `nvidia` package never
reaches this one's sys.modules."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from conftest import PACKAGE_PARENT, job_env
from gpu_standins.build import build

from horovodlike import _core
from horovodlike.common import basics

# Prints the folders found, what the core was told when horovodlike was imported (the folders
# it searches), and whether the packages were imported.
PROBE = """
import json, sys
import horovodlike._core as core
search = core.gpu_info()["search"]
calls = [[list(search[0]), list(search[1])]]
from horovodlike.common import gpu_libraries
print(json.dumps({"cudart": gpu_libraries.cudart_folders(), "nccl": gpu_libraries.nccl_folders(),
                  "calls": calls,
                  "imported": sorted(m for m in sys.modules if m.startswith("nvidia."))}))
"""


def probe(tmp_path, *site_folders):
    """What the child process found, limited to the fake wheels under tmp_path (a machine may
    have NVIDIA's real wheels installed too)."""
    real = importlib.util.find_spec("nvidia")
    if real is not None and real.origin not in (None, "namespace"):
        pytest.skip(f"an installed regular package 'nvidia' ({real.origin}) hides fake wheels")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = os.pathsep.join([*map(str, site_folders), str(PACKAGE_PARENT)])
    result = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)

    def ours(folders):
        return [f for f in folders if f.startswith(str(tmp_path))]
    found["cudart"], found["nccl"] = ours(found["cudart"]), ours(found["nccl"])
    found["calls"] = [[ours(cudart), ours(nccl)] for cudart, nccl in found["calls"]]
    return found


def wheel(site, *parts, lib=True):
    """A package folder as a wheel installs it, without __init__.py (a namespace package)."""
    folder = site.joinpath("nvidia", *parts)
    folder.mkdir(parents=True)
    if lib:
        (folder / "lib").mkdir()
    return folder


def test_a_namespace_nccl_wheel_is_found_without_importing_it(tmp_path):
    nccl = wheel(tmp_path, "nccl")
    found = probe(tmp_path, tmp_path)
    assert found["nccl"] == [str(nccl / "lib")]
    assert found["cudart"] == []
    # Handed to the core once, at the import of horovodlike.common.
    assert found["calls"] == [[[], [str(nccl / "lib")]]]
    assert found["imported"] == []


def test_cuda_12_and_13_runtimes_and_several_site_folders(tmp_path):
    first, second = tmp_path / "site1", tmp_path / "site2"
    runtime_12 = wheel(first, "cuda_runtime")
    runtime_13 = wheel(second, "cu13")
    nccl_a, nccl_b = wheel(first, "nccl"), wheel(second, "nccl")
    wheel(first, "cublas")   # other NVIDIA wheels are not ours to list
    found = probe(tmp_path, first, second)
    assert found["cudart"] == [str(runtime_12 / "lib"), str(runtime_13 / "lib")]
    assert found["nccl"] == [str(nccl_a / "lib"), str(nccl_b / "lib")]


def test_a_package_without_its_lib_folder_is_left_out(tmp_path):
    wheel(tmp_path, "nccl", lib=False)
    assert probe(tmp_path, tmp_path)["nccl"] == []


def test_nothing_installed_gives_no_folders(tmp_path):
    found = probe(tmp_path, tmp_path)
    assert found["nccl"] == found["cudart"] == []
    assert found["calls"] == [[[], []]]


def built(env):
    """(nccl_built(), cuda_built()) in a fresh process with `env`, as the core finds them."""
    code = ("from horovodlike.common import basics; "
            "print(basics.nccl_built(), basics.cuda_built())")
    result = subprocess.run([sys.executable, "-c", code], env=job_env(env), capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    nccl, cuda = result.stdout.split()
    return int(nccl), cuda == "True"


@pytest.mark.parametrize("reported,code", [("22305", 22305), ("20906", 20906), ("2708", 2708)])
def test_nccl_built_is_the_version_code_horovod_returns(reported, code):
    # NCCL's own code, in both of its encodings (before and since 2.9), from the stand-in.
    standins = build()
    env = {"HOROVOD_CUDART_PATH": standins["cudart"], "HOROVOD_NCCL_PATH": standins["nccl"],
           "HVDL_STANDIN_NCCL_VERSION": reported}
    assert built(env) == (code, True)


def test_nothing_found_reports_zero_and_false():
    env = {"HOROVOD_CUDART_PATH": "/nonexistent/libcudart.so.12",
           "HOROVOD_NCCL_PATH": "/nonexistent/libnccl.so.2"}
    assert built(env) == (0, False)
