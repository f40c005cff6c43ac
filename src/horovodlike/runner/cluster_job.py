"""What a driver other than horovodlikerun needs to form a job out of processes a cluster engine
started (Ray actors, Spark tasks): the rendezvous server with a new secret, the settings every
rank shares, and ranks ordered by host from where the engine placed each worker."""

from __future__ import annotations

import secrets

from horovodlike.runner import network
from horovodlike.runner.environment import JobSettings
from horovodlike.runner.hosts import HostSlots, RankAssignment, assign_ranks
from horovodlike.runner.rendezvous import RendezvousServer
from horovodlike.runner.settings import BY_NAME, rank_environment


def rendezvous_address(worker_addresses: list[str], driver_address: str) -> str:
    """Where the rendezvous server listens and the ranks connect: loopback when every worker
    runs on this machine, else the driver's address on the cluster's network (never every
    interface)."""
    if all(network.is_local_host(address) for address in worker_addresses):
        return "127.0.0.1"
    return driver_address


def start_rendezvous(address: str, start_timeout_s: float, secret: str | None = None,
                     **settings) -> tuple[RendezvousServer, JobSettings]:
    """A started rendezvous server guarded by `secret` (hex; a new one when None), and the
    JobSettings that point the ranks to it (`settings`: launcher settings by name,
    runner/settings.py, such as network_interface or use_gloo)."""
    unknown = sorted(set(settings) - set(BY_NAME))
    if unknown:
        raise TypeError(f"start_rendezvous: unknown setting(s) {', '.join(unknown)}")
    secret = secret or secrets.token_hex(32)
    server = RendezvousServer(secret, host=address)
    server.start()
    return server, JobSettings(rendezvous_addr=address, rendezvous_port=server.port,
                               secret_key=secret, start_timeout_s=start_timeout_s,
                               settings_env=tuple(rank_environment(settings).items()))


def assign_by_host(worker_hosts: list[str]) -> list[RankAssignment]:
    """The assignment of each worker, given the host each one runs on (in worker order): ranks
    are grouped by host, hosts in the order they first appear, and inside a host the workers
    keep their order; local and cross ranks follow as with horovodlikerun's host list."""
    order: list[str] = []
    for host in worker_hosts:
        if host not in order:
            order.append(host)
    slots = [HostSlots(host, worker_hosts.count(host)) for host in order]
    by_host: dict[str, list[RankAssignment]] = {host: [] for host in order}
    for assignment in assign_ranks(slots, len(worker_hosts)):
        by_host[assignment.hostname].append(assignment)
    return [by_host[host].pop(0) for host in worker_hosts]
