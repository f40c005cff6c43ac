"""The planner's cost model: a predicted step time and memory per rank for one (pp, dp, tp)
layout and stage split, from measured layer profiles and a measured link.

Per stage, with the global batch B measured in one process:
- compute: the stage's forward + backward time x 1/dp (each replica has B/dp) x 1/tp;
- tensor parallel: each Linear costs one allreduce of its output over tp (Megatron's column
  and row pair: one forward, one backward);
- pipeline: m micro-batches through pp stages take (m + pp - 1) slots of the slowest stage's
  per-micro-batch time, plus a send of the boundary activation forward and back per slot;
- data parallel: the stage's gradients (its parameters / tp) allreduced over dp, not overlapped;
- fully sharded data parallel (fully_shard over dp, each layer wrapped): the parameters
  allgathered for each micro-batch's forward and again for its backward, the gradients
  reduce-scattered once per step: (2m + 1) x the parameter bytes x (dp-1)/dp through each rank
  (3x with one micro-batch), not overlapped.
Memory per rank: parameters / tp x (weights + gradients + optimizer state), divided by dp under
fully_shard plus the largest layer's parameters (gathered whole while it computes), plus the
activations kept for backward (B/dp of them, / tp, and min(pp, m)/m of them under 1F1B).
"""

import dataclasses
import itertools


@dataclasses.dataclass
class Candidate:
    pp: int
    dp: int
    tp: int
    stages: list              # [(first layer, last layer + 1)] per stage
    micro_batches: int
    fsdp: bool = False        # dp shards the parameters (fully_shard) instead of replicating
    step_s: float = 0.0
    compute_s: float = 0.0
    communication_s: float = 0.0
    memory_bytes: int = 0
    gradient_bytes: float = 0.0   # sent per rank per step over dp (allreduce or FSDP's)
    fits: bool = True

    @property
    def layout(self):
        return f"pp={self.pp} {'fsdp' if self.fsdp else 'dp'}={self.dp} tp={self.tp}"


def factorisations(world_size):
    """Every (pp, dp, tp) whose product is world_size."""
    return [(pp, dp, world_size // (pp * dp))
            for pp in range(1, world_size + 1) if world_size % pp == 0
            for dp in range(1, world_size // pp + 1) if (world_size // pp) % dp == 0]


def balanced_stages(times, stages):
    """Cut ``times`` (per layer) into ``stages`` contiguous runs minimising the slowest run;
    exhaustive over cut points (models the planner sees have few layers)."""
    n = len(times)
    best, best_cuts = None, None
    for cuts in itertools.combinations(range(1, n), stages - 1):
        bounds = (0, *cuts, n)
        slowest = max(sum(times[a:b]) for a, b in zip(bounds, bounds[1:]))
        if best is None or slowest < best - 1e-15:
            best, best_cuts = slowest, bounds
    return list(zip(best_cuts, best_cuts[1:]))


def why_not(layers, pp, dp, tp, batch):
    """The reason a layout cannot run this model, or None."""
    if pp > len(layers):
        return f"{pp} stages for {len(layers)} layers"
    if batch % dp:
        return f"batch {batch} does not split over dp={dp}"
    if tp > 1:
        if not any(layer.splittable for layer in layers):
            return "no Linear layer to split over tp"
        for layer in layers:
            bad = [s for s in layer.tp_sizes if s % tp]
            if bad:
                return f"{layer.name}: features {bad} do not split over tp={tp}"
    return None


def links_by_dimension(link, inter_host_link, slots_per_host, pp, dp, tp):
    """The link each dimension's lines use: ranks are laid out tp fastest, then dp, then pp
    (as ProcessMesh((pp, dp, tp)) does), so a line leaves its host when it spans more
    consecutive ranks than a host has slots."""
    stride = {"tp": 1, "dp": tp, "pp": tp * dp}
    sizes = {"tp": tp, "dp": dp, "pp": pp}
    return {dim: (inter_host_link if slots_per_host and stride[dim] * sizes[dim] >
                  slots_per_host and sizes[dim] > 1 else link) for dim in sizes}


def predict(layers, links, pp, dp, tp, batch, micro_batches=None, state_factor=2,
            memory_limit=None, fsdp=False):
    """The Candidate for one layout, with the stage split that balances compute. ``links``
    maps "pp", "dp", "tp" to the LinkProfile their lines use; ``fsdp``: dp shards the
    parameters (fully_shard on each layer) instead of replicating them."""
    per_replica = batch // dp
    m = micro_batches or (1 if pp == 1 else max(d for d in range(1, 4 * pp + 1)
                                                if per_replica % d == 0))
    times = [(layer.forward_s + layer.backward_s) for layer in layers]
    stages = balanced_stages(times, pp)
    stage_time, stage_comm, stage_memory, stage_grad, stage_bytes = [], [], [], [], []
    for first, last in stages:
        compute = sum(times[first:last]) / dp / (tp if any(
            layer.splittable for layer in layers[first:last]) else 1)
        tp_comm = sum(links['tp'].allreduce_s(layer.activation_bytes / dp, tp)
                      for layer in layers[first:last] if layer.splittable) if tp > 1 else 0.0
        stage_time.append(compute)
        stage_comm.append(tp_comm)
        params = sum(layer.parameter_bytes for layer in layers[first:last]) / tp
        state = params * (2 + state_factor)
        if fsdp:
            collectives = 2 * m + 1
            stage_grad.append(collectives * links['dp'].gather_s(params, dp))
            stage_bytes.append(collectives * params * (dp - 1) / dp)
            state = state / dp + max(layer.parameter_bytes
                                     for layer in layers[first:last]) / tp
        else:
            stage_grad.append(links['dp'].allreduce_s(params, dp))
            stage_bytes.append(2 * params * (dp - 1) / dp)
        kept = sum(layer.activation_bytes for layer in layers[first:last]) / dp / tp
        in_flight = min(pp, m) / m
        stage_memory.append(state + kept * in_flight)
    boundary = [layers[last - 1].activation_bytes / dp / m for _, last in stages[:-1]]
    send = max((2 * links['pp'].send_s(b) for b in boundary), default=0.0)
    slot = max((c + t) / m for c, t in zip(stage_time, stage_comm)) + send
    pipeline = (m + pp - 1) * slot
    step = pipeline + max(stage_grad)
    compute = (m + pp - 1) * max(c / m for c in stage_time)
    memory = int(max(stage_memory))
    return Candidate(pp=pp, dp=dp, tp=tp, stages=stages, micro_batches=m, fsdp=fsdp,
                     step_s=step, compute_s=compute, communication_s=step - compute,
                     memory_bytes=memory, gradient_bytes=max(stage_bytes),
                     fits=memory_limit is None or memory <= memory_limit)
