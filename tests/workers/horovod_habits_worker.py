"""Habits of Horovod's torch API that migrated code relies on: sparse handles that are callable,
duplicate names raising while in flight, reducescatter refusing Adasum, the optimizer's
parameter names, the warning for step() after synchronize(), optimizer state with parameters
that have no gradient, sparse gradients through DistributedOptimizer, and collectives other
than allreduce started after another rank joined; init(process_sets=...) refusing duplicates."""

import time
import warnings

import numpy as np
import torch

import horovodlike.torch as hvd
from common import check, raises

hvd.init()
rank, size = hvd.rank(), hvd.size()
torch.set_num_threads(1)


# init(process_sets=...) with a set given twice (in another order) raises before registering
# any; the runtime stays up and init() with a corrected list registers them, numbered in order.
ids = hvd.mpi_ops._basics._get_process_set_ids_and_ranks  # where Horovod's tests find it
raises(ValueError, lambda: hvd.init(process_sets=[hvd.ProcessSet([0]), [1, 0], [0]]),
       "process sets 0 and 2", "[0]")
check(ids() == {0: list(range(size))}, f"a set stayed registered: {ids()}")
first_only, second_only = hvd.ProcessSet([0]), hvd.ProcessSet([1])
hvd.init(process_sets=[first_only, second_only])
check(ids() == {0: list(range(size)), 1: [0], 2: [1]} and second_only.process_set_id == 2,
      f"process sets after a corrected init(): {ids()}")

# sparse_allreduce_async: synchronize(handle) and handle() both give the average, as a
# sparse tensor equal to the allreduce of the dense tensors.
dense = [np.where(np.arange(20).reshape(5, 4) % (r + 2) == 0, r + 1.0, 0.0) for r in range(size)]
sparse = torch.from_numpy(dense[rank]).to_sparse()
first = hvd.sparse_allreduce_async(sparse, name="sp.a", op=hvd.Average)
second = hvd.sparse_allreduce_async(sparse, name="sp.b", op=hvd.Sum)
check(np.allclose(first().to_dense().numpy(), np.mean(dense, axis=0)), "sparse handle()")
check(np.allclose(hvd.synchronize(second).to_dense().numpy(), np.sum(dense, axis=0)),
      "sparse synchronize(handle)")

# A second collective under a name still in flight raises at once, on the rank that made it,
# for every kind of collective; once synchronized the name is free again.
t = torch.ones(4, 3)
for kind, start in (("allreduce", lambda: hvd.allreduce_async(t, name="dup.allreduce")),
                    ("allgather", lambda: hvd.allgather_async(t, name="dup.allgather")),
                    ("broadcast", lambda: hvd.broadcast_async(t, 0, name="dup.broadcast")),
                    ("reducescatter", lambda: hvd.reducescatter_async(t, name="dup.rs"))):
    handle = start()
    raises(ValueError, start, "already in flight")
    hvd.synchronize(handle)
    hvd.synchronize(start())


def wait_done(handle):
    while not hvd.poll(handle):
        time.sleep(0.001)


# Done but not synchronized, with no other wait since: still in flight ("submit twice in a row"
# stays an error however fast the first one ran).
quick = hvd.allreduce_async(t, name="dup.quick")
wait_done(quick)
raises(ValueError, lambda: hvd.allreduce_async(t, name="dup.quick"), "already in flight")
hvd.synchronize(quick)
# Horovod frees a name once its operation has run, and code written for it drops handles it
# never synchronizes and reuses their names: done, and with a wait for another handle since (a
# barrier), the name is free again (in place on a plain tensor, out of place, asynchronous),
# and the dropped handle still gives its result.
dropped = hvd.allreduce_async(torch.full((3,), rank + 1.0), name="dup.dropped", op=hvd.Sum)
hvd.barrier()
wait_done(dropped)
again = torch.full((3,), 2.0)
hvd.allreduce_(again, name="dup.dropped", op=hvd.Sum)
check(again.tolist() == [2.0 * size] * 3, f"name reused after a dropped handle: {again}")
dropped_again = hvd.allreduce_async(torch.ones(3), name="dup.dropped", op=hvd.Sum)
check(hvd.allreduce(torch.ones(3), name="dup.other", op=hvd.Sum).tolist() == [size] * 3,
      "an allreduce beside a reused name")
wait_done(dropped_again)
check(hvd.allreduce(torch.ones(3), name="dup.dropped", op=hvd.Max).tolist() == [1.0] * 3,
      "an out-of-place allreduce under a name freed after a wait")
check(hvd.synchronize(dropped).tolist() == [size * (size + 1) / 2] * 3,
      "the dropped handle's result")
check(hvd.synchronize(dropped_again).tolist() == [float(size)] * 3, "the second dropped handle")

# reducescatter with Adasum is an error (a RuntimeError, as in Horovod), raised before sending.
raises(RuntimeError, lambda: hvd.reducescatter(torch.ones(2 * size), op=hvd.Adasum), "Adasum")

# Without named_parameters every parameter still gets a name of its own, the same on all ranks.
model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
opt = hvd.DistributedOptimizer(torch.optim.SGD(
    [{"params": model[0].parameters()}, {"params": model[1].parameters()}], lr=0.1))
names = opt._parameter_names
check(len(names) == 4 and len(set(names.values())) == 4, f"parameter names {names}")
everyone = hvd.allgather_object(sorted(names.values()))
check(all(n == everyone[0] for n in everyone), f"names differ across ranks: {everyone}")

# step() after synchronize() without skip_synchronize() warns once; inside it, no warning.
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
for use_skip in (False, True):
    opt.zero_grad()
    model(torch.ones(3, 4) * (rank + 1)).sum().backward()
    opt.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if use_skip:
            with opt.skip_synchronize():
                opt.step()
        else:
            opt.step()
    texts = [str(w.message) for w in caught]
    if size > 1 and not use_skip:
        check(len(texts) == 1 and "without optimizer.skip_synchronize()" in texts[0],
              f"warnings {texts}")
    else:
        check(texts == [], f"unexpected warnings {texts}")

# Optimizer state broadcast with a parameter that never gets a gradient (an integer index).
idx = torch.nn.Parameter(torch.tensor([1, 3], dtype=torch.int32), requires_grad=False)
weight = torch.nn.Parameter(torch.arange(4, dtype=torch.float32) + rank)
opt = hvd.DistributedOptimizer(torch.optim.SGD([idx, weight], lr=0.1, momentum=0.9),
                               named_parameters=[("idx", idx), ("weight", weight)])
hvd.broadcast_parameters({"idx": idx, "weight": weight}, root_rank=0)
hvd.broadcast_optimizer_state(opt, root_rank=0)
check(idx.grad is None, "a parameter without gradient got one")
check(torch.equal(weight.detach(), torch.arange(4, dtype=torch.float32)), "weights not broadcast")

# Sparse embedding gradients, gathered or densified, give the average of the ranks' gradients.
for sparse_as_dense in (False, True):
    torch.manual_seed(0)
    embedding = torch.nn.Embedding(6, 2, sparse=True)
    start = embedding.weight.detach().clone()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(embedding.parameters(), lr=1.0),
                                   sparse_as_dense=sparse_as_dense)
    rows = [torch.tensor([r % 6, (r + 2) % 6, 5]) for r in range(size)]
    embedding(rows[rank]).sum().backward()
    opt.step()
    check(embedding.weight.grad.is_sparse, "the reduced gradient is no longer sparse")
    counts = np.zeros(6)
    for r in range(size):
        np.add.at(counts, rows[r].numpy(), 1.0)
    want = start.numpy() - (counts / size)[:, None]
    check(np.allclose(embedding.weight.detach().numpy(), want),
          f"sparse_as_dense={sparse_as_dense}: {embedding.weight.detach().tolist()}")
    # SparseAdam takes only sparse gradients: it must work either way.
    other = torch.nn.Embedding(6, 2, sparse=True)
    adam = hvd.DistributedOptimizer(torch.optim.SparseAdam(list(other.parameters())),
                                    sparse_as_dense=sparse_as_dense)
    other(rows[rank]).sum().backward()
    adam.step()

# An allgather or broadcast started after another rank joined fails with a RuntimeError on the
# ranks that started it; the joined rank goes on, and both then finish the join together.
for kind in ("allgather", "broadcast"):
    if rank == 0:
        last = hvd.join()
    else:
        try:
            if kind == "allgather":
                hvd.allgather(torch.ones(2, 2), name=f"after.join.{kind}")
            else:
                hvd.broadcast(torch.ones(2, 2), root_rank=rank, name=f"after.join.{kind}")
            raise AssertionError(f"{kind} after a join did not fail")
        except RuntimeError as e:
            check("join" in str(e), f"unclear error: {e}")
        last = hvd.join()
    everyone = hvd.allgather_object(last)
    check(everyone == [everyone[0]] * size and everyone[0] != 0, f"join returned {everyone}")

print(f"rank {rank}: horovod habits OK", flush=True)
