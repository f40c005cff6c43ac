"""A Ray job over two Ray nodes (both on this machine, a cluster of its own under a private
RAY_TMPDIR, in a driver process of its own): local and cross ranks follow the nodes Ray placed
the workers on, and an allreduce spans both."""

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
