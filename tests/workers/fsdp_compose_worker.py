"""fully_shard composed with the other parallelisms on a 2-D ProcessMesh of 4 ranks, each
checked against one process training the dense model on the global batch.

Usage: fsdp_compose_worker.py MODE
  pp   pipeline over "pp" (2 stages), each stage's module sharded over "dp" (2 ranks), with
       GPipe and 1F1B, resharding after the forward or not, and interleaved 1F1B with two
       stages per rank; one reduce-scatter per step
  tp   a ColumnParallelLinear/RowParallelLinear pair, then parallelize_module, over "tp", the
       model sharded over "dp"
"""

import sys

import torch

import horovodlike.torch as hvd
from horovodlike.torch.fsdp import full_state_dict, fully_shard
from horovodlike.torch.parallel import (ColumnParallelLinear, ColwiseParallel,
                                        RowParallelLinear, RowwiseParallel, parallelize_module)
from horovodlike.torch.pipelining import (PipelineStage, Schedule1F1B, ScheduleGPipe,
                                          ScheduleInterleaved1F1B)
from common import check

torch.set_default_dtype(torch.float64)
STEPS = 3
BATCH = 16
N_MICROBATCHES = 4
IN, HIDDEN, OUT = 5, 7, 3


def make_optimizer(params):
    return torch.optim.Adam(params, lr=0.02)


def batch(step):
    generator = torch.Generator().manual_seed(500 + step)
    return torch.randn(BATCH, IN, generator=generator), torch.randn(BATCH, OUT, generator=generator)


def my_rows(tensor, dp_index, dp_size):
    return torch.tensor_split(tensor, dp_size)[dp_index]


def reference(model):
    """The dense model trained by one process on the whole batch: its weights after each
    step's update and each step's loss."""
    optimizer = make_optimizer(model.parameters())
    losses = []
    for step in range(STEPS):
        x, y = batch(step)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return model, losses


def close(got, want, what):
    check(torch.allclose(got, want, rtol=1e-5, atol=1e-8),
          f"rank {hvd.rank()}: {what} differs by {(got - want).abs().max().item():.3g}")


# ------------------------------------------------------------------------- pp x fsdp

def pipeline_model(num_stages):
    """num_stages blocks of two Linears each (the last one without a Tanh at its end)."""
    torch.manual_seed(7)
    widths = [IN] + [HIDDEN] * (num_stages - 1) + [OUT]
    blocks = [torch.nn.Sequential(torch.nn.Linear(widths[i], HIDDEN), torch.nn.Tanh(),
                                  torch.nn.Linear(HIDDEN, widths[i + 1]), torch.nn.Tanh())
              for i in range(num_stages)]
    return torch.nn.Sequential(*blocks[:-1], blocks[-1][:3])


def sharded_stage(stage_index, num_stages, dp_set, reshard):
    """A stage: its first Linear wrapped on its own, the rest by the stage's root."""
    part = pipeline_model(num_stages)[stage_index]
    fully_shard(part[0], mesh=dp_set, reshard_after_forward=reshard)
    return fully_shard(part, mesh=dp_set, reshard_after_forward=reshard)


def pp_fsdp(mesh, schedule_class, stages_per_rank, reshard):
    num_stages = 2 * stages_per_rank
    want, want_losses = reference(pipeline_model(num_stages))
    pp_index, dp_index = mesh.coordinate("pp"), mesh.coordinate("dp")
    indices = range(pp_index, num_stages, 2)
    parts = [sharded_stage(i, num_stages, mesh.process_set("dp"), reshard) for i in indices]
    stages = [PipelineStage(part, i, num_stages, process_set=mesh.process_set("pp"))
              for part, i in zip(parts, indices)]
    schedule = schedule_class(stages if stages_per_rank > 1 else stages[0], N_MICROBATCHES,
                              loss_fn=torch.nn.functional.mse_loss)
    optimizer = make_optimizer([p for part in parts for p in part.parameters()])
    for step in range(STEPS):
        x, y = (my_rows(t, dp_index, 2) for t in batch(step))
        optimizer.zero_grad()
        losses = []
        if pp_index == 0:
            schedule.step(x)
        else:
            schedule.step(target=y, losses=losses)
            # The replicas' mean loss is the global batch's (equal micro-batches).
            mean = hvd.allreduce(torch.stack(losses).mean(), op=hvd.Average,
                                 process_set=mesh.process_set("dp"))
            close(mean, torch.tensor(want_losses[step]), f"loss of step {step}")
        optimizer.step()
    for part, i in zip(parts, indices):
        what = f"{schedule_class.__name__} reshard={reshard} stage {i}"
        state = full_state_dict(part)
        for name, tensor in want[i].state_dict().items():
            close(state[name], tensor, f"{what}: {name}")
        # The micro-batches' gradients add up locally: one reduce-scatter per group and step.
        for module in (part, part[0]):
            sent = module._fsdp_group._scatters
            check(sent == STEPS, f"{what}: {sent} reduce-scatters in {STEPS} steps")


# ------------------------------------------------------------------------- tp x fsdp

def dense_model():
    torch.manual_seed(11)
    return torch.nn.Sequential(torch.nn.Linear(IN, 2 * HIDDEN + 2), torch.nn.Tanh(),
                               torch.nn.Linear(2 * HIDDEN + 2, IN), torch.nn.Tanh(),
                               torch.nn.Linear(IN, OUT))


def layer_pair(mesh):
    """The dense model with its first pair of Linears split over "tp" by hand (Megatron's
    column then row), the pair sharded over "dp" and the rest by the root; for each entry of
    its state dict, the dense one and the dimension split over tp (None: whole)."""
    tp_set, dp_set = mesh.process_set("tp"), mesh.process_set("dp")
    dense = dense_model()
    pair = torch.nn.Sequential(ColumnParallelLinear.from_dense(dense[0], process_set=tp_set),
                               torch.nn.Tanh(),
                               RowParallelLinear.from_dense(dense[2], process_set=tp_set))
    model = torch.nn.Sequential(pair, torch.nn.Tanh(), dense[4])
    fully_shard(pair, mesh=dp_set)
    return fully_shard(model, mesh=dp_set), {
        "0.0.weight": ("0.weight", 0), "0.0.bias": ("0.bias", 0),
        "0.2.weight": ("2.weight", 1), "0.2.bias": ("2.bias", None),
        "2.weight": ("4.weight", None), "2.bias": ("4.bias", None)}


def parallelized(mesh):
    """The dense model split over "tp" by parallelize_module, each split layer then the root
    sharded over "dp"."""
    model = parallelize_module(dense_model(), mesh, {"0": ColwiseParallel(),
                                                     "2": RowwiseParallel()}, mesh_dim="tp")
    for index in (0, 2):
        fully_shard(model[index], mesh=mesh.process_set("dp"))
    splits = {"0.weight": 0, "0.bias": 0, "2.weight": 1}
    names = [name for name, _ in dense_model().named_parameters()]
    return fully_shard(model, mesh=mesh.process_set("dp")), {
        name: (name, splits.get(name)) for name in names}


def gathered(tensor, tp_set, dim):
    """The whole of a tensor split over tp along ``dim``."""
    return hvd.allgather(tensor.transpose(0, dim).contiguous(),
                         process_set=tp_set).transpose(0, dim)


def tp_fsdp(mesh, build):
    want, _ = reference(dense_model())
    model, names = build(mesh)
    optimizer = make_optimizer(model.parameters())
    for step in range(STEPS):
        x, y = (my_rows(t, mesh.coordinate("dp"), 2) for t in batch(step))
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    state = full_state_dict(model)
    reference_state = want.state_dict()
    check(set(state) == set(names), f"state dict keys {sorted(state)}")
    for name, (dense_name, dim) in names.items():
        got = state[name] if dim is None else gathered(state[name], mesh.process_set("tp"), dim)
        close(got, reference_state[dense_name], f"tp x fsdp ({build.__name__}): {name}")


hvd.init()
mode = sys.argv[1]
if mode == "pp":
    mesh = hvd.ProcessMesh((2, 2), ("pp", "dp"))
    for schedule_class, stages_per_rank, reshard in [
            (ScheduleGPipe, 1, True), (Schedule1F1B, 1, True), (Schedule1F1B, 1, False),
            (ScheduleInterleaved1F1B, 2, True)]:
        pp_fsdp(mesh, schedule_class, stages_per_rank, reshard)
    print(f"rank {hvd.rank()}: pp x fsdp OK", flush=True)
elif mode == "tp":
    mesh = hvd.ProcessMesh((2, 2), ("dp", "tp"))
    for build in (layer_pair, parallelized):
        tp_fsdp(mesh, build)
    print(f"rank {hvd.rank()}: tp x fsdp OK", flush=True)
else:
    raise SystemExit(f"unknown mode {mode!r}")
hvd.barrier()  # a rank that shuts down ends the job: wait for the other stage's checks
