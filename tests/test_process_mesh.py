"""horovodlike.torch.ProcessMesh on 4 ranks: layouts, sets per dimension, hosts, errors."""

import sys

import pytest

from conftest import REPO, WORKERS, assert_all_ranks, job_env, launch
import subprocess


@pytest.mark.parametrize("mode", ["layouts", "errors"])
def test_process_mesh(mode):
    result = launch(4, "mesh_worker.py", mode)
    assert_all_ranks(result, 4, f"mesh {mode} OK")


def test_innermost_dimension_stays_on_a_host():
    # localhost and 127.0.0.1 are two simulated hosts of two ranks each.
    command = [sys.executable, "-m", "horovodlike.runner.launch", "-np", "4", "-H",
               "localhost:2,127.0.0.1:2", sys.executable, str(WORKERS / "mesh_worker.py"),
               "hosts"]
    result = subprocess.run(command, env=job_env(), capture_output=True, text=True,
                            timeout=120, cwd=REPO)
    assert_all_ranks(result, 4, "mesh hosts OK")
