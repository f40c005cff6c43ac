"""Where RayExecutor's workers go: a placement group that reserves their resources (one bundle a
worker packed together, or one bundle a host spread over distinct nodes), and which bundle holds
each worker."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WorkerShape:
    num_workers: int | None
    num_hosts: int | None
    num_workers_per_host: int
    cpus_per_worker: float
    gpus_per_worker: float

    def __post_init__(self):
        if (self.num_workers is None) == (self.num_hosts is None):
            raise ValueError("give either num_workers, or num_hosts (with num_workers_per_host)"
                             f"; got num_workers={self.num_workers}, num_hosts={self.num_hosts}")
        for name in ("num_workers", "num_hosts", "num_workers_per_host"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not self.cpus_per_worker > 0:
            raise ValueError(f"cpus_per_worker must be positive, got {self.cpus_per_worker!r}")
        if self.gpus_per_worker < 0:
            raise ValueError(f"gpus_per_worker must be >= 0, got {self.gpus_per_worker!r}")

    @property
    def total_workers(self) -> int:
        if self.num_workers is not None:
            return self.num_workers
        return self.num_hosts * self.num_workers_per_host

    def bundles(self) -> tuple[list[dict], str]:
        """The placement group's bundles and strategy. Workers of one host share its bundle, so
        that Ray puts exactly num_workers_per_host on each of num_hosts distinct nodes."""
        per_worker = {"CPU": self.cpus_per_worker}
        if self.gpus_per_worker:
            per_worker["GPU"] = self.gpus_per_worker
        if self.num_workers is not None:
            return [dict(per_worker) for _ in range(self.num_workers)], "PACK"
        per_host = {name: amount * self.num_workers_per_host
                    for name, amount in per_worker.items()}
        return [dict(per_host) for _ in range(self.num_hosts)], "STRICT_SPREAD"

    def bundle_of(self, worker: int, bundle_count: int) -> int:
        if self.num_hosts is not None and bundle_count == self.num_hosts:
            return worker // self.num_workers_per_host
        return worker % bundle_count

    def describe(self) -> str:
        gpus = f" and {self.gpus_per_worker:g} GPU" if self.gpus_per_worker else ""
        where = (f"{self.num_workers_per_host} on each of {self.num_hosts} distinct nodes"
                 if self.num_hosts is not None else "packed")
        return (f"{self.total_workers} workers with {self.cpus_per_worker:g} CPU{gpus} each "
                f"({where})")


def reserve(shape: WorkerShape, timeout_s: float, use_current: bool):
    """(placement group, created here?) for the workers. Raises TimeoutError naming what the
    cluster has when Ray cannot place them within timeout_s."""
    import ray
    from ray.util.placement_group import (get_current_placement_group, placement_group,
                                          remove_placement_group)
    current = get_current_placement_group() if use_current else None
    if current is not None:
        return current, False
    bundles, strategy = shape.bundles()
    group = placement_group(bundles, strategy=strategy)
    if not group.wait(timeout_seconds=timeout_s):
        remove_placement_group(group)
        total, free = ray.cluster_resources(), ray.available_resources()
        raise TimeoutError(
            f"Ray could not place {shape.describe()} within placement_group_timeout_s="
            f"{timeout_s:g} s: the cluster has {total.get('CPU', 0):g} CPUs "
            f"({free.get('CPU', 0):g} free), {total.get('GPU', 0):g} GPUs "
            f"({free.get('GPU', 0):g} free) on {len([n for n in ray.nodes() if n['Alive']])} "
            f"nodes; use fewer workers or fewer CPUs per worker, or add nodes")
    return group, True
