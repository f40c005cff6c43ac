"""calibrate(): everything the planner's model needs, measured once on the machine that will
train and kept in a file: each layer's compute on every input size the layouts give a rank,
and an alpha-beta line per kind of link (inside a host, between hosts) from the core's own
allreduce."""

import dataclasses
import json
import os
import socket
import statistics
import time

import torch

from horovodlike.common import basics
from horovodlike.common.objects import allgather_object, broadcast_object
from horovodlike.common.process_sets import global_process_set, set_ranks
from horovodlike.torch.mpi_ops import barrier
from horovodlike.torch.p2p import recv, send
from horovodlike.torch.planner.cost_model import (factorisations, gradient_sync_s,
                                                  micro_batch_count)
from horovodlike.torch.planner.links import LinkProfile, measure_link, measure_send
from horovodlike.torch.planner.profiling import (LayerProfile, median_time, profile_layers,
                                                  sequential_children)


@dataclasses.dataclass
class Calibration:
    """Measured layer profiles and links. ``links``: "inside" (ranks of one host) and, with
    several hosts, "between" (one rank per host) and "across" (every rank, several per
    host); "send_inside" and "send_between", point-to-point messages (measure_links).
    ``slots_per_host``: ranks per host when the job had several hosts, else None."""
    layers: list
    links: dict
    world_size: int
    batch: int
    slots_per_host: int = None
    conditions: dict = dataclasses.field(default_factory=dict)

    def save(self, path):
        with open(path, "w") as f:
            json.dump({"layers": [dataclasses.asdict(layer) for layer in self.layers],
                       "links": {k: dataclasses.asdict(v) for k, v in self.links.items()},
                       "world_size": self.world_size, "batch": self.batch,
                       "slots_per_host": self.slots_per_host,
                       "conditions": self.conditions}, f, indent=1)

    @classmethod
    def load(cls, path):
        with open(path) as f:
            raw = json.load(f)
        try:
            return cls(layers=[LayerProfile(**layer) for layer in raw["layers"]],
                       links={k: LinkProfile(**v) for k, v in raw["links"].items()},
                       world_size=raw["world_size"], batch=raw["batch"],
                       slots_per_host=raw.get("slots_per_host"),
                       conditions=raw.get("conditions", {}))
        except (KeyError, TypeError) as error:
            raise ValueError(f"{path} is not a calibration file written by "
                             f"Calibration.save(): {error}") from None

    def hand_off_links(self, link=None, inter_host_link=None):
        """(send_inside, send_between): the point-to-point links a pipeline's hand-offs take
        (cost_model.pipeline_sends); (None, None) when the planner was given ``link`` or
        ``inter_host_link``, which replace the calibration's links, these too."""
        if link is not None or inter_host_link is not None:
            return None, None
        return self.links.get("send_inside"), self.links.get("send_between")


def layout_sizes(world_size, batch, micro_batches=None):
    """Every (rows, tp) a rank computes one micro-batch on in some layout of ``world_size``."""
    sizes = set()
    for pp, dp, tp in factorisations(world_size):
        if batch % dp:
            continue
        m = micro_batch_count(pp, batch // dp, micro_batches)
        if (batch // dp) % m == 0:
            sizes.add((batch // dp // m, tp))
    return sorted(sizes)


def _machine():
    """What the ranks of one machine share: its kernel's boot id (emulated hosts in network
    namespaces share it too, and their cores), else the host name."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return socket.gethostname()


def machine_of_rank0():
    """(cores, ranks): how many CPUs rank 0 (whose profiles every rank uses) may run on, and
    the ranks of the job that run on the same ones (same machine, same affinity), itself
    included, in rank order. Collective when the job has several ranks."""
    cpus = (sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
            else list(range(os.cpu_count() or 1)))
    key = [_machine(), cpus]
    keys = (allgather_object(key, name="plan.cores")
            if basics.is_initialized() and basics.size() > 1 else [key])
    return len(keys[0][1]), [r for r, k in enumerate(keys) if k == keys[0]]


def shared_cores():
    """(cores, ranks): how many CPUs rank 0 may run on, and how many ranks of the job run on
    the same ones, itself included (machine_of_rank0). Collective."""
    cores, machine = machine_of_rank0()
    return cores, len(machine)


def _model_unit(model, sample_input, rows):
    """The model's forward and backward on ``rows`` rows: the work the sharing is measured on
    (how much neighbours slow it depends on how it uses caches and memory)."""
    x = sample_input[:max(1, rows)].detach()

    def unit():
        out = model(x)
        out.float().sum().backward()
    return unit


def _small_unit():
    """A fixed piece of work of about a millisecond: forward and backward of a Linear."""
    layer = torch.nn.Linear(512, 1024)
    x = torch.randn(16, 512)

    def unit():
        out = layer(x)
        out.backward(torch.ones_like(out))
    return unit


def _per_unit(unit, seconds, partner=None, leads=False):
    """Seconds per ``unit`` run for about ``seconds``; with a ``partner`` rank, the two
    exchange a flag after every unit (``leads``: this rank's clock says when both stop)."""
    flag = torch.zeros(1)
    count, start = 0, time.perf_counter()
    while True:
        unit()
        count += 1
        over = time.perf_counter() - start > seconds
        if partner is None:
            if over:
                break
            continue
        if leads:
            flag[0] = float(over)
            send(flag, partner, tag=7)
            recv(flag, partner, tag=8)
        else:
            recv(flag, partner, tag=7)
            send(flag, partner, tag=8)
        if flag[0] > 0:
            break
    return (time.perf_counter() - start) / count


def _pair_set():
    """This rank's pair (ranks 2i, 2i + 1, as tensor parallel's groups of two lie, and a
    2-stage pipeline's) as a process set; None with an odd number of ranks. Collective."""
    size = basics.size()
    if size < 2 or size % 2:
        return None
    from horovodlike.torch.process_mesh import ProcessMesh
    return ProcessMesh((size // 2, 2), ("pairs", "pair")).process_set("pair")


def _pair_meeting(nbytes, link, pair):
    """(meet, price), or None without a ``pair`` (_pair_set), a link or a message:
    ``meet(done)`` allreduces a buffer of ``nbytes`` over this rank's pair carrying this
    side's ``done`` in its first element, and returns whether either side is done; ``price``:
    what ``link`` prices that allreduce at."""
    if nbytes <= 0 or pair is None or link is None:
        return None
    from horovodlike.torch.mpi_ops import Sum, allreduce_
    buffer = torch.zeros(max(1, nbytes // 4))

    def meet(done):
        buffer.zero_()
        buffer[0] = float(done)
        allreduce_(buffer, op=Sum, process_set=pair, name="plan.sharing.meeting")
        return bool(buffer[0] > 0)
    return meet, link.allreduce_s(buffer.numel() * 4, 2)


def _per_meeting(piece, meet, seconds):
    """Seconds per ``piece`` and meeting of the pair (_pair_meeting's ``meet``), for about
    ``seconds``: the pair stops together, when either side's time is up."""
    count, start = 0, time.perf_counter()
    while True:
        piece()
        count += 1
        if meet(time.perf_counter() - start > seconds):
            return (time.perf_counter() - start) / count


def measure_sharing(unit, cores, machine, rounds=25, seconds=0.04, message_bytes=0,
                    link=None, pair=None):
    """(slowdown, wake_s, collective_wake_s) of rank 0's machine, as Contention takes them: how
    much slower ``unit()`` (the model's work) runs while ``cores`` ranks of the machine
    (``machine``: its ranks, from machine_of_rank0) compute at once than alone, and (with more
    ranks than cores) what an exchange between two ranks costs beyond its link while the
    machine's other ranks compute: pairs of ranks exchanging a flag after every piece of a fixed
    small work (about a layer's) against the same work with no exchange. With no more ranks than
    cores, the ranks computing at once are paired the same way and exchange a flag after every
    unit: a layout's ranks meet at least once a step (its gradient allreduce, its tensor
    parallel collectives, its hand-offs) and go at the pace of the slower of them, and the cores
    of a shared machine do not run at one speed (each one's varies by 10-20% over seconds, not
    alike). With more ranks than cores they compute without meeting: what a meeting costs there
    is ``wake_s``, charged per synchronisation. Short windows of each kind in turn, ``rounds``
    times (the machine's speed drifts: each kind sees the same drift), the medians over the
    rounds and over the ranks that took part. ``collective_wake_s``: the same for a meeting
    through an allreduce of ``message_bytes`` over the pair (a tensor parallel collective of the
    model: a multi-step exchange on shared memory, each step a meeting), beyond what ``link``
    prices it at, over ``pair`` (_pair_set), every pair of the job meeting at once, the
    machine's own pairs (with several machines, theirs too: each round of a pair's set
    negotiates the job's global set as well); None where not measured (no pair). Collective;
    every rank gets the same figures."""
    rank = basics.rank()
    piece = _small_unit()
    unit()
    piece()
    # Each window holds several of the model's pieces of work, however long one takes.
    start = time.perf_counter()
    unit()
    one = broadcast_object(time.perf_counter() - start, root_rank=0, name="plan.sharing.unit")
    long = max(seconds, 5 * one)
    mine = {"alone": [], "together": [], "crowded": [], "paired": [], "met": []}
    # The exchanges are point-to-point messages; without them (a job started without the
    # launcher's rendezvous or MPI) the pairs compute without meeting and the cost of an
    # exchange stays unmeasured (0: the cost model estimates).
    exchanges = basics.build_info().get("point_to_point") is not None
    crowded_machine = len(machine) > cores and exchanges
    meeting = _pair_meeting(message_bytes, link, pair) if crowded_machine else None

    def partner_of(ranks):
        """This rank's partner among ``ranks`` (None: none, or no exchanges), and whether it
        leads the pair."""
        index = ranks.index(rank)
        mate = index ^ 1
        return (ranks[mate] if exchanges and mate < len(ranks) else None), index % 2 == 0

    for _ in range(rounds):
        barrier()
        if rank == 0:
            mine["alone"].append(_per_unit(unit, long))
        barrier()
        if rank in machine[:cores]:
            partner, leads = (None, False) if crowded_machine else partner_of(machine[:cores])
            mine["together"].append(_per_unit(unit, long, partner, leads))
        if not crowded_machine:
            continue
        barrier()
        if rank in machine:
            mine["crowded"].append(_per_unit(piece, seconds))
        barrier()
        if rank in machine:
            partner, leads = partner_of(machine)
            mine["paired"].append(_per_unit(piece, seconds, partner, leads))
        if meeting is not None:
            barrier()
            mine["met"].append(_per_meeting(piece, meeting[0], seconds))
    everyone = allgather_object(mine, name="plan.sharing")
    alone = statistics.median(everyone[0]["alone"])
    together = statistics.median(statistics.median(f["together"])
                                 for f in everyone if f["together"])
    slowdown = max(1.0, together / alone)
    wake, collective_wake = 0.0, None

    def beyond(kind, priced=0.0):
        return max(0.0, statistics.median(
            statistics.median(f[kind]) - statistics.median(f["crowded"]) - priced
            for f in everyone if f[kind] and f["crowded"]))
    if crowded_machine:
        wake = beyond("paired")
    if meeting is not None:
        collective_wake = beyond("met", meeting[1])
    return slowdown, wake, collective_wake


def measure_links():
    """{"inside": link between the ranks of a host, "between": link between hosts (one rank
    per host) and "across": a line of every rank (only with several hosts of two or more
    ranks each), "send_inside" and "send_between": a point-to-point message inside a host
    and from one host to the next (measure_send; the latter with "across")}, and then the
    ranks per host and the process set of this rank's host (else None, None). Collective:
    every rank of the job calls it."""
    names = allgather_object(os.environ.get("HOROVOD_HOSTNAME") or socket.gethostname(),
                             name="plan.hosts")
    slots = [names.count(h) for h in dict.fromkeys(names)]
    inside_kind = "TCP" if os.environ.get("HOROVOD_SHM_DISABLE") == "1" else "shared memory"
    if len(slots) == 1:
        return ({"inside": measure_link(kind=inside_kind),
                 "send_inside": measure_send(1, kind=f"point-to-point, {inside_kind}")},
                None, None)
    if len(set(slots)) != 1 or slots[0] < 2:
        return {"inside": measure_link(kind="TCP")}, None, None
    from horovodlike.torch.process_mesh import ProcessMesh
    mesh = ProcessMesh((len(slots), slots[0]), ("host", "local"))
    inside = measure_link(mesh.process_set("local"), kind=inside_kind)
    # One line of hosts (the first local rank's) measures alone, so that it has the wire to
    # itself; the others wait for its figures.
    between = (measure_link(mesh.process_set("host"), kind="TCP between hosts", share=False)
               if mesh.coordinate("local") == 0 else None)
    between = broadcast_object(between, root_rank=0, name="plan.link.between")
    # And the whole job, several ranks on each host: a line like it (tp or dp over every
    # rank) keeps part of its steps inside the hosts.
    across = measure_link(kind="TCP across hosts")
    # A pipeline's hand-offs, inside a host and from the first host to the next.
    sends = {"send_inside": measure_send(1, kind=f"point-to-point, {inside_kind}"),
             "send_between": measure_send(slots[0], kind="point-to-point between hosts")}
    return ({"inside": inside, "between": between, "across": across, **sends}, slots[0],
            mesh.process_set("local"))


def measure_exchange(model, layers, link, repeats=15, host=None):
    """Seconds per gradient byte that data parallel's exchange over the whole job costs beyond
    what its link prices (cost_model.gradient_sync_s): every rank allreduces a buffer shaped
    like each of the model's parameters, as DistributedOptimizer does its gradients (one
    asynchronous request per tensor, the last layer's first, then a wait for them all), timed
    ``repeats`` times; the ranks' median against the link's price of the same bytes.
    The difference is the requests, the copies into and out of the fusion buffer and the
    background thread's rounds, which a link measured on one tensor at a time does not see:
    work of each host, so with several hosts it is measured among the ranks of each host
    (``host``: this rank's host's process set, measure_links'), ``link`` then the link inside a
    host (a slow link between hosts would
    bury it in that link's own variation). Collective."""
    from horovodlike.torch.mpi_ops import allreduce_async_, synchronize
    group = host if host is not None else global_process_set
    ranks = len(set_ranks(group))
    buffers = [torch.zeros_like(p) for child in reversed(sequential_children(model))
               for p in reversed(list(child.parameters())) if p.requires_grad]
    if not buffers or link is None:
        return 0.0
    total = sum(b.numel() * b.element_size() for b in buffers)

    def exchange():
        handles = [allreduce_async_(b, name=f"plan.exchange.{i}", process_set=group)
                   for i, b in enumerate(buffers)]
        for handle in handles:
            synchronize(handle)
    exchange()
    times = []
    for _ in range(repeats):
        barrier()
        start = time.perf_counter()
        exchange()
        times.append(time.perf_counter() - start)
    measured = statistics.median(allgather_object(statistics.median(times),
                                                  name="plan.exchange"))
    priced = gradient_sync_s(layers, link, 1, ranks, 1, overlap=False)
    return max(0.0, (measured - priced) / total)


def _tiny_pipeline_step(stage_index, pair, micro_batches):
    """One step of a 2-stage Schedule1F1B over ``pair`` (its two ranks) of layers too small to
    matter (a Linear(8, 8) each, 4 rows a micro-batch): what remains is the schedule's own
    work per action and its hand-offs."""
    from horovodlike.torch.pipelining import PipelineStage, Schedule1F1B
    torch.manual_seed(0)
    stage = PipelineStage(torch.nn.Linear(8, 8), stage_index, 2, process_set=pair)
    schedule = Schedule1F1B(stage, micro_batches, torch.nn.functional.mse_loss)
    x, target = torch.randn(4 * micro_batches, 8), torch.randn(4 * micro_batches, 8)
    if stage_index == 0:
        return lambda: schedule.step(x)
    return lambda: schedule.step(target=target)


def measure_pipeline_action(link, pair, repeats=15):
    """Seconds a pipeline action (one stage's forward or backward of a micro-batch) costs
    beyond its compute and its hand-off's link: the schedule's own work (its bookkeeping, the
    point-to-point calls, autograd on the kept tensors). Ranks 0 and 1 (their ``pair``,
    _pair_set's) run a 2-stage Schedule1F1B of negligible layers with 2 and with 10
    micro-batches in turn, ``repeats`` times, while the others wait; the step's growth per
    micro-batch (the median of the repeats' differences) against what pipeline_sim plays for
    the same compute and link is two actions' cost. 0.0 without a pair or a link.
    Collective."""
    from horovodlike.torch.planner.pipeline_sim import StageWork, simulate_1f1b
    rank = basics.rank()
    if pair is None or link is None or basics.build_info().get("point_to_point") is None:
        return 0.0
    few, many = 2, 10
    times = {few: [], many: []}
    if rank < 2:
        steps = {m: _tiny_pipeline_step(rank, pair, m) for m in times}
        for step in steps.values():
            step()
        for _ in range(repeats):
            for m, step in steps.items():
                start = time.perf_counter()
                step()
                times[m].append(time.perf_counter() - start)
    action = None
    if rank == 0:
        # Each repeat's two steps back to back: the machine's drift cancels in their difference.
        growth = statistics.median(b - a for a, b in zip(times[few], times[many])) / (many - few)
        # What the model plays for the same layers alone: their compute, timed here, and the
        # hand-offs on the link (32 floats a micro-batch).
        layer, rows = torch.nn.Linear(8, 8), torch.randn(4, 8, requires_grad=True)
        forward = median_time(lambda: layer(rows), repeats)
        both = median_time(lambda: layer(rows).sum().backward(), repeats)
        work = [StageWork(forward, max(both - forward, 0.0))] * 2
        send = [link.send_s(4 * 8 * 4)]
        played = (max(simulate_1f1b(work, many, send)) -
                  max(simulate_1f1b(work, few, send))) / (many - few)
        action = max(0.0, (growth - played) / 2)
    return broadcast_object(action, root_rank=0, name="plan.pipeline.action")


def calibrate(model, sample_input, path=None, micro_batches=None, repeats=7,
              optimizer=None):
    """Measures ``model`` (a ``torch.nn.Sequential``) on batches like ``sample_input`` (the
    global batch), this job's links and how its ranks share the cores (measure_sharing);
    collective: every rank of the job calls it. Rank 0 profiles the layers while the others
    wait (figures of a rank alone on a core; the cost model applies each layout's sharing),
    and every rank gets rank 0's figures. ``optimizer``: a function of a list of parameters
    returning the torch optimizer training will use, whose step profile_layers times on each
    layer (plain SGD when None). Writes them to ``path`` (rank 0) when given; pass the
    result, or the path, to ``plan(calibration=...)``."""
    if not basics.is_initialized():
        raise ValueError("calibrate: call hvd.init() first; calibrate() runs in the job that "
                         "will train (horovodlikerun -np N), measuring its links")
    if not isinstance(sample_input, torch.Tensor) or sample_input.dim() == 0:
        raise ValueError("calibrate: sample_input must be a tensor whose first dimension is "
                         f"the global batch, got {getattr(sample_input, 'shape', sample_input)!r}")
    world_size, batch = basics.size(), sample_input.shape[0]
    cores, machine = machine_of_rank0()
    sharing = len(machine)
    # Rank 0 profiles alone while the others wait: with more ranks than cores, figures taken
    # all at once are mostly the scheduler's time slices (a Linear of 1.0-2.1 ms alone
    # measured at 1.4-9.3 ms, by luck), which no rescaling recovers. The cost model applies
    # the layouts' own sharing of the cores to these figures.
    sequential_children(model)   # every rank raises alike on a model of the wrong kind
    layers, error = None, None
    if basics.rank() == 0:
        try:
            layers = profile_layers(model, sample_input,
                                    sizes=layout_sizes(world_size, batch, micro_batches),
                                    repeats=repeats, optimizer=optimizer)
        except Exception as e:  # noqa: BLE001 - the other ranks wait for it: tell them
            error = e
    layers, message = broadcast_object(
        (layers, None if error is None else f"{type(error).__name__}: {error}"),
        root_rank=0, name="plan.calibrate.layers")
    if error is not None:
        raise error
    if message is not None:
        raise ValueError(f"calibrate: rank 0 could not profile the model: {message}")
    links, slots, host = measure_links() if world_size > 1 else ({}, None, None)
    exchange = (measure_exchange(model, layers, links.get("inside"), host=host)
                if world_size > 1 and (slots is None or slots > 1) else 0.0)
    pair = _pair_set()
    action = measure_pipeline_action(links.get("inside"), pair) if pair is not None else 0.0
    # A tensor parallel collective of the model, as a layout of a micro-batch per rank
    # sends it: the median of its messages, on the rows the sharing's unit computes.
    messages = sorted(m * (batch // world_size) / batch for layer in layers
                      for m in layer.tp_messages)
    slowdown, wake, collective_wake = (
        measure_sharing(_model_unit(model, sample_input, batch // world_size), cores, machine,
                        message_bytes=int(messages[len(messages) // 2]) if messages else 0,
                        link=links.get("inside"), pair=pair)
        if world_size > 1 else (1.0, 0.0, None))
    model.zero_grad(set_to_none=True)
    result = Calibration(layers=layers, links=links, world_size=world_size, batch=batch,
                         slots_per_host=slots,
                         conditions={"load_average": list(os.getloadavg()),
                                     "cpus": os.cpu_count(),
                                     # ``ranks_sharing_cores`` ranks of the job on
                                     # ``cores`` CPUs; the layers profiled by one of them
                                     # while the others waited (``profiled_busy``)
                                     "cores": cores, "ranks_sharing_cores": sharing,
                                     "profiled_busy": 1,
                                     # Contention's slowdown and wake_s
                                     "slowdown": slowdown, "wake_s": wake,
                                     "collective_wake_s": collective_wake,
                                     # seconds per gradient byte beyond the link
                                     # (measure_exchange)
                                     "exchange_s_per_byte": exchange,
                                     # a pipeline action's own cost, alone on a core
                                     # (measure_pipeline_action)
                                     "pipeline_action_s": action,
                                     "torch_threads": torch.get_num_threads(),
                                     "time": time.strftime("%Y-%m-%d %H:%M:%S %Z")})
    if path and basics.rank() == 0:
        result.save(path)
    return result
