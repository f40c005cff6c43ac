"""Autograd of the collectives, DistributedOptimizer against a single-process replica over the
global batch, and broadcast of parameters and optimizer state."""

import contextlib
import copy

import numpy as np
import torch

import horovodlike.torch as hvd
from common import check

hvd.init()
rank, size = hvd.rank(), hvd.size()
torch.set_num_threads(1)

# ---- gradients of the collectives, against their definition (d of the sum of all ranks' losses)
x = torch.arange(6, dtype=torch.float64, requires_grad=True)
y = hvd.allreduce(x * (rank + 1), op=hvd.Sum, name="ag.sum")
(y * 2).sum().backward()
# d/dx of sum_k 2 * sum(allreduce) = each rank's output depends on every x_r*(r+1)
check(torch.allclose(x.grad, torch.full((6,), 2.0 * size * (rank + 1), dtype=torch.float64)),
      f"allreduce Sum gradient wrong: {x.grad}")
x.grad = None
y = hvd.allreduce(x, op=hvd.Average, name="ag.avg")
y.sum().backward()
check(torch.allclose(x.grad, torch.ones(6, dtype=torch.float64)),
      f"allreduce Average gradient wrong: {x.grad}")

# allgather and broadcast follow Horovod's rules: the gradient is the average over ranks of the
# incoming gradients (rows of this rank for allgather; on the root only for broadcast). Each
# rank weighs its loss by rank + 1, so an average differs from a sum.
mean_weight = sum(r + 1 for r in range(size)) / size
rows = rank + 1
g = torch.ones(rows, 2, dtype=torch.float64, requires_grad=True)
gathered = hvd.allgather(g, name="ag.gather")
total = sum(r + 1 for r in range(size))
weights = torch.arange(total * 2, dtype=torch.float64).reshape(total, 2)
(gathered * weights * (rank + 1)).sum().backward()
start = sum(r + 1 for r in range(rank))
check(torch.allclose(g.grad, mean_weight * weights[start:start + rows]),
      f"allgather gradient wrong: {g.grad}")

b = torch.full((3,), float(rank), dtype=torch.float64, requires_grad=True)
out = hvd.broadcast(b, root_rank=size - 1, name="ag.bcast")
check(torch.all(out == size - 1).item(), "broadcast forward wrong")
(out * (rank + 1)).sum().backward()
want = mean_weight if rank == size - 1 else 0.0
check(torch.allclose(b.grad, torch.full((3,), want, dtype=torch.float64)),
      f"broadcast gradient wrong: {b.grad}")


# ---- DistributedOptimizer equals one process training on the global batch
def make_model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def global_batch(step, per_rank):
    gen = torch.Generator().manual_seed(100 + step)
    xs = torch.randn(per_rank * size, 8, generator=gen)
    ys = torch.randint(0, 3, (per_rank * size,), generator=gen)
    return xs, ys


def run(compression, passes, predivide, optimizer_cls, in_no_sync=False, **opt_kwargs):
    """`passes` backward passes per step: counted by backward_passes_per_step, or (in_no_sync)
    all but the last inside optimizer.no_sync() with the default backward_passes_per_step."""
    per_rank, steps = 4, 5
    model = make_model(seed=7 + rank)  # different on purpose; broadcast fixes it
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    reference = make_model(seed=7)
    for p, q in zip(model.parameters(), reference.parameters()):
        check(torch.equal(p, q), "broadcast_parameters did not give rank 0's weights")
    opt = hvd.DistributedOptimizer(optimizer_cls(model.parameters(), **opt_kwargs),
                                   named_parameters=model.named_parameters(),
                                   compression=compression,
                                   backward_passes_per_step=1 if in_no_sync else passes,
                                   gradient_predivide_factor=predivide)
    ref_opt = optimizer_cls(reference.parameters(), **opt_kwargs)
    loss_fn = torch.nn.CrossEntropyLoss()
    for step in range(steps):
        opt.zero_grad()
        ref_opt.zero_grad()
        for micro in range(passes):
            xs, ys = global_batch(step * passes + micro, per_rank)
            mine = slice(rank * per_rank, (rank + 1) * per_rank)
            deferred = in_no_sync and micro < passes - 1
            with opt.no_sync() if deferred else contextlib.nullcontext():
                loss_fn(model(xs[mine]), ys[mine]).backward()
            # The replica sees the whole global batch; its mean loss matches the average of the
            # ranks' means because every rank has the same number of samples.
            loss_fn(reference(xs), ys).backward()
        opt.step()
        ref_opt.step()
    return model, reference


tol = dict(rtol=1e-5, atol=1e-6)
for label, kwargs, t in [
    ("sgd", dict(compression=hvd.Compression.none, passes=1, predivide=1.0,
                 optimizer_cls=torch.optim.SGD, lr=0.1, momentum=0.9), tol),
    ("adam+2passes+predivide", dict(compression=hvd.Compression.none, passes=2, predivide=2.0,
                                    optimizer_cls=torch.optim.Adam, lr=0.01), tol),
    ("adam+3passes+no_sync", dict(compression=hvd.Compression.none, passes=3, predivide=1.0,
                                  optimizer_cls=torch.optim.Adam, in_no_sync=True, lr=0.01),
     tol),
    ("fp16", dict(compression=hvd.Compression.fp16, passes=1, predivide=1.0,
                  optimizer_cls=torch.optim.SGD, lr=0.1), dict(rtol=1e-2, atol=1e-3)),
]:
    model, reference = run(**kwargs)
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        check(torch.allclose(p, q, **t),
              f"{label}: parameter {name} differs from the single-process run by "
              f"{(p - q).abs().max().item()}")
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    everyone = hvd.allgather(flat.unsqueeze(0), name=f"{label}.weights")
    check(all(torch.equal(everyone[0], everyone[r]) for r in range(size)),
          f"{label}: ranks ended with different weights")

# ---- a parameter that took no part in a backward pass does not stall the others
model = torch.nn.ModuleDict({"used": torch.nn.Linear(3, 3), "unused": torch.nn.Linear(3, 3)})
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                               named_parameters=model.named_parameters())
start = {k: v.detach().clone() for k, v in model.state_dict().items()}
branch = "used" if rank % 2 == 0 else "unused"
model[branch](torch.ones(2, 3) * (rank + 1)).sum().backward()
opt.step()
flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
everyone = hvd.allgather(flat.unsqueeze(0), name="branches.weights")
check(all(torch.equal(everyone[0], everyone[r]) for r in range(size)),
      "ranks diverged when they used different branches")
# Each branch's gradient is the average over all ranks, those that skipped it adding zero: the
# sum over a batch of 2 rows of (r + 1) is 2 (r + 1) for every weight and 2 for every bias.
for name, ranks in (("used", range(0, size, 2)), ("unused", range(1, size, 2))):
    weight_grad = sum(2.0 * (r + 1) for r in ranks) / size
    bias_grad = 2.0 * len(ranks) / size
    check(torch.allclose(model[name].weight, start[f"{name}.weight"] - 0.1 * weight_grad) and
          torch.allclose(model[name].bias, start[f"{name}.bias"] - 0.1 * bias_grad),
          f"branch {name}: the update is not the average with zeros from the other ranks")

# ---- named_parameters errors
lin = torch.nn.Linear(2, 2)
for bad, fragment in [([("w", lin.weight), ("w", lin.bias)], "duplicate"),
                      ([("w", lin.weight)], "not in it")]:
    try:
        hvd.DistributedOptimizer(torch.optim.SGD(lin.parameters(), lr=0.1), named_parameters=bad)
        raise AssertionError("bad named_parameters accepted")
    except ValueError as e:
        check(fragment in str(e), f"unclear error: {e}")

# ---- broadcast_optimizer_state: different states become rank 0's
net = torch.nn.Linear(4, 2)
hvd.broadcast_parameters(net.state_dict(), root_rank=0)
adam = torch.optim.Adam(net.parameters(), lr=0.01 * (rank + 1))
for _ in range(rank + 1):  # a different number of steps and lr per rank
    net(torch.ones(1, 4) * (rank + 1)).sum().backward()
    adam.step()
hvd.broadcast_optimizer_state(adam, root_rank=0)
state = adam.state_dict()
root_state = hvd.broadcast_object(state, root_rank=0, name="check.state")
check(state["param_groups"][0]["lr"] == 0.01, "learning rate not broadcast")
for key, value in state["state"].items():
    for field in ("exp_avg", "exp_avg_sq", "step"):
        check(torch.equal(torch.as_tensor(value[field]),
                          torch.as_tensor(root_state["state"][key][field])),
              f"optimizer state {key}.{field} differs from rank 0's")

# How many allreduces went by host (HOROVOD_HIERARCHICAL_ALLREDUCE), for tests/test_hierarchical.py.
by_host = hvd.mpi_ops._core.stats()["hierarchical_allreduces"]
print(f"rank {rank}: hierarchical_allreduces={by_host}; training OK", flush=True)
