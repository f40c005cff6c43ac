"""Trains a model too large for one rank's memory budget by sharding it with fully_shard.

    horovodlikerun -np 4 python examples/pytorch_fsdp.py [--budget-mib 2.5] [--steps 12]
                   [--save full.pt]

Each rank may hold at most --budget-mib of tensors (parameters, gradients, Adam's moments and
the parameters gathered for the module computing). The whole model with its gradients and
Adam state needs more than that, so one rank could not train it alone; sharded over the job,
each rank keeps 1/N of it plus one block gathered at a time. Every rank checks its own holding
at each block's forward and backward and after each step, and stops with an error as soon as
it goes over. Rank 0 prints the loss, which falls, and writes the trained full state dict.
"""

import argparse

import torch
import torch.nn.functional as F

import horovodlike.torch as hvd
from horovodlike.torch.fsdp import full_state_dict, fully_shard

MIB = 1 << 20


def build_model(width=256, blocks=8):
    """An MLP: ``blocks`` wrapped units of Linear, Tanh; seed 0 on every rank."""
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(width, width),
                                                     torch.nn.Tanh())
                                 for _ in range(blocks)])


def batch(size=64, width=256):
    """The global batch the model fits, the same on every rank: inputs and a fixed random
    teacher's outputs to regress on."""
    generator = torch.Generator().manual_seed(1)
    teacher = torch.randn(width, width, generator=generator) / width ** 0.5
    x = torch.randn(size, width, generator=generator)
    return x, torch.tanh(x @ teacher)


def footprint(model):
    """Bytes to train ``model`` unsharded with Adam: parameters, gradients, two moments."""
    return 4 * sum(p.numel() * p.element_size() for p in model.parameters())


class Budget:
    """Adds up the storages this rank's model and optimizer reference, and raises when they
    pass the budget."""

    def __init__(self, model, optimizer, limit):
        self.model, self.optimizer, self.limit, self.peak = model, optimizer, limit, 0
        for block in model:
            # Inside the block, where its parameters are gathered: after its Linear's forward,
            # and as the backward reaches it.
            block[0].register_forward_hook(lambda *_: self.check("forward"))
            block[1].register_full_backward_pre_hook(lambda *_: self.check("backward"))

    def _storages(self):
        for module in self.model.modules():
            for value in list(module._parameters.values()) + list(vars(module).values()):
                if torch.is_tensor(value):
                    base = value if value._base is None else value._base
                    yield base
                    if base.is_leaf and base.grad is not None:
                        yield base.grad
        for state in self.optimizer.state.values():
            yield from (v for v in state.values() if torch.is_tensor(v))

    def check(self, where):
        sizes = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                 for t in self._storages()}
        held = sum(sizes.values())
        self.peak = max(self.peak, held)
        if held > self.limit:
            raise RuntimeError(f"rank {hvd.rank()} holds {held / MIB:.2f} MiB at {where}, over "
                               f"its budget of {self.limit / MIB:.2f} MiB")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-mib", type=float, default=2.5,
                        help="the most each rank may hold, in MiB")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--save", help="rank 0 writes the trained full state dict here")
    args = parser.parse_args()
    hvd.init()
    model, limit = build_model(), args.budget_mib * MIB
    whole = footprint(model)
    if whole <= limit:
        raise SystemExit(f"the whole model ({whole / MIB:.2f} MiB) fits in --budget-mib "
                         f"{args.budget_mib}: give a smaller budget to need sharding")
    x, y = batch()
    share = x.shape[0] // hvd.size()
    if share * hvd.size() != x.shape[0]:
        raise SystemExit(f"the batch of {x.shape[0]} does not split over {hvd.size()} ranks")
    for block in model:
        fully_shard(block)
    fully_shard(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    budget = Budget(model, optimizer, limit)
    mine = slice(hvd.rank() * share, (hvd.rank() + 1) * share)
    if hvd.rank() == 0:
        print(f"whole model with Adam: {whole / MIB:.2f} MiB; budget per rank "
              f"{limit / MIB:.2f} MiB", flush=True)
    for step in range(args.steps):
        optimizer.zero_grad()
        loss = F.mse_loss(model(x[mine]), y[mine])
        loss.backward()
        optimizer.step()
        budget.check("step")
        mean = hvd.allreduce(loss.detach(), op=hvd.Average, name=f"loss.{step}").item()
        if hvd.rank() == 0:
            print(f"step {step}: loss {mean:.6f}", flush=True)
    print(f"rank {hvd.rank()}: peak held {budget.peak} bytes, budget {int(limit)}", flush=True)
    state = full_state_dict(model, rank0_only=True)
    if hvd.rank() == 0 and args.save:
        torch.save(state, args.save)
    hvd.shutdown()


if __name__ == "__main__":
    main()
