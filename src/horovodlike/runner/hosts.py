"""Host lists (`-H host1:4,host2:4`, `--hostfile`) and the assignment of ranks to their slots."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

# A host name or an IPv4 address; anything else would need quoting in ssh and in HOROVOD_HOSTNAME.
_HOSTNAME_PATTERN = re.compile(r"^[A-Za-z0-9_.\-]+$")


class HostError(ValueError):
    """A host list that cannot be used: malformed, duplicated, or too few slots."""


@dataclass(frozen=True)
class HostSlots:
    hostname: str
    slots: int


@dataclass(frozen=True)
class RankAssignment:
    """Where one rank runs and its place in the job; the values of its HOROVOD_* variables."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    hostname: str


def _host_slots(hostname: str, slots_text: str | None, where: str,
                default_slots: int = 1) -> HostSlots:
    if not hostname or not _HOSTNAME_PATTERN.match(hostname):
        raise HostError(f"{where}: '{hostname}' is not a valid host name")
    if slots_text is None:
        return HostSlots(hostname, default_slots)
    if not slots_text.isdigit() or int(slots_text) < 1:
        raise HostError(f"{where}: slots of host '{hostname}' must be a positive integer, "
                        f"got '{slots_text}'")
    return HostSlots(hostname, int(slots_text))


def _check_unique(hosts: list[HostSlots], where: str) -> list[HostSlots]:
    if not hosts:
        raise HostError(f"{where}: no hosts given")
    seen = set()
    for host in hosts:
        if host.hostname in seen:
            raise HostError(f"{where}: host '{host.hostname}' is listed twice; "
                            f"give it once with all its slots")
        seen.add(host.hostname)
    return hosts


def parse_hosts(spec: str, default_slots: int = 1) -> list[HostSlots]:
    """Parses `-H host1:4,host2:4` (a host without `:N` has `default_slots`, from
    --slots-per-host)."""
    hosts = []
    for item in spec.split(","):
        item = item.strip()
        name, sep, slots = item.rpartition(":")
        if not sep:
            name, slots = item, None
        hosts.append(_host_slots(name, slots, f"-H {spec}", default_slots))
    return _check_unique(hosts, f"-H {spec}")


def parse_hostfile(path: str, default_slots: int = 1) -> list[HostSlots]:
    """Parses a hostfile: one host a line, `host slots=N` or `host:N` or `host` (with
    `default_slots`); `#` comments."""
    try:
        text = Path(path).read_text()
    except OSError as error:
        raise HostError(f"cannot read hostfile {path}: {error.strerror}") from None
    hosts = []
    for number, raw_line in enumerate(text.splitlines(), start=1):
        line = raw_line.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"hostfile {path}, line {number}"
        fields = line.split()
        if len(fields) == 1:
            name, sep, slots = fields[0].rpartition(":")
            if not sep:
                name, slots = fields[0], None
        elif len(fields) == 2 and fields[1].startswith("slots="):
            name, slots = fields[0], fields[1][len("slots="):]
        else:
            raise HostError(f"{where}: expected 'host slots=N' or 'host:N', got '{line}'")
        hosts.append(_host_slots(name, slots, where, default_slots))
    return _check_unique(hosts, f"hostfile {path}")


def format_hosts(hosts: list[HostSlots]) -> str:
    return ",".join(f"{host.hostname}:{host.slots}" for host in hosts)


def assign_ranks(hosts: list[HostSlots], num_proc: int) -> list[RankAssignment]:
    """Fills the hosts' slots in list order: ranks 0.. go to the first host, then the next.

    The cross rank of a rank is the index of its host among the hosts that have a rank with the
    same local rank; the cross size is the number of those hosts.
    """
    if num_proc < 1:
        raise HostError(f"-np must be at least 1, got {num_proc}")
    total_slots = sum(host.slots for host in hosts)
    if num_proc > total_slots:
        raise HostError(f"-np {num_proc} needs {num_proc} slots but the hosts "
                        f"{format_hosts(hosts)} have only {total_slots}")
    ranks_per_host = []
    remaining = num_proc
    for host in hosts:
        taken = min(host.slots, remaining)
        if taken:
            ranks_per_host.append((host.hostname, taken))
        remaining -= taken

    assignments = []
    rank = 0
    for host_index, (hostname, local_size) in enumerate(ranks_per_host):
        for local_rank in range(local_size):
            peers = [index for index, (_, size) in enumerate(ranks_per_host) if size > local_rank]
            assignments.append(RankAssignment(
                rank=rank, size=num_proc, local_rank=local_rank, local_size=local_size,
                cross_rank=peers.index(host_index), cross_size=len(peers), hostname=hostname))
            rank += 1
    return assignments
