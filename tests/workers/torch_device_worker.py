"""horovodlike.torch on one device kind, checked against NumPy and single-process references:
every collective, grouped ops, DistributedOptimizer, broadcast_parameters and
broadcast_optimizer_state, SyncBatchNorm, join and point-to-point.

Usage: torch_device_worker.py cpu|cuda

The same checks run on CPU tensors (every machine) and on CUDA tensors (a machine with GPUs:
rank r on cuda:<local rank % GPUs>, so ranks beyond the GPUs share them and are staged). On
CUDA, the collectives are issued on a side stream, which the core must follow, and the path the
job took is printed ("nccl" or "staged: ...")."""

import sys

import numpy as np
import torch

import horovodlike.torch as hvd
from common import as_float64, check, expected_reduce, rank_input, to_torch

hvd.init()
rank, size = hvd.rank(), hvd.size()
KIND = sys.argv[1]
if KIND == "cuda":
    index = hvd.local_rank() % torch.cuda.device_count()
    torch.cuda.set_device(index)
    DEVICE = torch.device("cuda", index)
else:
    DEVICE = torch.device("cpu")
SEED = 7


def on_device(values, dtype):
    return to_torch(values, dtype).to(DEVICE)


def host(tensor):
    return as_float64(tensor.detach().cpu())


def close(got, want, what, tol=1e-5):
    got, want = np.asarray(got), np.asarray(want)
    check(got.shape == want.shape, f"rank {rank}: {what}: shape {got.shape}, want {want.shape}")
    if got.size:
        check(np.allclose(got, want, rtol=tol, atol=tol),
              f"rank {rank}: {what}: max error {np.max(np.abs(got - want))}")


def allreduces():
    for dtype in ("float32", "float16", "bfloat16", "int32", "int64", "uint8"):
        for op_name, op in (("Sum", hvd.Sum), ("Average", hvd.Average), ("Min", hvd.Min),
                            ("Max", hvd.Max)):
            if dtype == "uint8" and op_name == "Average":
                continue
            inputs = [rank_input(dtype, 33, r, SEED, op_name) for r in range(size)]
            want = expected_reduce(inputs, op_name, dtype, size)
            tol = 1e-2 if dtype in ("float16", "bfloat16") else 1e-6
            out = hvd.allreduce(on_device(inputs[rank], dtype), op=op, name=f"{dtype}.{op_name}")
            check(out.device == DEVICE, f"allreduce output on {out.device}")
            close(host(out), want, f"allreduce {dtype} {op_name}", tol)
    inputs = [rank_input("float32", 50, r, SEED) for r in range(size)]
    out = hvd.allreduce(on_device(inputs[rank], "float32"), op=hvd.Sum, prescale_factor=2.0,
                        postscale_factor=0.25, name="scaled")
    close(host(out), sum(inputs) * 0.5, "scaled allreduce")
    # Several in flight at once (fused), in place.
    tensors = [on_device(rank_input("float32", n, rank, n), "float32") for n in (3, 100, 1)]
    handles = [hvd.allreduce_async_(t, name=f"fused.{i}", op=hvd.Average)
               for i, t in enumerate(tensors)]
    for h in handles:
        hvd.synchronize(h)
    for t, n in zip(tensors, (3, 100, 1)):
        close(host(t), np.mean([rank_input("float32", n, r, n) for r in range(size)], 0),
              f"fused allreduce of {n}")
    grouped = hvd.grouped_allreduce([on_device(np.full(4, rank + 1.0), "float64"),
                                     on_device(np.full(2, 2.0 * rank), "float64")], op=hvd.Sum)
    close(host(grouped[0]), np.full(4, size * (size + 1) / 2), "grouped allreduce 0")
    close(host(grouped[1]), np.full(2, size * (size - 1)), "grouped allreduce 1")


def gathers_and_others():
    rows = [[r] * (r + 1) for r in range(size)]
    got = hvd.allgather(on_device(np.array(rows[rank], np.float32), "float32"), name="ag")
    check(got.device == DEVICE, f"allgather output on {got.device}")
    close(host(got), np.concatenate(rows), "allgather")
    pair = hvd.grouped_allgather([on_device(np.full((2, 2), rank), "int32"),
                                  on_device(np.full(3, rank), "int64")])
    close(host(pair[0]), np.concatenate([np.full((2, 2), r) for r in range(size)]), "gather 0")
    close(host(pair[1]), np.concatenate([np.full(3, r) for r in range(size)]), "gather 1")
    root = size - 1
    out = hvd.broadcast(on_device(np.full(5, float(rank)), "float32"), root_rank=root, name="bc")
    close(host(out), np.full(5, float(root)), "broadcast")
    splits = [(rank + j) % 3 for j in range(size)]
    data = np.arange(sum(splits) * 2, dtype=np.float32).reshape(-1, 2) + 100 * rank
    out, received = hvd.alltoall(on_device(data, "float32"), splits=torch.tensor(splits),
                                 name="a2a")
    want = []
    for r in range(size):
        theirs = [(r + j) % 3 for j in range(size)]
        start = sum(theirs[:rank])
        block = np.arange(sum(theirs) * 2, dtype=np.float32).reshape(-1, 2) + 100 * r
        want.append(block[start:start + theirs[rank]])
    close(host(out), np.concatenate(want), "alltoall")
    check(received.tolist() == [(r + rank) % 3 for r in range(size)], f"splits {received}")
    count = 2 * size + 1
    inputs = [rank_input("float32", count * 3, r, SEED).reshape(count, 3) for r in range(size)]
    out = hvd.reducescatter(on_device(inputs[rank], "float32"), op=hvd.Sum, name="rs")
    mine = [count // size + (1 if r < count % size else 0) for r in range(size)]
    start = sum(mine[:rank])
    close(host(out), sum(inputs)[start:start + mine[rank]], "reducescatter")


def training():
    """Three DistributedOptimizer steps equal full-batch steps of one process."""
    torch.manual_seed(rank)  # different on every rank until broadcast
    model = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    model.to(DEVICE)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    torch.manual_seed(0)
    reference = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.Tanh(),
                                    torch.nn.Linear(4, 2))
    # Rank 0's initial weights (seed 0) everywhere.
    for mine, theirs in zip(model.state_dict().values(), reference.state_dict().values()):
        close(host(mine), as_float64(theirs), "broadcast_parameters")
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    rng = np.random.default_rng(11)
    for step in range(3):
        x = rng.standard_normal((size * 4, 6)).astype(np.float32)
        y = rng.standard_normal((size * 4, 2)).astype(np.float32)
        optimizer.zero_grad()
        part = slice(rank * 4, rank * 4 + 4)
        loss = torch.nn.functional.mse_loss(model(torch.from_numpy(x[part]).to(DEVICE)),
                                            torch.from_numpy(y[part]).to(DEVICE))
        loss.backward()
        optimizer.step()
        ref_optimizer.zero_grad()
        torch.nn.functional.mse_loss(reference(torch.from_numpy(x)), torch.from_numpy(y)).backward()
        ref_optimizer.step()
    for (name, mine), theirs in zip(model.state_dict().items(), reference.state_dict().values()):
        close(host(mine), as_float64(theirs), f"trained {name}", 1e-4)


def sync_batch_norm():
    """SyncBatchNorm over the ranks' batches equals BatchNorm over their concatenation."""
    batches = [np.random.default_rng(r).standard_normal((3, 4, 5)).astype(np.float32)
               for r in range(size)]
    layer = hvd.SyncBatchNorm(4).to(DEVICE)
    x = torch.from_numpy(batches[rank]).to(DEVICE).requires_grad_()
    out = layer(x)
    (out * out).sum().backward()
    full = torch.from_numpy(np.concatenate(batches)).requires_grad_()
    ref = torch.nn.BatchNorm1d(4)(full)
    (ref * ref).sum().backward()
    close(host(out), as_float64(ref[rank * 3:rank * 3 + 3].detach()), "SyncBatchNorm", 1e-4)
    close(host(x.grad), as_float64(full.grad[rank * 3:rank * 3 + 3]), "SyncBatchNorm grad", 1e-4)


def join_and_point_to_point():
    if size > 1:
        right, left = (rank + 1) % size, (rank - 1) % size
        if rank % 2 == 0:
            hvd.send(on_device(np.full(6, rank + 0.5), "float32"), right, tag=3)
            got = torch.zeros(6, device=DEVICE)
            hvd.recv(got, left, tag=3)
        else:
            got = torch.zeros(6, device=DEVICE)
            hvd.recv(got, left, tag=3)
            hvd.send(on_device(np.full(6, rank + 0.5), "float32"), right, tag=3)
        close(host(got), np.full(6, left + 0.5), "send/recv")
    # The last rank joins at once; the others allreduce with its zeros.
    if rank == size - 1:
        last = hvd.join(device=DEVICE.index if KIND == "cuda" else -1)
    else:
        out = hvd.allreduce(on_device(np.full(3, rank + 1.0), "float32"), op=hvd.Sum,
                            name="while_joined")
        close(host(out), np.full(3, (size - 1) * size / 2), "allreduce beside a joined rank")
        last = hvd.join()
    check(last in range(size), f"join returned {last}")


def horovod_style():
    """As Horovod's test_torch.py calls them: on the current (default) stream, dims 1 to 3 of
    17, a CPU tensor's call before each device tensor's, splits given as a tensor on the
    device, results read on the same stream at once."""
    for dtype in ("int32", "int64", "float16", "float32", "float64"):
        for dim in (1, 2, 3):
            shape = (17,) * dim
            rng = np.random.default_rng(1234)
            base = rng.integers(-100, 100, shape)
            for device in ("cpu", DEVICE):
                tensor = to_torch(base, dtype).to(device)
                averaged = hvd.allreduce(tensor, average=True, name=f"hs.avg.{dtype}.{dim}")
                close(host(averaged), base.astype(np.float64), f"{device} average {dtype} {dim}-D")
                gathered = hvd.allgather(to_torch(np.full(shape, rank), dtype).to(device),
                                         name=f"hs.ag.{dtype}.{dim}")
                close(host(gathered), np.concatenate([np.full(shape, r) for r in range(size)]),
                      f"{device} allgather {dtype} {dim}-D")
                splits = torch.tensor([rank + 1] * size, dtype=torch.int32, device=device)
                rows = to_torch(np.concatenate([np.full((rank + 1,) + shape[1:], j)
                                                for j in range(size)]), dtype).to(device)
                out, received = hvd.alltoall(rows, splits, name=f"hs.a2a.{dtype}.{dim}")
                check(received.device == splits.device, f"received splits on {received.device}")
                check(received.tolist() == [r + 1 for r in range(size)], f"received {received}")
                close(host(out), np.full((size * (size + 1) // 2,) + shape[1:], rank),
                      f"{device} alltoall {dtype} {dim}-D")


if KIND == "cuda":
    # Issued on a side stream: the core follows the stream it was called on.
    with torch.cuda.stream(torch.cuda.Stream()):
        allreduces()
        gathers_and_others()
    torch.cuda.synchronize()
else:
    allreduces()
    gathers_and_others()
horovod_style()
training()
sync_batch_norm()
join_and_point_to_point()
path = ""
if KIND == "cuda":
    from horovodlike import _core
    path = f" ({_core.gpu_mode(0)})"
print(f"rank {rank}: torch {KIND} ok{path}", flush=True)
hvd.shutdown()
