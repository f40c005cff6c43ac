"""``horovodlikerun -np N [-H ...] --plan MODULE:FUNCTION``: every rank runs this; FUNCTION()
returns (model, sample_input) or (model, sample_input, plan keyword arguments). The ranks
calibrate (hvd.calibrate: the layers on every layout's input sizes, the link inside a host and,
on several hosts of equal slots, the link between hosts), then plan."""

import importlib
import sys

import horovodlike.torch as hvd


def main(argv):
    if len(argv) != 1 or ":" not in argv[0]:
        raise SystemExit("usage: python -m horovodlike.torch.planner MODULE:FUNCTION")
    module_name, function_name = argv[0].split(":", 1)
    sys.path.insert(0, "")   # a module in the current directory
    built = getattr(importlib.import_module(module_name), function_name)()
    model, sample_input, kwargs = (*built, {})[:3] if len(built) == 2 else built
    hvd.init()
    kwargs = {"calibration": hvd.calibrate(model, sample_input), **kwargs}
    hvd.plan(model, sample_input, world_size=hvd.size(), **kwargs)
    hvd.barrier()
    hvd.shutdown()


if __name__ == "__main__":
    main(sys.argv[1:])
