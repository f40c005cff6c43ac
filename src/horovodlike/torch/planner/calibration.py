"""calibrate(): everything the planner's model needs, measured once on the machine that will
train and kept in a file: each layer's compute on every input size the layouts give a rank,
and an alpha-beta line per kind of link (inside a host, between hosts) from the core's own
allreduce."""

import dataclasses
import json
import os
import socket
import time

import torch

from horovodlike.common import basics
from horovodlike.common.objects import allgather_object, broadcast_object
from horovodlike.torch.planner.cost_model import factorisations, micro_batch_count
from horovodlike.torch.planner.links import LinkProfile, measure_link
from horovodlike.torch.planner.profiling import LayerProfile, profile_layers


@dataclasses.dataclass
class Calibration:
    """Measured layer profiles and links. ``links``: "inside" (ranks of one host) and, with
    several hosts, "between" (one rank per host). ``slots_per_host``: ranks per host when the
    job had several hosts, else None."""
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


def shared_cores():
    """(cores, ranks): how many CPUs rank 0 (whose profiles every rank uses) may run on, and
    how many ranks of the job run on the same ones (same machine, same affinity), itself
    included. Collective when the job has several ranks."""
    cpus = (sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
            else list(range(os.cpu_count() or 1)))
    key = [_machine(), cpus]
    keys = (allgather_object(key, name="plan.cores")
            if basics.is_initialized() and basics.size() > 1 else [key])
    return len(keys[0][1]), keys.count(keys[0])


def measure_links():
    """{"inside": link between the ranks of a host, "between": link between hosts (only with
    several hosts of two or more ranks each)}, and the ranks per host then (else None).
    Collective: every rank of the job calls it."""
    names = allgather_object(os.environ.get("HOROVOD_HOSTNAME") or socket.gethostname(),
                             name="plan.hosts")
    slots = [names.count(h) for h in dict.fromkeys(names)]
    inside_kind = "TCP" if os.environ.get("HOROVOD_SHM_DISABLE") == "1" else "shared memory"
    if len(slots) == 1:
        return {"inside": measure_link(kind=inside_kind)}, None
    if len(set(slots)) != 1 or slots[0] < 2:
        return {"inside": measure_link(kind="TCP")}, None
    from horovodlike.torch.process_mesh import ProcessMesh
    mesh = ProcessMesh((len(slots), slots[0]), ("host", "local"))
    inside = measure_link(mesh.process_set("local"), kind=inside_kind)
    # One line of hosts (the first local rank's) measures alone, so that it has the wire to
    # itself; the others wait for its figures.
    between = (measure_link(mesh.process_set("host"), kind="TCP between hosts", share=False)
               if mesh.coordinate("local") == 0 else None)
    between = broadcast_object(between, root_rank=0, name="plan.link.between")
    return {"inside": inside, "between": between}, slots[0]


def calibrate(model, sample_input, path=None, micro_batches=None, repeats=7):
    """Measures ``model`` (a ``torch.nn.Sequential``) on batches like ``sample_input`` (the
    global batch) and this job's links; collective: every rank of the job calls it, all
    profile at once (so the figures include the ranks' competition for cores, which it records
    with the cores and the ranks sharing them, for the model to rescale) and every rank gets
    rank 0's figures. Writes them to ``path`` (rank 0) when given; pass the result, or
    the path, to ``plan(calibration=...)``."""
    if not basics.is_initialized():
        raise ValueError("calibrate: call hvd.init() first; calibrate() runs in the job that "
                         "will train (horovodlikerun -np N), measuring its links")
    if not isinstance(sample_input, torch.Tensor) or sample_input.dim() == 0:
        raise ValueError("calibrate: sample_input must be a tensor whose first dimension is "
                         f"the global batch, got {getattr(sample_input, 'shape', sample_input)!r}")
    world_size, batch = basics.size(), sample_input.shape[0]
    cores, sharing = shared_cores()
    layers = profile_layers(model, sample_input,
                            sizes=layout_sizes(world_size, batch, micro_batches),
                            repeats=repeats)
    layers = broadcast_object(layers, root_rank=0, name="plan.calibrate.layers")
    links, slots = measure_links() if world_size > 1 else ({}, None)
    result = Calibration(layers=layers, links=links, world_size=world_size, batch=batch,
                         slots_per_host=slots,
                         conditions={"load_average": list(os.getloadavg()),
                                     "cpus": os.cpu_count(),
                                     # the layers were profiled with every rank busy:
                                     # ``ranks_sharing_cores`` ranks on ``cores`` CPUs
                                     "cores": cores, "ranks_sharing_cores": sharing,
                                     "torch_threads": torch.get_num_threads(),
                                     "time": time.strftime("%Y-%m-%d %H:%M:%S %Z")})
    if path and basics.rank() == 0:
        result.save(path)
    return result
