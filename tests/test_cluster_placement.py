"""How the cluster-engine drivers turn where Ray or Spark put the workers into ranks, without an
engine running: ranks grouped by host whatever order the engine lists the workers in, local and
cross ranks as horovodlikerun gives them, and the placement group RayExecutor asks Ray for."""

import pytest

from horovodlike.ray.executor import node_labels, visible_gpus
from horovodlike.ray.placement import WorkerShape
from horovodlike.runner.cluster_job import assign_by_host


def test_ranks_are_grouped_by_host_in_the_order_hosts_first_appear():
    # Spark lists a barrier stage's tasks by partition; Ray's actors come in start order:
    # either may interleave the hosts.
    workers = ["b", "a", "b", "c", "a", "b"]
    got = [(a.rank, a.local_rank, a.local_size, a.cross_rank, a.cross_size, a.hostname)
           for a in assign_by_host(workers)]
    # Hosts in first-seen order b, a, c: b holds ranks 0-2, a ranks 3-4, c rank 5; a worker
    # keeps its order among those of its host. Local rank 0 exists on 3 hosts, 1 on 2, 2 on 1.
    assert got == [
        (0, 0, 3, 0, 3, "b"),
        (3, 0, 2, 1, 3, "a"),
        (1, 1, 3, 0, 2, "b"),
        (5, 0, 1, 2, 3, "c"),
        (4, 1, 2, 1, 2, "a"),
        (2, 2, 3, 0, 1, "b"),
    ]
    assert all(a.size == 6 for a in assign_by_host(workers))


def test_num_workers_packs_one_bundle_a_worker():
    shape = WorkerShape(num_workers=3, num_hosts=None, num_workers_per_host=1,
                        cpus_per_worker=2, gpus_per_worker=0)
    assert shape.bundles() == ([{"CPU": 2}] * 3, "PACK")
    assert [shape.bundle_of(w, 3) for w in range(3)] == [0, 1, 2]
    assert shape.total_workers == 3


def test_num_hosts_spreads_one_bundle_a_host_over_distinct_nodes():
    shape = WorkerShape(num_workers=None, num_hosts=2, num_workers_per_host=3,
                        cpus_per_worker=1, gpus_per_worker=0.5)
    assert shape.bundles() == ([{"CPU": 3, "GPU": 1.5}] * 2, "STRICT_SPREAD")
    # Workers 0-2 share host bundle 0, workers 3-5 bundle 1.
    assert [shape.bundle_of(w, 2) for w in range(6)] == [0, 0, 0, 1, 1, 1]
    assert shape.total_workers == 6
    assert "3 on each of 2 distinct nodes" in shape.describe()


def test_bad_worker_shapes_are_refused():
    with pytest.raises(ValueError, match="num_workers_per_host must be a positive integer"):
        WorkerShape(None, 2, 0, 1, 0)
    with pytest.raises(ValueError, match="cpus_per_worker must be positive"):
        WorkerShape(2, None, 1, 0, 0)


def test_ray_nodes_on_one_address_stay_distinct_hosts():
    # Two Ray nodes started on one machine share its address: each must be a host of its own.
    labels = node_labels([("n1" * 10, "10.0.0.1"), ("n2" * 10, "10.0.0.1"),
                          ("n1" * 10, "10.0.0.1"), ("n3" * 10, "10.0.0.2")])
    assert labels == ["10.0.0.1-n1n1n1n1n1n1", "10.0.0.1-n2n2n2n2n2n2",
                      "10.0.0.1-n1n1n1n1n1n1", "10.0.0.2"]
    assert [a.local_rank for a in assign_by_host(labels)] == [0, 0, 1, 0]


def test_each_worker_sees_every_gpu_of_its_host_in_local_rank_order():
    labels = ["h1", "h2", "h1"]
    nodes = [{"gpu_ids": ["3"]}, {"gpu_ids": ["0"]}, {"gpu_ids": ["1"]}]
    assert visible_gpus(labels, nodes, "h1") == "3,1"
    assert visible_gpus(labels, nodes, "h2") == "0"


def test_ray_host_discovery_counts_slots_of_the_live_nodes(monkeypatch):
    import ray
    from horovodlike.ray import RayHostDiscovery
    nodes = [
        {"Alive": True, "NodeManagerAddress": "10.0.0.1", "Resources": {"CPU": 8.0, "GPU": 1}},
        {"Alive": False, "NodeManagerAddress": "10.0.0.2", "Resources": {"CPU": 8.0}},
        {"Alive": True, "NodeManagerAddress": "10.0.0.3", "Resources": {"CPU": 3.0, "GPU": 4}},
        {"Alive": True, "NodeManagerAddress": "10.0.0.4", "Resources": {"CPU": 1.0}},
    ]
    monkeypatch.setattr(ray, "nodes", lambda: nodes)
    # 2 CPUs a slot: 8 -> 4, 3 -> 1, 1 -> none; the dead node offers nothing.
    assert RayHostDiscovery(cpus_per_slot=2).find_available_hosts_and_slots() == \
        {"10.0.0.1": 4, "10.0.0.3": 1}
    # With GPUs, a node holds as many slots as both its CPUs and its GPUs allow.
    assert RayHostDiscovery(use_gpu=True, cpus_per_slot=1, gpus_per_slot=1) \
        .find_available_hosts_and_slots() == {"10.0.0.1": 1, "10.0.0.3": 3}
