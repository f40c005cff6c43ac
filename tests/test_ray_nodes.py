"""Ray jobs whose drivers are processes of their own, each Ray under a private RAY_TMPDIR: a job
over two Ray nodes on this machine, whose local and cross ranks follow the nodes Ray placed the
workers on, with an allreduce spanning both; and examples/ray_digits.py."""

import json
import os
import shutil
import subprocess
import sys
import tempfile

from conftest import PACKAGE_PARENT, REPO, WORKERS, job_env


def test_ranks_follow_the_ray_nodes():
    # Short: Ray's socket paths under it must fit in 107 bytes.
    ray_dir = tempfile.mkdtemp(prefix="hvdl-ray-")
    try:
        run_driver(ray_dir)
    finally:
        shutil.rmtree(ray_dir, ignore_errors=True)


def run_driver(ray_dir):
    env = job_env({"RAY_TMPDIR": str(ray_dir), "PYTHONPATH": os.pathsep.join(
        [str(PACKAGE_PARENT), str(WORKERS)])})
    result = subprocess.run([sys.executable, str(WORKERS / "ray_nodes_driver.py")], env=env,
                            capture_output=True, text=True, timeout=240, cwd=REPO)
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    assert result.returncode == 0 and lines, result.stdout[-3000:] + result.stderr[-5000:]
    report = json.loads(lines[0][len("RESULT "):])
    ranks = report["ranks"]
    assert report["nodes"] == 2
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    assert all(r["size"] == 4 and r["sum"] == 10.0 for r in ranks), ranks
    # Ranks 0, 1 on the first node, 2, 3 on the second.
    assert [r["local_rank"] for r in ranks] == [0, 1, 0, 1]
    assert [r["local_size"] for r in ranks] == [2, 2, 2, 2]
    assert [r["cross_rank"] for r in ranks] == [0, 0, 1, 1]
    assert [r["cross_size"] for r in ranks] == [2, 2, 2, 2]
    hosts = [r["hostname"] for r in ranks]
    assert hosts[0] == hosts[1] != hosts[2] == hosts[3], hosts


def test_ray_digits_example_learns():
    ray_dir = tempfile.mkdtemp(prefix="hvdl-ray-")
    try:
        env = job_env({"RAY_TMPDIR": ray_dir, "PYTHONPATH": str(PACKAGE_PARENT)})
        env.pop("RAY_ADDRESS", None)
        result = subprocess.run([sys.executable, str(REPO / "examples" / "ray_digits.py"),
                                 "--num-workers", "2", "--epochs", "2"], env=env,
                                capture_output=True, text=True, timeout=240, cwd=REPO)
    finally:
        shutil.rmtree(ray_dir, ignore_errors=True)
    epochs = [line.split() for line in result.stdout.splitlines() if line.startswith("epoch ")]
    assert result.returncode == 0 and len(epochs) == 2, result.stdout[-2000:] + \
        result.stderr[-4000:]
    assert float(epochs[-1][-1].rstrip("%")) > 80.0, epochs
