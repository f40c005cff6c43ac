"""plan() inside a 2-rank job: rank 0's profile and the measured link are used by both ranks,
and the chosen layout comes back as a working ProcessMesh."""

import os

import torch

import horovodlike.torch as hvd
from common import check
from horovodlike.torch.planner.calibration import shared_cores

hvd.init()
rank = hvd.rank()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))
best = hvd.plan(model, torch.randn(8, 16), world_size=2)
check(best.link.bus_bytes_per_s > 0 and best.link.latency_s > 0, f"{best.link}")
# 3 factorisations of 2, the one with dp=2 twice: replicated and sharded (fsdp).
check(len(best.candidates) + len(best.rejected) == 4, "every layout of 2 ranks is listed")
shapes = hvd.allgather_object((best.shape, best.stages))
check(shapes[0] == shapes[1], f"ranks chose differently: {shapes}")
mesh = best.mesh
check(mesh is not None and mesh.shape == best.shape, f"{mesh} for {best.shape}")
total = hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum, name="plan.check",
                      process_set=mesh.process_set("dp"))
check(total.item() == best.shape[1], f"dp set of {total.item()} ranks, expected {best.shape}")
# Both ranks run on this machine: those with rank 0's CPUs share its cores.
masks = hvd.allgather_object(sorted(os.sched_getaffinity(0)))
expected = (len(masks[0]), masks.count(masks[0]))
check(shared_cores() == expected, f"shared_cores() {shared_cores()}, expected {expected}")
print(f"rank {rank}: planner OK", flush=True)
