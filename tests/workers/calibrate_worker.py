"""calibrate() inside a job: rank 0 profiles alone and every rank gets its figures, the
optimizer's step per layer timed with the model left as it was, the machine's sharing
measured (a synchronisation's cost only with more ranks than cores, a tensor parallel
collective's with an even number of them too), the gradient exchange's cost beyond the link,
a pipeline action's own cost (with an even number of ranks);
the result plans; and a model rank 0 cannot profile fails every rank, none left waiting."""

import torch

import horovodlike.torch as hvd
from common import check
from horovodlike.torch.planner.calibration import shared_cores

hvd.init()
rank, size = hvd.rank(), hvd.size()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))
sample = torch.randn(12, 16)
before = [p.detach().clone() for p in model.parameters()]
calibration = hvd.calibrate(model, sample)
check(all(torch.equal(a, p) for a, p in zip(before, model.parameters())),
      "the optimizer steps timed left the parameters as they were")
check(all(p.grad is None for p in model.parameters()), "no gradients left behind")
updates = [layer.update_s for layer in calibration.layers]
check(updates[0] > 0 and updates[2] > 0 and updates[1] == 0.0,
      f"the Linears' steps timed, the ReLU has none: {updates}")
conditions = calibration.conditions
check(conditions["profiled_busy"] == 1, f"profiled by one rank: {conditions}")
cores, sharing = shared_cores()
check(conditions["cores"] == cores and conditions["ranks_sharing_cores"] == sharing,
      f"{conditions} against {(cores, sharing)}")
check(conditions["slowdown"] >= 1.0, f"slowdown {conditions['slowdown']}")
check(conditions["wake_s"] >= 0.0, f"wake_s {conditions['wake_s']}")
if sharing <= cores:
    check(conditions["wake_s"] == 0.0, f"a core per rank, yet wake_s {conditions['wake_s']}")
collective = conditions["collective_wake_s"]
if sharing > cores and size % 2 == 0:
    check(collective is not None and collective >= 0.0, f"collective_wake_s {collective}")
else:
    check(collective is None, f"nothing to measure it on, yet collective_wake_s {collective}")
send = calibration.links.get("send_inside")   # a point-to-point message, rank 0 to 1
check(size < 2 or (send is not None and send.latency_s >= 0 and send.bus_bytes_per_s > 0
                   and len(send.samples) == 3), f"send_inside {send}")
check(conditions["exchange_s_per_byte"] >= 0.0, f"{conditions['exchange_s_per_byte']}")
action = conditions["pipeline_action_s"]
check(action >= 0.0 if size % 2 == 0 else action == 0.0, f"pipeline_action_s {action}")
every = hvd.allgather_object((calibration.layers, conditions["slowdown"],
                              conditions["wake_s"], collective,
                              conditions["exchange_s_per_byte"], action), name="calibrate.same")
check(all(e == every[0] for e in every), "every rank has rank 0's figures")
check(all(p.forward_s > 0 for p in calibration.layers), f"{calibration.layers}")
best = hvd.plan(model, sample, world_size=size, calibration=calibration, verbose=False)
check(best.best.step_s > 0, f"{best.best}")

# A sample of the wrong width: rank 0's profiling fails; the others must not wait for it.
try:
    hvd.calibrate(model, torch.randn(12, 5))
except (RuntimeError, ValueError) as error:
    text = str(error)
    if rank == 0:
        check("mat1 and mat2" in text or "shape" in text, f"rank 0: {text}")
    else:
        check("rank 0 could not profile the model" in text and "RuntimeError" in text,
              f"rank {rank}: {text}")
else:
    check(False, "calibrate() of a model that cannot run raised nothing")
# And a model that is not sequential fails every rank alike, before any collective.
try:
    hvd.calibrate(torch.nn.Linear(16, 16), sample)
except ValueError as error:
    check("torch.nn.Sequential" in str(error), str(error))
else:
    check(False, "calibrate() of a non-sequential model raised nothing")
hvd.barrier()
print(f"rank {rank}: calibrate OK", flush=True)
