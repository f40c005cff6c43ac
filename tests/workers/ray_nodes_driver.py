"""Driver of jobs on a Ray cluster of two nodes started on this machine
(ray.cluster_utils.Cluster, under RAY_TMPDIR): RayExecutor with 2 hosts x 2 workers, whose
placement it prints as JSON (RESULT line); then, with the path of examples/ray_digits.py and
its arguments, that example run as a script that joins this cluster through RAY_ADDRESS, its
output and exit code printed (EXAMPLE lines)."""

import json
import os
import subprocess
import sys

import ray
from ray.cluster_utils import Cluster

from horovodlike.ray import RayExecutor

import cluster_jobs

# Ray writes this cluster's address under RAY_TMPDIR/ray (where a plain ray.init() on this
# machine would look for it): a private RAY_TMPDIR keeps the cluster to this test.
temp_dir = os.path.join(os.environ["RAY_TMPDIR"], "ray")
os.makedirs(temp_dir, exist_ok=True)
for attempt in range(3):
    try:
        cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 2, "include_dashboard": False, "temp_dir": temp_dir})
        break
    except Exception as error:  # Ray gives a node 30 s to start, too few on a busy host
        if "timed out during startup" not in str(error) or attempt == 2:
            raise
try:
    cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address)
    executor = RayExecutor(RayExecutor.create_settings(timeout_s=60), num_hosts=2,
                           num_workers_per_host=2)
    executor.start()
    try:
        results = executor.run(cluster_jobs.placement)
        node_ids = [node["node_id"] for node in executor.nodes]
    finally:
        executor.shutdown()
    print("RESULT " + json.dumps({"ranks": results, "nodes": len(set(node_ids))}), flush=True)
    if len(sys.argv) > 1:
        example = subprocess.run([sys.executable] + sys.argv[1:], capture_output=True,
                                 text=True, timeout=300,
                                 env={**os.environ, "RAY_ADDRESS": cluster.address})
        for line in (example.stdout + example.stderr).splitlines():
            print(f"EXAMPLE {line}")
        print(f"EXAMPLE exit code {example.returncode}", flush=True)
finally:
    ray.shutdown()
    cluster.shutdown()
    sys.stdout.flush()
