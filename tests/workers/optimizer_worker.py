"""SyncBatchNorm against BatchNorm over the global batch; DistributedOptimizer with groups,
sparse gradients, sparse_as_dense, requires_grad switched on between steps, skip_synchronize
and a process set, each against a single-process replica over the global batch."""

import torch

import horovodlike.torch as hvd
from common import check

hvd.init()
rank, size = hvd.rank(), hvd.size()
torch.set_num_threads(1)
PER_RANK = 4

# ---- SyncBatchNorm: outputs, gradients and running statistics of the global batch
for dims in ((PER_RANK, 3), (PER_RANK, 3, 5, 5)):
    gen = torch.Generator().manual_seed(5)
    x_all = torch.randn(PER_RANK * size, *dims[1:], generator=gen, dtype=torch.float64) * 3 + 1
    c_all = torch.randn(x_all.shape, generator=gen, dtype=torch.float64)
    mine = slice(rank * PER_RANK, (rank + 1) * PER_RANK)
    sync = hvd.SyncBatchNorm(3).double()
    plain = (torch.nn.BatchNorm1d(3) if len(dims) == 2 else torch.nn.BatchNorm2d(3)).double()
    with torch.no_grad():
        for bn in (sync, plain):
            bn.weight.copy_(torch.tensor([1.0, 2.0, 0.5]))
            bn.bias.copy_(torch.tensor([0.0, -1.0, 3.0]))
    for _ in range(2):  # twice, so the running statistics accumulate
        x = x_all[mine].clone().requires_grad_()
        y = sync(x)
        (y * c_all[mine]).sum().backward()
        xa = x_all.clone().requires_grad_()
        ya = plain(xa)
        (ya * c_all).sum().backward()  # the sum of all ranks' losses
    check(torch.allclose(y, ya[mine], atol=1e-10), f"SyncBatchNorm{len(dims)}d output differs")
    check(torch.allclose(x.grad, xa.grad[mine], atol=1e-10), "SyncBatchNorm input grad differs")
    for name in ("weight", "bias"):
        total = hvd.allreduce(getattr(sync, name).grad, op=hvd.Sum, name=f"bn.{name}.{len(dims)}")
        check(torch.allclose(total, getattr(plain, name).grad, atol=1e-10),
              f"SyncBatchNorm {name} grad (summed over ranks) differs")
    check(torch.allclose(sync.running_mean, plain.running_mean, atol=1e-12) and
          torch.allclose(sync.running_var, plain.running_var, atol=1e-12),
          "SyncBatchNorm running statistics differ")
    sync.eval(), plain.eval()
    check(torch.allclose(sync(x_all[mine]), plain(x_all)[mine], atol=1e-10), "eval mode differs")


# ---- DistributedOptimizer variants against a replica
class Net(torch.nn.Module):
    def __init__(self, sparse):
        super().__init__()
        self.embed = torch.nn.Embedding(20, 4, sparse=sparse)
        self.hidden = torch.nn.Linear(4, 8)
        self.frozen = torch.nn.Linear(8, 8)
        self.out = torch.nn.Linear(8, 3)

    def forward(self, ids):
        h = torch.tanh(self.hidden(self.embed(ids).mean(1)))
        return self.out(torch.tanh(self.frozen(h)))


def batch(step, members):
    gen = torch.Generator().manual_seed(1000 + step)
    ids = torch.randint(0, 20, (PER_RANK * len(members), 3), generator=gen)
    labels = torch.randint(0, 3, (PER_RANK * len(members),), generator=gen)
    return ids, labels


def train(label, sparse=False, sparse_as_dense=False, groups=None, unfreeze_at=None,
          clip=False, process_set=hvd.global_process_set):
    members = process_set.ranks
    me = members.index(rank)
    torch.manual_seed(3)
    model = Net(sparse)
    torch.manual_seed(3)
    replica = Net(sparse)
    for m in (model, replica):
        m.frozen.requires_grad_(unfreeze_at is None)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5),
                                   named_parameters=model.named_parameters(),
                                   groups=groups(model) if callable(groups) else groups,
                                   sparse_as_dense=sparse_as_dense, process_set=process_set)
    ref = torch.optim.SGD(replica.parameters(), lr=0.5)
    loss_fn = torch.nn.CrossEntropyLoss()
    for step in range(4):
        if unfreeze_at == step:
            for m in (model, replica):
                m.frozen.requires_grad_(True)
        ids, labels = batch(step, members)
        part = slice(me * PER_RANK, (me + 1) * PER_RANK)
        opt.zero_grad()
        ref.zero_grad()
        loss_fn(model(ids[part]), labels[part]).backward()
        loss_fn(replica(ids), labels).backward()
        if clip:
            opt.synchronize()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
            torch.nn.utils.clip_grad_norm_(replica.parameters(), 0.1)
            with opt.skip_synchronize():
                opt.step()
        else:
            opt.step()
        ref.step()
    for (name, p), q in zip(model.named_parameters(), replica.parameters()):
        check(torch.allclose(p, q, rtol=1e-5, atol=1e-6),
              f"{label}: {name} differs from the replica by {(p - q).abs().max().item()}")


train("dense")
train("sparse gradients gathered", sparse=True)
train("sparse_as_dense", sparse=True, sparse_as_dense=True)
train("two groups", groups=2)
train("explicit groups", groups=lambda m: [[m.hidden.weight, m.hidden.bias],
                                           [m.out.weight, m.out.bias, m.embed.weight]])
train("unfrozen at step 2", unfreeze_at=2)
train("clipped with skip_synchronize", clip=True)
if size >= 3:  # with 2 ranks, [0, 1] is the global set
    pair = hvd.add_process_set([0, 1])
    if pair.included():
        train("process set", process_set=pair)
    hvd.remove_process_set(pair)
print(f"rank {rank}: optimizer OK", flush=True)
