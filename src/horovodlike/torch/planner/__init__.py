"""The strategy planner: which (pp, dp, tp) layout and stage split to train a model with, and
whether dp replicates the parameters (DistributedOptimizer) or shards them (fully_shard).

    best = hvd.plan(model, sample_input, world_size=4)        # prints the ranked table
    mesh = best.mesh                  # a ProcessMesh((pp, dp, tp)) when run in a job of 4
    stage_layers = best.stages[mesh.coordinate("pp")]

Its figures come from ``calibrate()`` (each layer's compute on every input size the layouts
give a rank, an alpha-beta line per link from the core's allreduce; kept in a file to reuse):

    calibration = hvd.calibrate(model, sample_input, path="calibration.json")
    best = hvd.plan(model, sample_input, world_size=4, calibration="calibration.json")

Without one it profiles the layers on the whole batch and measures the link in this job (or
takes ``link=``). It predicts each layout's step time and memory per rank (see
``cost_model``) and ranks them. benchmarks/planner.py checks the predictions against measured
step times.
"""

import dataclasses
import os

import torch

from horovodlike.common import basics
from horovodlike.common.objects import broadcast_object
from horovodlike.torch.planner.calibration import (Calibration, calibrate, measure_links,
                                                   shared_cores)
from horovodlike.torch.planner.cost_model import (Candidate, Contention, factorisations,
                                                  links_by_dimension, predict, why_not)
from horovodlike.torch.planner.links import LinkProfile, fit_link, measure_link
from horovodlike.torch.planner.profiling import LayerProfile, profile_layers
from horovodlike.torch.planner.search import (LayerChoice, LayerPlan, LayerSpec,
                                              describe_layers, search_layers)
from horovodlike.torch.process_mesh import ProcessMesh

__all__ = ["plan", "Plan", "calibrate", "Calibration", "Contention", "LayerProfile",
           "LinkProfile",
           "fit_link", "measure_link", "measure_links", "profile_layers", "search_layers",
           "describe_layers", "LayerSpec", "LayerPlan", "LayerChoice"]


@dataclasses.dataclass
class Plan:
    """The best layout (the first of ``candidates``) and everything the ranking used."""
    best: Candidate
    candidates: list          # Candidate, fastest first (those that fit memory first)
    rejected: list            # (layout, reason)
    layers: list              # LayerProfile
    link: LinkProfile
    mesh: object = None       # ProcessMesh((pp, dp, tp)) when built inside a matching job

    @property
    def shape(self):
        return (self.best.pp, self.best.dp, self.best.tp)

    @property
    def stages(self):
        return self.best.stages

    @property
    def fsdp(self):
        """True when the best layout shards the parameters over dp: fully_shard each layer
        (then the stage) with mesh=mesh.process_set("dp")."""
        return self.best.fsdp

    def process_mesh(self):
        """Builds the best layout's ProcessMesh (collective: every rank calls it)."""
        inner = "tp" if self.best.tp > 1 else "dp"
        return ProcessMesh(self.shape, ("pp", "dp", "tp"), innermost=inner)

    def table(self):
        lines = [f"{'rank':>4}  {'layout':<18} {'stages (layers)':<22} {'mb':>3} "
                 f"{'step ms':>9} {'compute':>8} {'comm':>8} {'memory/rank':>12}"]
        for i, c in enumerate(self.candidates, 1):
            stages = " ".join(f"{a}-{b - 1}" for a, b in c.stages)
            lines.append(f"{i:>4}  {c.layout:<18} {stages:<22} {c.micro_batches:>3} "
                         f"{c.step_s * 1e3:>9.3f} {c.compute_s * 1e3:>8.3f} "
                         f"{c.communication_s * 1e3:>8.3f} {_mib(c.memory_bytes):>12}"
                         f"{'' if c.fits else '  (over the memory limit)'}")
        for layout, reason in self.rejected:
            lines.append(f"   -  {layout:<18} not possible: {reason}")
        return "\n".join(lines)


def _mib(nbytes):
    return f"{nbytes / (1 << 20):.2f} MiB"


def _slots_per_host(hosts, world_size):
    if hosts is None:
        return None
    if isinstance(hosts, str):
        slots = [int(part.rsplit(":", 1)[1]) if ":" in part else 1
                 for part in hosts.split(",") if part]
    else:
        slots = [int(s) for s in hosts]
    if sum(slots) < world_size or len(set(slots)) != 1:
        raise ValueError(f"plan: hosts {hosts!r} must give every host the same number of "
                         f"slots, {world_size} in all")
    return slots[0]


def _from_calibration(calibration, hosts, link, inter_host_link, layers):
    """(calibration, hosts, link, inter_host_link, across_link, layers) with what
    ``calibration`` (a Calibration or the path of one, loaded) measured filling those not
    given; ``across_link`` (a line of several ranks per host across the hosts) only when the
    link between hosts is the calibration's too."""
    if calibration is None:
        return None, hosts, link, inter_host_link, None, layers
    if isinstance(calibration, (str, bytes)) or hasattr(calibration, "__fspath__"):
        calibration = Calibration.load(calibration)
    if not isinstance(calibration, Calibration):
        raise ValueError("plan: calibration must be a Calibration (from hvd.calibrate) or the "
                         f"path of a file it saved, got {type(calibration).__name__}")
    if hosts is None and calibration.slots_per_host:
        hosts = [calibration.slots_per_host] * (calibration.world_size
                                                // calibration.slots_per_host)
    across_link = None if inter_host_link else calibration.links.get("across")
    return (calibration, hosts, link or calibration.links.get("inside"),
            inter_host_link or calibration.links.get("between"), across_link,
            layers or calibration.layers)


def _contention(calibration, world_size, slots, profiled_here, in_job):
    """The Contention of the planned job's hosts: from what the calibration recorded, or from
    this job and machine when the layers were profiled here; None when the layers were given
    (their contention unknown: they are taken as they are)."""
    if calibration is not None:
        cores = calibration.conditions.get("cores")
        sharing = calibration.conditions.get("ranks_sharing_cores")
        if not cores or not sharing:   # written before it recorded them
            return None
        ranks = max(1, round(sharing * world_size / calibration.world_size))
        # Calibrations written before rank 0 profiled alone profiled with every rank busy.
        return Contention(cores=cores, ranks=ranks,
                          profiled_busy=calibration.conditions.get("profiled_busy", sharing),
                          slowdown=calibration.conditions.get("slowdown", 1.0),
                          wake_s=calibration.conditions.get("wake_s", 0.0),
                          collective_wake_s=calibration.conditions.get("collective_wake_s"))
    if not profiled_here:
        return None
    cores, sharing = shared_cores()
    if in_job:
        return Contention(cores=cores, ranks=max(1, round(sharing * world_size
                                                          / basics.size())),
                          profiled_busy=sharing)
    return Contention(cores=cores, ranks=slots or world_size, profiled_busy=1)


def plan(model, sample_input, world_size, hosts=None, link=None, inter_host_link=None,
         micro_batches=None, optimizer_state_factor=2, memory_limit=None, layers=None,
         calibration=None, fsdp=True, overlap=None, verbose=True):
    """Ranks every (pp, dp, tp) layout of ``world_size`` ranks for ``model`` (a
    ``torch.nn.Sequential``) trained on batches like ``sample_input`` (the global batch).

    ``hosts``: "host:slots,..." or a list of slots per host; lines of a dimension that leave a
    host use ``inter_host_link`` (the same link when not given). ``link``: a LinkProfile;
    measured when None (needs a job of two or more ranks). ``optimizer_state_factor``: state
    per parameter byte (2 for Adam, 1 for momentum). ``memory_limit``: bytes per rank; layouts
    over it rank after those under it. Each layout with dp > 1 is considered twice: dp
    replicating the parameters, and dp sharding them with fully_shard ("fsdp=" in the table),
    which sends more per step but holds 1/dp of the parameters, gradients and optimizer
    state (``fsdp=False`` leaves those out). ``layers``: LayerProfiles to use instead of
    profiling. ``calibration``: a Calibration from ``calibrate()`` or the file it saved; its
    layers, links and hosts are used where those arguments are not given. ``overlap``: whether
    the gradient allreduce runs while the backward computes; by default when each rank of a
    host has a core for its compute and one for the core's background thread (the
    calibration's core count, else this machine's). With more ranks than cores on a host the
    compute is rescaled to the ranks each layout keeps busy at once, and tensor parallel
    collectives wait for the slowest peer (``cost_model.Contention``): from the cores and
    ranks the calibration recorded, or this machine's when the layers are profiled here;
    given ``layers`` are taken as they are.
    Inside a job of ``world_size`` ranks rank 0's measurements are used by every rank and the
    best layout's ProcessMesh is built (``Plan.mesh``). Prints the table when ``verbose``.
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"plan: world_size must be a positive int, got {world_size!r}")
    if not isinstance(sample_input, torch.Tensor) or sample_input.dim() == 0:
        raise ValueError("plan: sample_input must be a tensor whose first dimension is the "
                         f"global batch, got {getattr(sample_input, 'shape', sample_input)!r}")
    in_job = basics.is_initialized() and basics.size() > 1
    given_links = (link, inter_host_link)
    calibration, hosts, link, inter_host_link, across_link, layers = _from_calibration(
        calibration, hosts, link, inter_host_link, layers)
    sends = calibration.hand_off_links(*given_links) if calibration else (None, None)
    cores = (calibration and calibration.conditions.get("cpus")) or os.cpu_count()
    profiled_here = layers is None
    if layers is None:
        layers = profile_layers(model, sample_input)
        if in_job:
            layers = broadcast_object(layers, root_rank=0, name="plan.layers")
    if link is None:
        if not in_job:
            raise ValueError("plan: no link given and not inside a job of two or more ranks "
                             "to measure one; run it under horovodlikerun -np 2+ or pass "
                             "link=LinkProfile(latency_s, bus_bytes_per_s)")
        link = measure_link()
    batch = sample_input.shape[0]
    measured_on = {layer.batch for layer in layers} - {0}
    if measured_on and measured_on != {batch}:
        raise ValueError(f"plan: the layer profiles were measured on a batch of "
                         f"{sorted(measured_on)} rows but sample_input has {batch}; calibrate "
                         "again on this batch")
    slots = _slots_per_host(hosts, world_size)
    contention = _contention(calibration, world_size, slots, profiled_here, in_job)
    if overlap is None:
        overlap = cores >= 2 * (slots or world_size)
    measured = calibration.conditions if calibration else {}
    exchange = measured.get("exchange_s_per_byte", 0.0)
    action = measured.get("pipeline_action_s", 0.0)
    candidates, rejected = [], []
    for pp, dp, tp in factorisations(world_size):
        reason = why_not(layers, pp, dp, tp, batch)
        if reason:
            rejected.append((f"pp={pp} dp={dp} tp={tp}", reason))
            continue
        links = links_by_dimension(link, inter_host_link or link, slots, pp, dp, tp,
                                   across_link=across_link, sends=sends)
        for sharded in (False, True) if dp > 1 and fsdp else (False,):
            candidates.append(predict(layers, links, pp, dp, tp, batch, micro_batches,
                                      optimizer_state_factor, memory_limit, fsdp=sharded,
                                      overlap=overlap, contention=contention,
                                      exchange_s_per_byte=exchange,
                                      pipeline_action_s=action))
    if not candidates:
        raise ValueError(f"plan: no layout of {world_size} ranks fits this model: {rejected}")
    candidates.sort(key=lambda c: (not c.fits, c.step_s, c.memory_bytes))
    result = Plan(best=candidates[0], candidates=candidates, rejected=rejected,
                  layers=layers, link=link)
    if in_job and basics.size() == world_size:
        result.mesh = result.process_mesh()
    if verbose and (not in_job or basics.rank() == 0):
        between = "" if inter_host_link is None or slots is None else (
            f"; between hosts of {slots} ranks: {inter_host_link.latency_s * 1e6:.0f} us, "
            f"{inter_host_link.bus_bytes_per_s / 1e9:.2f} GB/s")
        print(f"plan for {world_size} ranks, batch {batch}; link: "
              f"{link.latency_s * 1e6:.0f} us, {link.bus_bytes_per_s / 1e9:.2f} GB/s{between}")
        print(result.table(), flush=True)
    return result
