"""Which rank failed first in cause, not in time.

When one rank fails, the others fail because of it, and one of those may exit first (a rank that
calls sys.exit(3) tells the others it is shutting down, and they raise and exit before it has
finished exiting). So a rank whose runtime stops because of a peer says so before it raises: the
core PUTs ``failure/<generation>/<rank>`` = ``<origin>:<kind>:<reason, %-escaped>`` to the
rendezvous server (csrc/transport/rendezvous_client.cc, ReportFailureToLauncher). ``origin`` is
the rank that caused it (its own rank when it failed by itself, -1 when unknown); ``kind`` is
lost (connection closed), timeout (a peer silent for HOROVOD_PEER_TIMEOUT_SECONDS), shutdown (a
peer shut down), stall (stall shutdown) or error.

After the first non-zero exit the launcher waits up to GRACE_S for a rank that failed by itself
(primary_failure); failing that, it follows the origins (trace_cause). The elastic driver reads
one round's reports to find a worker that stopped responding (stopped_responding).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote

GRACE_S = 2.0
# Once the job is failing, how long the ranks that reported a failure of their own may take to
# exit by themselves before the launcher stops them (job.py).
EXIT_GRACE_S = 3.0
REPORT_WAIT_S = 1.0
KEY_PREFIX = "failure/"


@dataclass(frozen=True)
class FailureRecord:
    rank: int
    origin: int
    kind: str
    reason: str

    @property
    def consequence(self) -> bool:
        """True when another rank caused this rank's failure."""
        return self.origin >= 0 and self.origin != self.rank


def parse_record(key: str, value: str) -> tuple[int, FailureRecord] | None:
    """(generation, record) from one rendezvous entry, or None when it is not a failure record."""
    parts = key.split("/")
    fields = value.split(":", 2)
    if len(parts) != 3 or parts[0] + "/" != KEY_PREFIX or len(fields) != 3:
        return None
    try:
        generation, rank, origin = int(parts[1]), int(parts[2]), int(fields[0])
    except ValueError:
        return None
    return generation, FailureRecord(rank, origin, fields[1], unquote(fields[2]))


def read_records(server, generation: int | None = None) -> dict[int, FailureRecord]:
    """Each rank's latest failure record (the highest init() generation) on the server, or its
    record of one generation (an elastic round: the generation is the round's number)."""
    latest: dict[int, tuple[int, FailureRecord]] = {}
    prefix = KEY_PREFIX if generation is None else f"{KEY_PREFIX}{generation}/"
    for key in server.keys():
        if not key.startswith(prefix):
            continue
        value = server.get(key)
        parsed = parse_record(key, value) if value is not None else None
        if parsed is not None:
            record = parsed[1]
            if record.rank not in latest or parsed[0] > latest[record.rank][0]:
                latest[record.rank] = parsed
    return {rank: record for rank, (_, record) in latest.items()}


def primary_failure(exits: dict[int, int], records: dict[int, FailureRecord]) -> int | None:
    """The first rank (in `exits` order, which is the order they ended) that ended non-zero and
    not because of another rank, or None."""
    for rank, returncode in exits.items():
        if returncode != 0 and not (rank in records and records[rank].consequence):
            return rank
    return None


def trace_cause(first: int, exits: dict[int, int], records: dict[int, FailureRecord],
                running: set[int]) -> tuple[int, FailureRecord | None]:
    """When every rank that failed did so because of another: the rank to name, and the record
    that blames it. Follows the origins from the first failed rank to a rank that is still
    running (stopped, hung, or still exiting); else a running rank that has reported nothing
    while the others failed (a silent one); else the first failed rank itself."""
    rank, seen = first, {first}
    while rank in records and records[rank].consequence:
        origin = records[rank].origin
        if origin in running:
            return origin, records[rank]
        if origin in seen or exits.get(origin, 0) == 0:
            break  # a cycle, or it ended cleanly: it did not cause this
        seen.add(origin)
        rank = origin
    silent = sorted(r for r in running if r not in records)
    if silent:
        return silent[0], records.get(first)
    return first, None


def stopped_responding(records: dict[int, FailureRecord]) -> dict[int, FailureRecord]:
    """The ranks that the others' reports (of one generation) say stopped responding, each with
    a report that blames it. A rank that timed out waiting on another that was itself waiting
    on a third blames the third: the blame follows the origin's own report. A rank that sent a
    report of its own is running, so it is not one of them."""
    blamed: dict[int, FailureRecord] = {}
    for record in records.values():
        if record.kind != "timeout" or not record.consequence:
            continue
        origin, seen = record.origin, {record.rank}
        while origin in records and records[origin].consequence and origin not in seen:
            seen.add(origin)
            origin = records[origin].origin
        if origin not in records:
            blamed.setdefault(origin, record)
    return blamed


_BLAME = {
    "timeout": "stopped responding: rank {by} waited for it for HOROVOD_PEER_TIMEOUT_SECONDS",
    "shutdown": "shut down horovodlike (it called shutdown() or is exiting) while rank {by} "
                "still had operations pending",
    "lost": "lost its connection to rank {by}",
    "stall": "never submitted a tensor that rank {by} waited on (stall shutdown)",
}


def describe_blame(record: FailureRecord | None, first: int) -> str:
    """Why a rank that has not ended is named: "stopped responding: rank 0 waited...". """
    if record is None:
        return (f"stopped responding: it is still running, reported nothing, and rank {first} "
                f"failed waiting for it")
    return _BLAME.get(record.kind, "failed first: rank {by} reported it").format(by=record.rank)
