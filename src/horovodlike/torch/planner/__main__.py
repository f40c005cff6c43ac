"""``horovodlikerun -np N [-H ...] --plan MODULE:FUNCTION``: every rank runs this; FUNCTION()
returns (model, sample_input) or (model, sample_input, plan keyword arguments). On several
hosts (with the same number of ranks each) the link inside a host and the link between hosts
are measured apart."""

import importlib
import sys

import horovodlike.torch as hvd
from horovodlike.torch.planner import measure_links


def main(argv):
    if len(argv) != 1 or ":" not in argv[0]:
        raise SystemExit("usage: python -m horovodlike.torch.planner MODULE:FUNCTION")
    module_name, function_name = argv[0].split(":", 1)
    sys.path.insert(0, "")   # a module in the current directory
    built = getattr(importlib.import_module(module_name), function_name)()
    model, sample_input, kwargs = (*built, {})[:3] if len(built) == 2 else built
    hvd.init()
    links, slots = measure_links()
    hosts = [slots] * (hvd.size() // slots) if slots else None
    kwargs = {"link": links["inside"], "inter_host_link": links.get("between"),
              "hosts": hosts, **kwargs}
    hvd.plan(model, sample_input, world_size=hvd.size(), **kwargs)
    hvd.barrier()
    hvd.shutdown()


if __name__ == "__main__":
    main(sys.argv[1:])
