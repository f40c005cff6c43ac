"""What the planner measures: each layer's compute time and sizes on this rank, and the links
(allreduce latency and bandwidth) with the core's own collectives."""

import dataclasses
import time

import torch

from horovodlike.common.objects import broadcast_object
from horovodlike.common.process_sets import global_process_set, set_ranks
from horovodlike.torch.mpi_ops import Sum, allreduce_


@dataclasses.dataclass
class LayerProfile:
    """One layer of a sequential model, measured on the whole sample batch in one process."""
    name: str
    forward_s: float
    backward_s: float
    activation_bytes: int   # its output for the whole batch
    parameter_bytes: int
    splittable: bool        # a Linear (or a block of them) that tensor parallelism can split
    tp_sizes: tuple = ()    # the feature sizes tensor parallelism must divide


@dataclasses.dataclass
class LinkProfile:
    """An allreduce over ``ranks`` ranks costs ``latency_s + 2(ranks-1)/ranks * bytes /
    bus_bytes_per_s``; point-to-point costs ``latency_s + bytes / bus_bytes_per_s``."""
    latency_s: float
    bus_bytes_per_s: float
    ranks: int = 2

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


def _linear_sizes(module):
    return tuple(size for m in module.modules() if isinstance(m, torch.nn.Linear)
                 for size in (m.out_features,))


def _best_time(fn, repeats):
    """The fastest of ``repeats`` runs: other processes' load only ever adds time."""
    for _ in range(2):   # warm-up: first calls allocate and start autograd's threads
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def profile_layers(model, sample_input, repeats=7):
    """LayerProfile of every child of a sequential ``model`` on ``sample_input``."""
    layers = list(model.children()) if isinstance(model, torch.nn.Sequential) else None
    if not layers:
        raise ValueError("plan: the model must be a torch.nn.Sequential (its children are the "
                         "layers that stages are cut between), got "
                         f"{type(model).__name__}")
    profiles, x = [], sample_input
    for index, layer in enumerate(layers):
        x = x.detach().requires_grad_(x.is_floating_point())
        with torch.no_grad():
            forward_s = _best_time(lambda: layer(x), repeats)

        def forward_backward():
            out = layer(x)
            if out.requires_grad:
                out.backward(torch.ones_like(out))
        both = _best_time(forward_backward, repeats)
        layer.zero_grad(set_to_none=True)
        out = layer(x).detach()
        params = sum(p.numel() * p.element_size() for p in layer.parameters())
        sizes = _linear_sizes(layer)
        profiles.append(LayerProfile(
            name=f"{index}:{type(layer).__name__}", forward_s=forward_s,
            backward_s=max(both - forward_s, 0.0),
            activation_bytes=out.numel() * out.element_size(), parameter_bytes=params,
            splittable=bool(sizes), tp_sizes=sizes))
        x = out
    return profiles


def measure_link(process_set=None, sizes=(1 << 12, 1 << 22), repeats=10):
    """Allreduce latency and bus bandwidth of this job's links, timed with the core's
    allreduce (collective: every rank calls it). Needs at least two ranks."""
    process_set = process_set or global_process_set
    ranks = len(set_ranks(process_set))
    if ranks < 2:
        raise ValueError("measure_link needs at least two ranks; start the job with "
                         "horovodlikerun -np 2 or more, or pass link= to plan()")
    results = []
    for nbytes in sizes:
        buffer = torch.zeros(nbytes // 4)
        for _ in range(2):
            allreduce_(buffer, op=Sum, name=f"plan.link.{nbytes}",
                           process_set=process_set)
        seconds = _best_time(lambda: allreduce_(buffer, op=Sum,
                                                      name=f"plan.link.{nbytes}",
                                                      process_set=process_set), repeats)
        # Every rank uses rank 0's figures, so that every rank plans alike.
        results.append(broadcast_object(seconds, root_rank=0, name=f"plan.link.t{nbytes}"))
    (small, t_small), (large, t_large) = zip(sizes, results)
    moved = 2 * (ranks - 1) / ranks * (large - small)
    # On a loaded machine both sizes can take the same scheduling delay, and their difference
    # then says bytes are free; the large message's transfer is taken to need at least a
    # twentieth of its measured time.
    bandwidth = moved / max(t_large - t_small, t_large / 20, 1e-9)
    return LinkProfile(latency_s=t_small, bus_bytes_per_s=bandwidth, ranks=ranks)
