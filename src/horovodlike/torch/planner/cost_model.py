"""The planner's cost model: a predicted step time and memory per rank for one (pp, dp, tp)
layout and stage split, from measured layer profiles and measured links. Each term is a
function of its own, for a search over other splits to reuse.

- compute (``layer_compute_s``): a layer's forward + backward on the rows one micro-batch
  gives a rank (B / dp / m), measured at that size when the profile has it (calibrate()
  measures every size the layouts use) or scaled from the whole batch; tensor parallelism
  divides only the layer's split part (its paired Linears, layers between a pair);
- cores (``Contention``): with more ranks than cores on a host a rank computes slower by
  the ranks busy at once over the cores, and slower again while every core computes (the
  measured ``slowdown``: neighbours share caches and memory); calibrate() profiles alone, a
  layout's ranks are busy m / (m + pp - 1) of the step under a pipeline (``busy_fraction``),
  always otherwise;
- synchronisations: with more ranks than cores, a collective of a group smaller than the
  host's ranks, or a pipeline hand-off, costs the measured ``wake_s`` beyond its link (its
  members get a core only in the scheduler's turn), a tensor parallel collective the
  measured ``collective_wake_s`` (an allreduce of the model's size meets several times);
  calibrations without those figures estimate tensor parallel's wait for its slowest peer
  instead (``tp_skew_s``); under a pipeline a group's collective (tensor parallel's, the
  gradients' over dp) pays it even when the group is all of its host's ranks: each round
  negotiates the job's global set too, and the other stages' ranks are busy elsewhere;
- tensor parallel (``tp_communication_s``): each column/row pair allreduces once in forward
  (the row's output) and once in backward (the column's input gradient), per micro-batch,
  each message paying the link's latency;
- pipeline (``pipeline_sim``): Schedule1F1B played out action by action, each stage's
  forward and backward of a micro-batch (its compute plus the schedule's own measured work
  per action, ``pipeline_action_s``) waiting for its neighbour's, each machine's cores
  shared by the ranks computing at that moment (processor sharing); the boundary activation
  sent forward and its gradient back, each a send on the link;
- data parallel (``gradient_sync_s``): as DistributedOptimizer does it, each layer's gradients
  are allreduced over dp as soon as its last backward produced them, one after another, while
  the backward of earlier layers runs; only what is left after the stage's last backward is
  added, after that stage's own last backward in the played-out schedule (a later stage
  finishes first, so its allreduce can hide while the earlier ones drain); each allreduce
  costs its link's time plus the measured cost per byte of DistributedOptimizer's exchange
  beyond it (``exchange_s_per_byte``: requests, fusion buffer copies);
- the optimizer (``update_s``): each rank's step on the parameters it holds, from each
  layer's profiled step, after its gradients are in;
- fully sharded data parallel (``fsdp_sync_s``, fully_shard over dp, each layer wrapped): the
  parameters allgathered for each micro-batch's forward and again for its backward, the
  gradients reduce-scattered once per step: (2m + 1) x the parameter bytes x (dp-1)/dp
  through each rank (3x with one micro-batch), not overlapped.
Memory per rank (``stage_memory_bytes``): parameters (/ tp for the split layers) x (weights
+ gradients + optimizer state), divided by dp under fully_shard plus the largest layer's
parameters (gathered whole while it computes), plus the activations kept for backward (B/dp
of them, / tp, and min(pp, m)/m of them under 1F1B).
"""

import dataclasses
import itertools

from horovodlike.torch.planner.pipeline_sim import StageWork, simulate_1f1b
from horovodlike.torch.planner.profiling import timing_key


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


def members_per_host(slots_per_host, stride, size):
    """How many ranks of one line of a dimension (``size`` ranks ``stride`` apart) lie on one
    host of ``slots_per_host`` consecutive ranks."""
    return min(size, max(1, slots_per_host // stride))


def lines_per_host(slots_per_host, stride, size):
    """How many lines of a dimension (``size`` ranks ``stride`` apart) have a rank on one
    host of ``slots_per_host`` consecutive ranks: the lines that share its wire."""
    return max(1, slots_per_host // members_per_host(slots_per_host, stride, size))


def pipeline_sends(slots_per_host, pp, dp, tp, send_inside, send_between):
    """The link each of a pipeline's pp - 1 hand-offs takes (point-to-point messages from each
    rank of a stage to its peer dp x tp ranks on): ``send_between`` where they leave a host
    of ``slots_per_host`` consecutive ranks, shared by the stage's ranks on it, else
    ``send_inside``. None unless ``send_inside`` is given (and ``send_between`` with hosts)."""
    group = dp * tp
    if send_inside is None or (slots_per_host and send_between is None):
        return None
    sends = []
    for stage in range(pp - 1):
        first = stage * group
        leaves = slots_per_host and first // slots_per_host != (first + group) // slots_per_host
        sends.append(send_between.shared_by(lines_per_host(slots_per_host, group, pp))
                     if leaves else send_inside)
    return sends


def links_by_dimension(link, inter_host_link, slots_per_host, pp, dp, tp, across_link=None,
                       sends=(None, None)):
    """The link each dimension's lines use: ranks are laid out tp fastest, then dp, then pp
    (as ProcessMesh((pp, dp, tp)) does), so a line leaves its host when it spans more
    consecutive ranks than a host has slots; then every line of that dimension with a rank
    on the host shares the host's wire. A line leaving its host with several ranks on each
    host takes ``across_link`` when given (measured over such a line: part of its steps stay
    inside the hosts), else ``inter_host_link`` (one rank per host). With ``sends`` (the
    point-to-point links inside a host and between hosts), "pp_sends" holds the link of each
    pipeline hand-off (pipeline_sends)."""
    stride = {"tp": 1, "dp": tp, "pp": tp * dp}
    sizes = {"tp": tp, "dp": dp, "pp": pp}
    links = {}
    for dim in sizes:
        leaves = slots_per_host and stride[dim] * sizes[dim] > slots_per_host and sizes[dim] > 1
        if not leaves:
            links[dim] = link
            continue
        several = members_per_host(slots_per_host, stride[dim], sizes[dim]) > 1
        wire = across_link if across_link is not None and several else inter_host_link
        links[dim] = wire.shared_by(lines_per_host(slots_per_host, stride[dim], sizes[dim]))
    hand_offs = pipeline_sends(slots_per_host, pp, dp, tp, *sends)
    if hand_offs is not None:
        links["pp_sends"] = hand_offs
    return links


@dataclasses.dataclass
class Contention:
    """The ranks of one host sharing its cores. ``cores``: the cores they may run on;
    ``ranks``: the planned job's ranks on them; ``profiled_busy``: the ranks that computed on
    them at once while the layer profiles were taken (1 for profiles taken alone, as
    calibrate() takes them; every rank of the job in calibrations written before). A rank
    computes max(1, busy ranks / cores) times slower than alone, and ``slowdown`` times slower
    again while every core computes (neighbours on the other cores share caches and memory
    bandwidth; linear in between). ``wake_s``: while the host's ranks outnumber its cores, what
    a synchronisation of a group smaller than the host's ranks (a collective, a pipeline
    hand-off) costs beyond its link: its members are runnable all along but each gets a core
    only in the scheduler's turn, among ranks outside the group. ``collective_wake_s``: the
    same for a tensor parallel collective of the model's size, whose steps (shared memory's
    staged, reduced and released) are meetings each; wake_s's figure when None. calibrate()
    measures them; 1, 0 and None when not measured."""
    cores: int
    ranks: int
    profiled_busy: float = 1.0
    slowdown: float = 1.0
    wake_s: float = 0.0
    collective_wake_s: float = None

    def __post_init__(self):
        if self.cores < 1 or self.ranks < 1 or self.profiled_busy < 1 or self.slowdown < 1:
            raise ValueError(f"Contention: cores, ranks, profiled_busy and slowdown must be at "
                             f"least 1, got {self.cores}, {self.ranks}, {self.profiled_busy}, "
                             f"{self.slowdown}")
        if self.wake_s < 0:
            raise ValueError(f"Contention: wake_s must be >= 0, got {self.wake_s}")

    def oversubscription(self, busy_share=1.0):
        """How much slower than alone a rank computes while ``busy_share`` of the ranks are
        busy at once, for want of a core."""
        return max(1.0, self.ranks * busy_share / self.cores)

    def core_slowdown(self, computing):
        """How much slower each of ``computing`` ranks on as many cores runs than one alone."""
        if self.cores <= 1:
            return 1.0
        share = (min(max(computing, 1.0), self.cores) - 1) / (self.cores - 1)
        return 1.0 + (self.slowdown - 1.0) * share

    def alone_scale(self):
        """The factor from the profiled compute to a rank's alone on a core."""
        return 1.0 / max(1.0, self.profiled_busy / self.cores)

    def compute_scale(self, busy_share=1.0):
        """The factor from the profiled compute to a layout's whose ranks are busy
        ``busy_share`` of the step."""
        return (self.oversubscription(busy_share)
                * self.core_slowdown(self.ranks * busy_share) * self.alone_scale())

    def sync_s(self, group_on_host, collective=False, apart=False):
        """What a synchronisation of a group with ``group_on_host`` ranks on this host costs
        beyond its link: ``wake_s`` (``collective_wake_s`` for a tensor parallel
        ``collective``) when ranks outside the group compete for the cores, or (``apart``)
        when the job's other ranks work elsewhere meanwhile, other pipeline stages: each
        round negotiates the job's global set too, so the collective waits for their rounds
        even when the group is all of this host's ranks."""
        if self.ranks <= self.cores or (group_on_host >= self.ranks and not apart):
            return 0.0
        if collective and self.collective_wake_s is not None:
            return self.collective_wake_s
        return self.wake_s


def busy_fraction(pp, micro_batches):
    """The share of a step a rank computes: under GPipe or 1F1B a stage works in m of the
    (m + pp - 1) slots and waits out the bubble; data and tensor parallel ranks always."""
    return micro_batches / (micro_batches + pp - 1)


def tp_skew_s(compute_s, tp, oversubscription):
    """Seconds a tensor parallel collective waits for its last peer after ``compute_s`` of
    work between collectives (as measured with that ``oversubscription``: alone it takes
    compute_s / o). Each peer is runnable all along but runs only 1/o of the time: it takes
    the work alone plus a wait uniform in [0, 2 (o - 1)] x that, whose mean the measured
    compute already holds; the last of tp such peers comes (tp - 1) / (tp + 1) of that
    range's half later than the mean."""
    if tp <= 1 or oversubscription <= 1:
        return 0.0
    alone = compute_s / oversubscription
    return alone * (oversubscription - 1) * (tp - 1) / (tp + 1)


def micro_batch_count(pp, per_replica, micro_batches=None):
    """The micro-batches per step: as given, 1 without a pipeline, else the largest divisor of
    the replica's rows up to 4 x pp (enough to keep the bubble small)."""
    if micro_batches:
        return micro_batches
    return 1 if pp == 1 else max(d for d in range(1, 4 * pp + 1) if per_replica % d == 0)


def layer_compute_s(layer, rows, tp):
    """Forward + backward seconds of ``layer`` on ``rows`` rows with tensor parallel ``tp``:
    measured at that size when profiled, else the whole batch's time scaled to ``rows``, its
    split part divided by tp."""
    measured = layer.timings.get(timing_key(rows, tp))
    if measured is not None:
        return measured
    scale = rows / layer.batch if layer.batch else 1.0
    whole = (layer.forward_s + layer.backward_s) * scale
    split = layer.split_s * scale if tp > 1 else 0.0
    return whole - split + split / tp


def backward_share(layer):
    total = layer.forward_s + layer.backward_s
    return layer.backward_s / total if total > 0 else 2 / 3


def tp_communication_s(layer, link, rows, tp):
    """Seconds of ``layer``'s tensor parallel allreduces for one micro-batch of ``rows`` rows:
    one per message (a pair's forward and backward), each paying the latency."""
    if tp <= 1:
        return 0.0
    scale = rows / layer.batch if layer.batch else 1.0
    return sum(link.allreduce_s(nbytes * scale, tp) for nbytes in layer.tp_messages)


def stage_parameter_bytes(layers, tp):
    """Parameters one rank holds of these layers: the split layers' cut tp ways."""
    return sum(layer.parameter_bytes / (tp if layer.splittable else 1) for layer in layers)


def gradient_sync_s(layers, link, rows, dp, tp, overlap=True, compute_scale=1.0,
                    extra_s_per_byte=0.0):
    """Seconds the gradient allreduce over dp runs on after the last backward of ``layers``
    (on ``rows`` rows, the profiled compute x ``compute_scale``) ends: each layer's allreduce
    starts when its backward is done and the previous allreduce has finished, and costs its
    link's time plus ``extra_s_per_byte`` per byte (what DistributedOptimizer's exchange costs
    beyond the link: copies into and out of the fusion buffer, a request per tensor; measured
    by calibrate()). Without ``overlap`` (no core free for the core's background thread while
    the backward computes) they all run after it."""
    if dp <= 1:
        return 0.0

    def exchange_s(nbytes):
        return link.allreduce_s(nbytes, dp) + extra_s_per_byte * nbytes
    if not overlap:
        return sum(exchange_s(stage_parameter_bytes([layer], tp))
                   for layer in layers if layer.parameter_bytes)
    clock = link_free = 0.0
    for layer in reversed(layers):
        clock += layer_compute_s(layer, rows, tp) * compute_scale * backward_share(layer)
        nbytes = stage_parameter_bytes([layer], tp)
        if nbytes:
            link_free = max(link_free, clock) + exchange_s(nbytes)
    return max(link_free - clock, 0.0)


def update_s(layers, tp, dp=1, fsdp=False):
    """Seconds of the optimizer's step on the parameters one rank holds of ``layers`` (the
    split layers' cut tp ways, and dp ways under fully_shard): each layer's profiled step
    (``LayerProfile.update_s``), in proportion to the bytes held."""
    shards = dp if fsdp else 1
    return sum(layer.update_s / (tp if layer.splittable else 1) / shards for layer in layers)


def fsdp_sync_s(parameter_bytes, link, dp, micro_batches):
    """(seconds, bytes through each rank) of fully_shard's (2m + 1) collectives."""
    collectives = 2 * micro_batches + 1
    return (collectives * link.gather_s(parameter_bytes, dp),
            collectives * parameter_bytes * (dp - 1) / dp)


def stage_hosts(pp, dp, tp, ranks_per_machine):
    """(machine of each stage, ranks of a machine running it): ranks are laid out tp fastest,
    then dp, then pp, so a stage's dp x tp ranks are consecutive. A machine is what shares
    cores (emulated hosts of one machine share its cores)."""
    group = dp * tp
    if not ranks_per_machine:
        return [0] * pp, group
    return ([s * group // ranks_per_machine for s in range(pp)],
            min(group, ranks_per_machine))


def stage_memory_bytes(layers, dp, tp, pp, micro_batches, state_factor, fsdp):
    params = stage_parameter_bytes(layers, tp)
    state = params * (2 + state_factor)
    if fsdp:
        state = state / dp + max(stage_parameter_bytes([layer], tp) for layer in layers)
    kept = sum(layer.activation_bytes for layer in layers) / dp / tp
    return state + kept * min(pp, micro_batches) / micro_batches


def _played_pipeline(layers, alone, waits, stages, boundary, link, m, dp, tp, contention,
                     action_s=0.0, sends=None):
    """Each stage's end of its last backward under Schedule1F1B (pipeline_sim), from each
    layer's compute ``alone`` on a core and each action's own cost ``action_s`` (alone too):
    each machine's sharing of its cores played out event by event. The hand-offs take
    ``sends`` (a link per boundary, pipeline_sends), else ``link``."""
    hosts, ranks = stage_hosts(len(stages), dp, tp, contention.ranks if contention else None)
    work = []
    for (first, last), host in zip(stages, hosts):
        forward = backward = action_s
        waited = 0.0
        for c, w, layer in zip(alone[first:last], waits[first:last], layers[first:last]):
            share = backward_share(layer)
            forward += c * (1 - share)
            backward += c * share
            waited += w
        work.append(StageWork(forward, backward, waited / 2, waited / 2, host, ranks))
    sends = [wire.send_s(b) for wire, b in zip(sends or [link] * len(boundary), boundary)]
    if contention is None:
        return simulate_1f1b(work, m, sends)
    return simulate_1f1b(work, m, sends, cores=contention.cores,
                         wake_s=contention.sync_s(2), slowdown=contention.core_slowdown)


def predict(layers, links, pp, dp, tp, batch, micro_batches=None, state_factor=2,
            memory_limit=None, fsdp=False, overlap=True, contention=None,
            exchange_s_per_byte=0.0, pipeline_action_s=0.0):
    """The Candidate for one layout, with the stage split that balances the per-micro-batch
    time. ``links`` maps "pp", "dp", "tp" to the LinkProfile their lines use, and may map
    "pp_sends" to the link of each pipeline hand-off (pipeline_sends); ``fsdp``: dp
    shards the parameters (fully_shard on each layer) instead of replicating them;
    ``overlap``: the gradient allreduce runs during the backward (see gradient_sync_s);
    ``contention``: the host's ranks and cores (a Contention), None to take the profiles as
    they are, without a skew; ``exchange_s_per_byte``: what the gradient exchange costs per
    byte beyond its link (gradient_sync_s); ``pipeline_action_s``: what each forward or
    backward of a micro-batch under a pipeline costs beyond its compute, alone on a core (the
    schedule's own work). Each stage's ranks end the step with the optimizer's step on their
    parameters (update_s)."""
    # A profile without its batch size was measured on this batch.
    layers = [layer if layer.batch else dataclasses.replace(layer, batch=batch)
              for layer in layers]
    m = micro_batch_count(pp, batch // dp, micro_batches)
    rows = batch // dp // m
    busy = busy_fraction(pp, m)
    scale = contention.compute_scale(busy) if contention else 1.0
    crowd = contention.oversubscription(busy) if contention else 1.0
    # A calibration that measured the synchronisation cost charges it; one that did not
    # (older files, no point-to-point) estimates tensor parallel's wait (tp_skew_s).
    measured = contention is not None and contention.wake_s > 0
    profiled = [layer_compute_s(layer, rows, tp) for layer in layers]
    compute = [p * scale for p in profiled]
    alone = [p * (contention.alone_scale() if contention else 1.0) for p in profiled]
    # Under a pipeline a group's collective meets while the other stages' ranks work.
    apart = pp > 1
    waits = [tp_communication_s(layer, links["tp"], rows, tp)
             + ((contention.sync_s(members_per_host(contention.ranks, 1, tp), collective=True,
                                   apart=apart) * len(layer.tp_messages)
                 if tp > 1 else 0.0) if measured else tp_skew_s(c, tp, crowd))
             for c, layer in zip(compute, layers)]
    per_layer = [c + w for c, w in zip(compute, waits)]
    stages = balanced_stages(per_layer, pp)
    slots = [sum(per_layer[a:b]) for a, b in stages]
    boundary = [layers[last - 1].activation_bytes / batch * rows for _, last in stages[:-1]]
    if pp > 1:
        ends = _played_pipeline(layers, alone, waits, stages, boundary, links["pp"], m,
                                dp, tp, contention, pipeline_action_s, links.get("pp_sends"))
    else:
        ends = [slots[0]]
    finish, moved = [], []
    for index, (first, last) in enumerate(stages):
        stage = layers[first:last]
        params = stage_parameter_bytes(stage, tp)
        if fsdp:
            sync, nbytes = fsdp_sync_s(params, links["dp"], dp, m)
        else:
            sync, nbytes = gradient_sync_s(stage, links["dp"], rows, dp, tp, overlap,
                                           scale, exchange_s_per_byte), \
                2 * params * (dp - 1) / dp
        if dp > 1 and measured and params:
            sync += contention.sync_s(members_per_host(contention.ranks, tp, dp), apart=apart)
        finish.append(ends[index] + sync + update_s(stage, tp, dp, fsdp) * scale)
        moved.append(nbytes)
    step = max(finish)
    compute_s = (m + pp - 1) * max(sum(compute[a:b]) for a, b in stages)
    memory = int(max(stage_memory_bytes(layers[a:b], dp, tp, pp, m, state_factor, fsdp)
                     for a, b in stages))
    return Candidate(pp=pp, dp=dp, tp=tp, stages=stages, micro_batches=m, fsdp=fsdp,
                     step_s=step, compute_s=compute_s, communication_s=step - compute_s,
                     memory_bytes=memory, gradient_bytes=max(moved),
                     fits=memory_limit is None or memory <= memory_limit)
