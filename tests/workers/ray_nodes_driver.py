"""Driver of jobs on a Ray cluster started on this machine (ray.cluster_utils.Cluster, under
RAY_TMPDIR), each printing what it found on a line of its own:
- ELASTIC: ElasticRayExecutor training on the head node alone (one slot of 2 CPUs), until rank 0
  asks for more: then a second node joins the cluster, and a worker starts on it and joins the
  job (the hosts are the cluster's live nodes); rank 0's report as JSON;
- RESULT: RayExecutor with 2 hosts x 2 workers on the two nodes; each rank's placement as JSON;
- EXAMPLE: with the path of examples/ray_digits.py and its arguments, that example run as a
  script that joins this cluster through RAY_ADDRESS; its output and exit code;
- LEAVE: ElasticRayExecutor training with one worker on each node, until rank 0 asks: then
  the second node leaves the cluster (its worker dies with it), and the job finishes on the
  head node's worker; rank 0's report as JSON."""

import json
import os
import subprocess
import sys
import tempfile
import threading
import time

import ray
from ray.cluster_utils import Cluster

from horovodlike.ray import ElasticRayExecutor, RayExecutor

import cluster_jobs


def start_elastic_job(scenario, hosts_text=None):
    """Starts ElasticRayExecutor training (the cluster's live nodes, 2 CPUs a slot, 1 to 2
    workers) of cluster_jobs.elastic_train's `scenario` in a thread. Returns the executor, the
    thread, the hosts file the scenario signals through, and the dict its results land in."""
    report_dir = tempfile.mkdtemp(prefix="hvdl-elastic-")
    hosts_file = os.path.join(report_dir, "hosts.txt")
    if hosts_text is not None:
        with open(hosts_file, "w") as f:
            f.write(hosts_text)
    settings = ElasticRayExecutor.create_settings(min_num_proc=1, max_num_proc=2,
                                                  elastic_timeout=60, timeout_s=60)
    executor = ElasticRayExecutor(settings, cpus_per_slot=2)
    executor.start()
    outcome = {}

    def run():
        try:
            outcome["results"] = executor.run(
                lambda: cluster_jobs.elastic_train(report_dir, scenario, hosts_file))
        except Exception as error:  # the test reports it; the other jobs go on
            outcome["results"] = f"{type(error).__name__}: {error}"

    job = threading.Thread(target=run, daemon=True)
    job.start()
    return executor, job, hosts_file, outcome


def elastic_job_grown_by_a_node(cluster):
    """Adds a node of 2 CPUs once the "grow" scenario's rank 0 asks for a second slot (Ray
    starts nodes from the main thread only), or once the job has ended without asking (the
    next job needs the node)."""
    executor, job, hosts_file, outcome = start_elastic_job("grow", "head:1\n")
    while job.is_alive():
        with open(hosts_file) as f:
            if ":2" in f.read():
                break
        time.sleep(0.05)
    node = cluster.add_node(num_cpus=2)
    job.join()
    executor.shutdown()
    return outcome["results"], node


def elastic_job_left_by_a_node(cluster, node):
    """With a worker on each node, removes `node` once the "leave" scenario's rank 0 asks (or
    the job has ended without asking)."""
    executor, job, hosts_file, outcome = start_elastic_job("leave")
    leave = hosts_file + ".leave"
    while job.is_alive() and not os.path.exists(leave):
        time.sleep(0.05)
    if os.path.exists(leave):
        cluster.remove_node(node)
        os.remove(leave)
    job.join()
    executor.shutdown()
    return outcome["results"]


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
    ray.init(address=cluster.address)
    elastic, second_node = elastic_job_grown_by_a_node(cluster)
    print("ELASTIC " + json.dumps({"results": elastic, "nodes": len(ray.nodes())}), flush=True)
    cluster.wait_for_nodes()
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
    left = elastic_job_left_by_a_node(cluster, second_node)
    print("LEAVE " + json.dumps({"results": left, "nodes": len([
        node for node in ray.nodes() if node["Alive"]])}), flush=True)
finally:
    ray.shutdown()
    cluster.shutdown()
    sys.stdout.flush()
