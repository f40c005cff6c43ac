"""alltoall, reducescatter, grouped ops, process sets and join, against NumPy on every rank,
with their gradients and their errors. Run with HOROVOD_DYNAMIC_PROCESS_SETS=1."""

import time

import numpy as np
import torch

import horovodlike.torch as hvd
from common import TORCH_DTYPES, as_float64, check, expected_reduce, rank_input, to_torch

hvd.init()
rank, size = hvd.rank(), hvd.size()
SEED = 99


def expect(exc, fn, *fragments):
    try:
        fn()
    except exc as e:
        for fragment in fragments:
            check(fragment in str(e), f"{exc.__name__} lacks {fragment!r}: {e}")
        return str(e)
    raise AssertionError(f"expected {exc.__name__} {fragments}")


# Process sets: one of every size from 1 to all ranks, plus the global set.
sets = {}
for k in range(1, size + 1):
    ranks = list(range(size - k, size))  # the last k ranks
    sets[k] = hvd.global_process_set if k == size else hvd.add_process_set(ranks)
    check(sets[k].ranks == ranks, f"set ranks {sets[k].ranks}")


def run_on(process_set):
    """Every collective on `process_set`, against NumPy computed from every member's input."""
    members = process_set.ranks
    n = len(members)
    me = members.index(rank)
    tag = f"ps{process_set.process_set_id}"
    for dtype in TORCH_DTYPES:
        # alltoall with uneven splits: member i sends (i + j) % 3 rows to member j.
        def splits_of(i):
            return [(i + j) % 3 for j in range(n)]
        inputs = [rank_input(dtype, sum(splits_of(i)) * 2, members[i], SEED, "Sum")
                  .reshape(-1, 2) for i in range(n)]
        out, received = hvd.alltoall(to_torch(inputs[me], dtype), splits=splits_of(me),
                                     name=f"{tag}.a2a.{dtype}", process_set=process_set)
        pieces = []
        for i in range(n):
            start = sum(splits_of(i)[:me])
            pieces.append(inputs[i][start:start + splits_of(i)[me]])
        check(np.array_equal(as_float64(out), np.concatenate(pieces)),
              f"{tag} alltoall {dtype} wrong")
        check(received.tolist() == [splits_of(i)[me] for i in range(n)],
              f"{tag} alltoall received splits {received.tolist()}")
        # alltoall without splits: equal parts.
        even = [rank_input(dtype, n * 3, members[i], SEED, "Max").reshape(n * 3, 1)
                for i in range(n)]
        out = hvd.alltoall(to_torch(even[me], dtype), name=f"{tag}.a2a_even.{dtype}",
                           process_set=process_set)
        want = np.concatenate([even[i][me * 3:(me + 1) * 3] for i in range(n)])
        check(np.array_equal(as_float64(out), want), f"{tag} even alltoall {dtype} wrong")
        # reducescatter: rows 2n+1 do not divide evenly.
        if dtype == "bool":
            continue
        for op_name, op in (("Sum", hvd.Sum), ("Average", hvd.Average)):
            if op_name == "Average" and dtype not in ("float32", "float64"):
                continue
            rows = 2 * n + 1
            values = [rank_input(dtype, rows * 3, members[i], SEED, "Sum").reshape(rows, 3)
                      for i in range(n)]
            total = expected_reduce([v.reshape(-1) for v in values], op_name, dtype, n)
            total = total.reshape(rows, 3)
            counts = [rows // n + (i < rows % n) for i in range(n)]
            start = sum(counts[:me])
            out = hvd.reducescatter(to_torch(values[me], dtype), op=op,
                                    name=f"{tag}.rs.{op_name}.{dtype}", process_set=process_set)
            check(np.allclose(as_float64(out), total[start:start + counts[me]], rtol=1e-6),
                  f"{tag} reducescatter {op_name} {dtype} wrong")
    # Scaled reducescatter.
    x = torch.arange(n * 4, dtype=torch.float64).reshape(n * 2, 2) + rank
    out = hvd.reducescatter(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0,
                            name=f"{tag}.rs.scaled", process_set=process_set)
    full = sum(np.arange(n * 4, dtype=np.float64).reshape(n * 2, 2) + r for r in members)
    check(np.allclose(out.numpy(), full[me * 2:(me + 1) * 2] * 1.5), f"{tag} scaled rs wrong")
    # Allreduce, allgather, broadcast (root given as a global rank) on the set.
    out = hvd.allreduce(torch.tensor([float(rank)]), op=hvd.Sum, name=f"{tag}.ar",
                        process_set=process_set)
    check(out.item() == float(sum(members)), f"{tag} allreduce {out.item()}")
    avg = hvd.allreduce(torch.tensor([float(rank)]), name=f"{tag}.avg", process_set=process_set)
    check(abs(avg.item() - sum(members) / n) < 1e-6, f"{tag} average over the set is wrong")
    out = hvd.allgather(torch.tensor([[rank]]), name=f"{tag}.ag", process_set=process_set)
    check(out.reshape(-1).tolist() == members, f"{tag} allgather {out.tolist()}")
    root = members[-1]
    out = hvd.broadcast(torch.tensor([rank]), root_rank=root, name=f"{tag}.bc",
                        process_set=process_set)
    check(out.item() == root, f"{tag} broadcast got {out.item()}")
    hvd.barrier(process_set=process_set)
    check(process_set.size() == n and process_set.rank() == me, f"{tag} size/rank wrong")


for k, process_set in sets.items():
    if process_set.included():
        run_on(process_set)
    else:
        check(process_set.rank() == -1, "rank() of a set this rank is not in")
        expect(ValueError, lambda: hvd.allreduce(torch.ones(1), name="outside",
                                                 process_set=process_set),
               f"rank {rank} is not in process set {process_set.process_set_id}")

for k, process_set in sets.items():
    if k < size:
        check(hvd.remove_process_set(process_set), "remove_process_set returned False")

# Disjoint sets run at the same time: evens and odds each reduce their own tensor.
if size >= 2:
    evens = hvd.add_process_set([r for r in range(size) if r % 2 == 0])
    odds = hvd.add_process_set([r for r in range(size) if r % 2 == 1])
    mine = evens if rank % 2 == 0 else odds
    handles = [hvd.allreduce_async(torch.full((1000,), float(rank)), op=hvd.Sum,
                                   name=f"disjoint.{i}", process_set=mine) for i in range(20)]
    want = float(sum(mine.ranks))
    for h in handles:
        check(torch.all(hvd.synchronize(h) == want).item(), "disjoint set allreduce wrong")
    # Unnamed collectives are numbered per process set: the evens make more of them than the
    # odds, and a global unnamed allreduce after that still pairs up (with one count for all
    # sets, the evens would name it allreduce.noname.3 and the odds allreduce.noname.1).
    for _ in range(3 if mine is evens else 1):
        check(hvd.allreduce(torch.ones(3), op=hvd.Sum, process_set=mine)[0].item() ==
              len(mine.ranks), "unnamed allreduce in a set wrong")
    check(hvd.allreduce(torch.ones(3), op=hvd.Sum)[0].item() == size,
          "unnamed global allreduce after unnamed ones in sets wrong")
    # Removing a set: later use is refused with a clear error, on every member.
    check(hvd.remove_process_set(odds), "remove_process_set returned False")
    expect(ValueError, lambda: hvd.allreduce(torch.ones(1), name="removed", process_set=odds),
           "not registered")
    hvd.remove_process_set(evens)
    expect(ValueError, lambda: hvd.add_process_set([0, 0]), "twice")
    expect(ValueError, lambda: hvd.add_process_set([0, size]), "outside")

# Grouped ops: results, and one fused collective for the whole group.
tensors = [torch.full((i + 1,), float(rank + i)) for i in range(7)]
before = hvd.mpi_ops._core.stats()
outs = hvd.grouped_allreduce(tensors, op=hvd.Sum, name="group.ar")
after = hvd.mpi_ops._core.stats()
for i, out in enumerate(outs):
    check(torch.all(out == float(sum(range(size)) + i * size)).item(), f"grouped allreduce {i}")
check(after["allreduce_collectives"] - before["allreduce_collectives"] == 1,
      "grouped allreduce was not one fused collective")
check(after["allreduce_tensors"] - before["allreduce_tensors"] == 7, "grouped count wrong")
inplace = [torch.ones(3) * rank for _ in range(3)]
hvd.grouped_allreduce_(inplace, op=hvd.Max, name="group.ar_")
check(all(torch.all(t == size - 1).item() for t in inplace), "grouped_allreduce_ wrong")
gathered = hvd.grouped_allgather([torch.full((rank + 1, 2), float(rank)),
                                  torch.tensor([rank * 10, rank * 10 + 1])], name="group.ag")
check(gathered[0].shape[0] == sum(r + 1 for r in range(size)), "grouped allgather shape")
check(gathered[1].tolist() == [v for r in range(size) for v in (r * 10, r * 10 + 1)],
      "grouped allgather values")
scattered = hvd.grouped_reducescatter([torch.ones(size * 2, 2) * (rank + 1),
                                       torch.arange(size, dtype=torch.float32)],
                                      op=hvd.Sum, name="group.rs")
check(torch.all(scattered[0] == float(sum(r + 1 for r in range(size)))).item(), "grouped rs 0")
check(scattered[1].tolist() == [float(rank * size)], f"grouped rs 1 {scattered[1].tolist()}")

# Gradients: alltoall and allreduce against their definition (the sum of all ranks' losses);
# reducescatter with Horovod's rule.
x = torch.arange(size * 2, dtype=torch.float64).reshape(size * 2, 1).requires_grad_()
y, _ = hvd.alltoall(x, splits=[2] * size, name="grad.a2a")
(y * (rank + 1)).sum().backward()
# Rows j*2..j*2+1 of x went to rank j, whose loss weighs them by j + 1.
want = torch.tensor([[float(j + 1)] for j in range(size) for _ in range(2)], dtype=torch.float64)
check(torch.equal(x.grad, want), f"alltoall gradient {x.grad.reshape(-1).tolist()}")
z = torch.ones(size * 2, 3, dtype=torch.float64, requires_grad=True)
out = hvd.reducescatter(z, op=hvd.Average, name="grad.rs")
(out * (rank + 1)).sum().backward()
# Horovod's rule: the gathered incoming gradients (times the set's size for Sum only).
want = torch.tensor([[float(j + 1)] * 3 for j in range(size) for _ in range(2)],
                    dtype=torch.float64)
check(torch.allclose(z.grad, want), f"reducescatter gradient {z.grad[:, 0].tolist()}")
g = [torch.ones(2, dtype=torch.float64, requires_grad=True) for _ in range(2)]
outs = hvd.grouped_allreduce(g, op=hvd.Sum, name="grad.gar")
(outs[0].sum() * 2 + outs[1].sum()).backward()
check(g[0].grad.tolist() == [2.0 * size] * 2 and g[1].grad.tolist() == [1.0 * size] * 2,
      "grouped allreduce gradient wrong")

# Errors before anything is sent.
expect(ValueError, lambda: hvd.alltoall(torch.ones(5, 2), splits=[1] * size, name="bad.splits"),
       "bad.splits", "adding up to the first dimension 5")
expect(ValueError, lambda: hvd.alltoall(torch.ones(3), splits=[3] + [0] * size, name="n.splits"),
       f"must be {size}")
if size > 1:
    expect(ValueError, lambda: hvd.alltoall(torch.ones(size * 2 + 1), name="odd"), "divide")
# Mismatched reducescatter shapes fail on every rank.
if size > 1:
    try:
        hvd.reducescatter(torch.ones(4 + (rank == 0), 2), name="bad.rs")
        raise AssertionError("reducescatter shape mismatch not reported")
    except hvd.TensorMismatchError as e:
        check("bad.rs" in str(e) and "shapes" in str(e), f"unclear: {e}")

# Join: rank r runs r + 2 steps; the others keep reducing with the joined ranks adding zeros.
# Each step also averages a group mixing small tensors and tensors of 1 MiB and more (reduced
# apart from the fusion buffer): the joined ranks must take part in the same collectives.
steps = rank + 2
results = []
sizes = [3, 300_000, 5, 400_000]
for step in range(steps):
    results.append(hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum, name=f"join.step{step}").item())
    group = hvd.grouped_allreduce([torch.full((n,), float((rank + 1) * (k + 1)))
                                   for k, n in enumerate(sizes)], name=f"join.group{step}")
    active = [r for r in range(size) if r + 2 > step]
    for k, (n, got) in enumerate(zip(sizes, group)):
        want = np.full(n, sum((r + 1) * (k + 1) for r in active) / size, np.float32)
        check(np.allclose(got.numpy(), want, rtol=1e-6), f"join group {step}, tensor {k} wrong")
last = hvd.join()
check(last == size - 1, f"join returned {last}, expected the last rank {size - 1}")
for step, got in enumerate(results):
    want = float(sum(1 for r in range(size) if r + 2 > step))
    check(got == want, f"join step {step}: sum {got}, expected {want}")
# Averages after a join divide by the whole job (joined ranks contribute zeros).
check(hvd.allreduce(torch.tensor([2.0]), name="after.join").item() == 2.0, "after join wrong")
# Only allreduce goes on once a rank joined: another collective fails on the ranks that asked
# for it, naming the joined rank; the joined rank, which holds no such tensor, waits on.
if size > 1:
    if rank == 0:
        last = hvd.join()
    else:
        try:
            hvd.allgather(torch.ones(2), name="gather.after.join")
            raise AssertionError("an allgather beside a joined rank did not fail")
        except hvd.TensorMismatchError as e:
            check("gather.after.join" in str(e) and "rank 0" in str(e) and "join" in str(e),
                  f"unclear: {e}")
        last = hvd.join()
    check(0 < last < size, f"join returned {last}, expected a rank other than 0")
    check(hvd.allreduce(torch.tensor([2.0]), name="after.join2").item() == 2.0,
          "allreduce after the second join wrong")
print(f"rank {rank}: api OK", flush=True)
