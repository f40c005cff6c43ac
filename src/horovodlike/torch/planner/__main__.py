"""``horovodlikerun -np N [-H ...] --plan MODULE:FUNCTION``: every rank runs this; FUNCTION()
returns (model, sample_input) or (model, sample_input, plan keyword arguments). On several
hosts (with the same number of ranks each) the link inside a host and the link between hosts
are measured apart."""

import importlib
import os
import socket
import sys

import horovodlike.torch as hvd
from horovodlike.torch.planner import measure_link


def _links():
    """(link, inter_host_link, hosts) measured in this job."""
    names = hvd.allgather_object(os.environ.get("HOROVOD_HOSTNAME") or socket.gethostname(),
                                 name="plan.hosts")
    slots = [names.count(h) for h in dict.fromkeys(names)]
    if len(slots) == 1 or len(set(slots)) != 1 or slots[0] < 2:
        return measure_link(), None, None
    mesh = hvd.ProcessMesh((len(slots), slots[0]), ("host", "local"))
    inside = measure_link(mesh.process_set("local"))
    between = measure_link(mesh.process_set("host"))
    return inside, between, slots


def main(argv):
    if len(argv) != 1 or ":" not in argv[0]:
        raise SystemExit("usage: python -m horovodlike.torch.planner MODULE:FUNCTION")
    module_name, function_name = argv[0].split(":", 1)
    sys.path.insert(0, "")   # a module in the current directory
    built = getattr(importlib.import_module(module_name), function_name)()
    model, sample_input, kwargs = (*built, {})[:3] if len(built) == 2 else built
    hvd.init()
    link, inter_host_link, hosts = _links()
    kwargs = {"link": link, "inter_host_link": inter_host_link, "hosts": hosts, **kwargs}
    hvd.plan(model, sample_input, world_size=hvd.size(), **kwargs)
    hvd.barrier()
    hvd.shutdown()


if __name__ == "__main__":
    main(sys.argv[1:])
