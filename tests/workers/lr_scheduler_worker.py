"""An LR scheduler made before DistributedOptimizer wraps its optimizer: every step still
averages the gradients (the ranks end equal to one process on the whole batch) and the scheduler
sees the optimizer's steps (no "lr_scheduler.step() before optimizer.step()" warning)."""

import warnings

import numpy as np
import torch

import horovodlike.torch as hvd
from common import check


def train(model, optimizer, scheduler, batches, part):
    for x, y in batches:
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x[part]), y[part]).backward()
        optimizer.step()
        scheduler.step()


hvd.init()
rank, size = hvd.rank(), hvd.size()
rng = np.random.default_rng(3)
batches = [(torch.from_numpy(rng.standard_normal((4 * size, 5))),
            torch.from_numpy(rng.standard_normal((4 * size, 1)))) for _ in range(4)]

torch.manual_seed(0)
reference = torch.nn.Linear(5, 1).double()
ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.2, momentum=0.5)
train(reference, ref_optimizer, torch.optim.lr_scheduler.StepLR(ref_optimizer, 1, gamma=0.5),
      batches, slice(None))

torch.manual_seed(0)
model = torch.nn.Linear(5, 1).double()
optimizer = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.5)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.5)  # before the wrapping
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
with warnings.catch_warnings():
    warnings.simplefilter("error")  # the scheduler's warning, had it not seen the steps
    train(model, optimizer, scheduler, batches, slice(rank * 4, rank * 4 + 4))
for (name, mine), theirs in zip(model.state_dict().items(), reference.state_dict().values()):
    check(torch.allclose(mine, theirs, rtol=1e-10, atol=1e-12),
          f"rank {rank}: {name} {mine.flatten()[:3]} != one process's {theirs.flatten()[:3]}")
check(scheduler.get_last_lr() == [0.2 * 0.5 ** 4], f"lr {scheduler.get_last_lr()}")
print(f"rank {rank}: lr scheduler ok", flush=True)
