"""The gradients of allgather, broadcast and reducescatter follow Horovod's rules exactly (a model
migrated from Horovod must train the same), checked against NumPy on every rank, globally and
inside a process set. Every rank feeds a different incoming gradient, so an average, a sum and
this rank's own gradient all differ."""

import os

import numpy as np
import torch

import horovodlike.torch as hvd
from common import check

# A set of all ranks but rank 0 (used from 3 ranks on): set-relative offsets and set sizes.
subset = hvd.ProcessSet([1, 2])
hvd.init(process_sets=[subset] if int(os.environ["HOROVOD_SIZE"]) > 2 else [])
rank, size = hvd.rank(), hvd.size()
torch.set_num_threads(1)


def incoming(r, shape):
    """The gradient rank r feeds into backward(): different on every rank."""
    return np.arange(np.prod(shape), dtype=np.float64).reshape(shape) * (r + 1) + r


def run(process_set, ranks, tag):
    me = ranks.index(rank)
    n = len(ranks)

    # allgather: the average over the set of the incoming gradients, at this rank's rows.
    rows = [r % 3 + 1 for r in ranks]
    x = torch.ones(rows[me], 2, dtype=torch.float64, requires_grad=True)
    out = hvd.allgather(x, name=f"{tag}.ag", process_set=process_set)
    out.backward(torch.from_numpy(incoming(rank, (sum(rows), 2))))
    mean = np.mean([incoming(r, (sum(rows), 2)) for r in ranks], axis=0)
    start = sum(rows[:me])
    check(np.allclose(x.grad.numpy(), mean[start:start + rows[me]]),
          f"{tag} allgather gradient {x.grad.tolist()}")

    # grouped allgather: the same rule for each tensor of the group.
    xs = [torch.ones(rows[me], dtype=torch.float64, requires_grad=True) for _ in range(2)]
    outs = hvd.grouped_allgather(xs, name=f"{tag}.gag", process_set=process_set)
    torch.autograd.backward(outs, [torch.from_numpy(incoming(rank, (sum(rows),)) * (k + 1))
                                   for k in range(2)])
    mean = np.mean([incoming(r, (sum(rows),)) for r in ranks], axis=0)
    for k in range(2):
        check(np.allclose(xs[k].grad.numpy(), (k + 1) * mean[start:start + rows[me]]),
              f"{tag} grouped allgather gradient {k}: {xs[k].grad.tolist()}")

    # broadcast: the average over the set on the root, zero on every other rank.
    root = ranks[-1]
    b = torch.full((3,), float(rank), dtype=torch.float64, requires_grad=True)
    out = hvd.broadcast(b, root_rank=root, name=f"{tag}.bc", process_set=process_set)
    out.backward(torch.from_numpy(incoming(rank, (3,))))
    want = np.mean([incoming(r, (3,)) for r in ranks], axis=0) if rank == root else np.zeros(3)
    check(np.allclose(b.grad.numpy(), want), f"{tag} broadcast gradient {b.grad.tolist()}")

    # reducescatter: the incoming gradients gathered back to full size, times n for Sum only.
    for op, factor, name in ((hvd.Sum, n, "sum"), (hvd.Average, 1, "average")):
        z = torch.ones(2 * n, 3, dtype=torch.float64, requires_grad=True)
        out = hvd.reducescatter(z, op=op, name=f"{tag}.rs.{name}", process_set=process_set)
        check(tuple(out.shape) == (2, 3), f"{tag} reducescatter shape {tuple(out.shape)}")
        out.backward(torch.from_numpy(incoming(rank, (2, 3))))
        want = factor * np.concatenate([incoming(r, (2, 3)) for r in ranks])
        check(np.allclose(z.grad.numpy(), want),
              f"{tag} reducescatter {name} gradient {z.grad[:, 0].tolist()}")

    # grouped reducescatter, Sum.
    zs = [torch.ones(2 * n, dtype=torch.float64, requires_grad=True) for _ in range(2)]
    outs = hvd.grouped_reducescatter(zs, op=hvd.Sum, name=f"{tag}.grs", process_set=process_set)
    torch.autograd.backward(outs, [torch.from_numpy(incoming(rank, (2,))) for _ in range(2)])
    want = n * np.concatenate([incoming(r, (2,)) for r in ranks])
    for k in range(2):
        check(np.allclose(zs[k].grad.numpy(), want),
              f"{tag} grouped reducescatter gradient {zs[k].grad.tolist()}")


run(hvd.global_process_set, list(range(size)), "global")
if rank in (1, 2) and size > 2:
    run(subset, [1, 2], "subset")
hvd.barrier()
print(f"rank {rank}: gradient rules OK", flush=True)
