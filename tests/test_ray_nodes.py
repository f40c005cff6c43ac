"""Ray jobs whose driver is a process of its own, with Ray under a private RAY_TMPDIR, on one
cluster (starting one is what costs): elastic training that a worker joins when a second Ray
node joins the cluster, and elastic training that goes on without the worker of a node that
leaves it; a job over the two nodes, whose local and cross ranks follow the nodes
Ray placed the workers on, with an allreduce spanning both; and examples/ray_digits.py run as a
script that joins that cluster."""

import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from conftest import PACKAGE_PARENT, REPO, WORKERS, job_env


@pytest.fixture(scope="module")
def two_nodes():
    """What the driver printed: the elastic and placement reports, the example's lines."""
    # Short: Ray's socket paths under it must fit in 107 bytes.
    ray_dir = tempfile.mkdtemp(prefix="hvdl-ray-")
    env = job_env({"RAY_TMPDIR": ray_dir, "PYTHONPATH": os.pathsep.join(
        [str(PACKAGE_PARENT), str(WORKERS)])})
    env.pop("RAY_ADDRESS", None)
    try:
        result = subprocess.run(
            [sys.executable, str(WORKERS / "ray_nodes_driver.py"),
             str(REPO / "examples" / "ray_digits.py"), "--num-workers", "2", "--epochs", "2"],
            env=env, capture_output=True, text=True, timeout=480, cwd=REPO)
    finally:
        shutil.rmtree(ray_dir, ignore_errors=True)
    found = {}
    for line in result.stdout.splitlines():
        kind, _, rest = line.partition(" ")
        found.setdefault(kind, []).append(rest)
    assert result.returncode == 0 and "RESULT" in found and "ELASTIC" in found, \
        result.stdout[-3000:] + result.stderr[-5000:]
    return {"ranks": json.loads(found["RESULT"][0]), "elastic": json.loads(found["ELASTIC"][0]),
            "example": found.get("EXAMPLE", []),
            "leave": json.loads(found["LEAVE"][0]) if "LEAVE" in found else None}


def test_elastic_worker_starts_on_a_node_that_joins(two_nodes):
    from test_elastic import check_report
    elastic = two_nodes["elastic"]
    results = elastic["results"]
    assert elastic["nodes"] == 2 and isinstance(results, list) and len(results) == 2, elastic
    report = results[0]
    sizes = [len(per_rank) for _, per_rank in report["steps"]]
    assert sizes[0] == 1 and sizes[-1] == 2 and report["size"] == 2, sizes
    check_report(report)


def test_elastic_job_goes_on_when_a_node_leaves(two_nodes):
    from test_elastic import check_report
    leave = two_nodes["leave"]
    assert leave is not None, "the driver printed no LEAVE line"
    results = leave["results"]
    assert leave["nodes"] == 1 and isinstance(results, list), leave
    report = next(r for r in results if r is not None)
    sizes = [len(per_rank) for _, per_rank in report["steps"]]
    assert sizes[0] == 2 and sizes[-1] == 1 and report["size"] == 1, sizes
    check_report(report)


def test_ranks_follow_the_ray_nodes(two_nodes):
    report = two_nodes["ranks"]
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


def test_ray_digits_example_learns_on_the_cluster_of_ray_address(two_nodes):
    output = two_nodes["example"]
    epochs = [line.split() for line in output if line.startswith("epoch ")]
    assert output and output[-1] == "exit code 0" and len(epochs) == 2, "\n".join(output[-60:])
    assert float(epochs[-1][-1].rstrip("%")) > 80.0, epochs
