"""The links the planner models, each an alpha-beta line fitted to the core's own allreduce
timings: latency (alpha) plus bytes over bus bandwidth (1/beta)."""

import dataclasses
import statistics

import numpy as np
import torch

from horovodlike.common import basics
from horovodlike.common.objects import broadcast_object
from horovodlike.common.process_sets import global_process_set, set_ranks
from horovodlike.torch.mpi_ops import Sum, allreduce_
from horovodlike.torch.planner.profiling import median_time

LINK_SIZES = (1 << 12, 1 << 16, 1 << 20, 1 << 22, 1 << 24)
SEND_SIZES = (1 << 12, 1 << 16, 1 << 20)


@dataclasses.dataclass
class LinkProfile:
    """An allreduce over ``ranks`` ranks costs ``latency_s + 2(ranks-1)/ranks * bytes /
    bus_bytes_per_s``; point-to-point costs ``latency_s / 2 + bytes / bus_bytes_per_s``.
    ``kind`` says which of the core's links it is ("shared memory", "TCP", ...);
    ``sharing``: how many lines of ranks used it at once when it was measured (each line then
    had 1/sharing of the wire); ``samples``: the [bytes, seconds] it was fitted to."""
    latency_s: float
    bus_bytes_per_s: float
    ranks: int = 2
    kind: str = ""
    sharing: int = 1
    samples: list = dataclasses.field(default_factory=list)

    def shared_by(self, lines):
        """This link as each of ``lines`` lines of ranks using it at once sees it."""
        return dataclasses.replace(self, bus_bytes_per_s=self.bus_bytes_per_s * self.sharing
                                   / lines, sharing=lines)

    def allreduce_s(self, nbytes, ranks):
        if ranks <= 1 or nbytes == 0:
            return 0.0
        # Ring latency grows with the steps: 2(p-1) of them against the measured set's.
        steps = (ranks - 1) / max(1, self.ranks - 1)
        return self.latency_s * steps + 2 * (ranks - 1) / ranks * nbytes / self.bus_bytes_per_s

    def gather_s(self, nbytes, ranks):
        """An allgather of a buffer of ``nbytes`` in all (or a reduce-scatter of one): half an
        allreduce's steps and bytes, (ranks-1)/ranks of the buffer through each rank."""
        if ranks <= 1 or nbytes == 0:
            return 0.0
        steps = (ranks - 1) / max(1, self.ranks - 1) / 2
        return self.latency_s * steps + (ranks - 1) / ranks * nbytes / self.bus_bytes_per_s

    def send_s(self, nbytes):
        return self.latency_s / 2 + nbytes / self.bus_bytes_per_s if nbytes else 0.0


def nonnegative_least_squares(a, b):
    """x >= 0 minimising |a x - b|: scipy's NNLS when installed, else an active set by hand
    (drop the most negative coefficient and refit)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    try:
        from scipy.optimize import nnls
        return nnls(a, b)[0]
    except ImportError:
        keep = list(range(a.shape[1]))
        while True:
            x = np.zeros(a.shape[1])
            x[keep] = np.linalg.lstsq(a[:, keep], b, rcond=None)[0]
            negative = [i for i in keep if x[i] < 0]
            if not negative:
                return x
            keep.remove(min(negative, key=lambda i: x[i]))


def fit_relative(rows, seconds):
    """Non-negative coefficients c of ``seconds ~ rows @ c`` minimising the relative error, so
    that a 4 KiB and an 8 MiB message weigh alike; and the fit's median relative error."""
    a = np.array([[v / t for v in row] for row, t in zip(rows, seconds)])
    c = nonnegative_least_squares(a, np.ones(len(seconds)))
    errors = [abs(float(np.dot(row, c)) / t - 1) for row, t in zip(rows, seconds)]
    return [float(v) for v in c], float(statistics.median(errors))


def fit_link(sizes, seconds, ranks, kind="", sharing=1):
    """The LinkProfile of allreduce timings ``seconds`` of messages of ``sizes`` bytes over
    ``ranks`` ranks: latency + 2(p-1)/p x bytes / bandwidth, fitted on relative error."""
    wire = 2 * (ranks - 1) / ranks
    (latency, inverse_bandwidth), _ = fit_relative([[1.0, wire * s] for s in sizes], seconds)
    return LinkProfile(latency_s=latency, bus_bytes_per_s=1 / max(inverse_bandwidth, 1e-15),
                       ranks=ranks, kind=kind, sharing=sharing,
                       samples=[[int(n), float(t)] for n, t in zip(sizes, seconds)])


def measure_link(process_set=None, sizes=LINK_SIZES, repeats=10, kind="", sharing=1,
                 share=True):
    """Times the core's allreduce of each of ``sizes`` bytes over ``process_set`` (collective
    over the set) and fits a LinkProfile to the medians: with ``share`` (every rank of the
    job calls it) every rank gets rank 0's, else each rank its own. Needs two ranks or more.
    ``sharing``: the number of sets measuring over the same wire at once."""
    process_set = process_set or global_process_set
    ranks = len(set_ranks(process_set))
    if ranks < 2:
        raise ValueError("measure_link needs at least two ranks; start the job with "
                         "horovodlikerun -np 2 or more, or pass link= to plan()")
    seconds = []
    for nbytes in sizes:
        buffer = torch.zeros(nbytes // 4)
        name = f"plan.link.{nbytes}"
        seconds.append(median_time(lambda: allreduce_(buffer, op=Sum, name=name,
                                                       process_set=process_set), repeats))
    if share:   # every rank uses rank 0's figures, so that every rank plans alike
        seconds = broadcast_object(seconds, root_rank=0, name="plan.link.times")
    return fit_link(sizes, seconds, ranks, kind, sharing)


def measure_send(peer, sizes=SEND_SIZES, repeats=10, kind=""):
    """A point-to-point message's time from rank 0 to ``peer``: half a ping-pong's round trip
    for each of ``sizes`` bytes, fitted as ``send_s`` prices it (``latency_s`` a round trip's,
    as for the collectives' links, ``send_s`` taking half). A pipeline's hand-off is such a
    message, which needs no negotiation round: a collective between the same two ranks also
    waits for the rounds of the ranks outside it. Collective: rank 0 and ``peer`` measure
    while the others wait, and every rank gets rank 0's figures."""
    from horovodlike.torch.p2p import recv, send
    rank, seconds = basics.rank(), None
    if rank in (0, peer):
        other = peer if rank == 0 else 0
        seconds = []
        for nbytes in sizes:
            buffer = torch.zeros(nbytes // 4)

            def ping():
                if rank == 0:
                    send(buffer, other, tag=11)
                    recv(buffer, other, tag=12)
                else:
                    recv(buffer, other, tag=11)
                    send(buffer, other, tag=12)
            seconds.append(median_time(ping, repeats) / 2)
    seconds = broadcast_object(seconds, root_rank=0, name="plan.link.send")
    one_way = fit_link(sizes, seconds, 2, kind)
    return dataclasses.replace(one_way, latency_s=2 * one_way.latency_s)
