"""Multi-copy tensor parallelism (num_copies=2) on 2 ranks: a Column/Row MLP pair and a small
transformer block split by parallelize_module, each against the same split with one copy and
against the dense model, forward and every gradient; bad input refused before anything is
sent."""

import copy

import torch
import torch.nn.functional as F

import horovodlike.torch as hvd
from horovodlike.torch.parallel import (ColumnParallelLinear, ColwiseParallel, MultiCopy,
                                        Replicate, RowParallelLinear, RowwiseParallel, Shard,
                                        parallelize_module)
from common import check, raises

hvd.init()
rank, size = hvd.rank(), hvd.size()
D, HEADS = 8, 4


def same(got, expected, what, rtol):
    """rtol 1e-6 between copy counts (float rounding only); the dense model sums in another
    order, so it is compared looser."""
    check(got.shape == expected.shape, f"{what}: shape {tuple(got.shape)} vs "
                                       f"{tuple(expected.shape)}")
    check(torch.allclose(got, expected, rtol=rtol, atol=rtol * 1e-1),
          f"{what}: differs by {(got - expected).abs().max().item():.3g}")


def gathered(local, dense_shape):
    """A split parameter (or its gradient) put back together along the split dimension."""
    if tuple(local.shape) == tuple(dense_shape):
        return local
    dim = next(d for d, (a, b) in enumerate(zip(local.shape, dense_shape)) if a != b)
    return hvd.allgather(local.movedim(dim, 0).contiguous()).movedim(0, dim)


def run(model, x, seed):
    """Output, input gradient and parameter gradients of a fixed random loss."""
    model.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_(True)
    out = model(x)
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed),
                          dtype=out.dtype)
    (out * weights).sum().backward()
    return out.detach(), x.grad, {n: p.grad for n, p in model.named_parameters()}


def agree(results, dense, parameters, what):
    """results: {num_copies: run(...)}; every copy count against one copy and the dense."""
    one = results[1]
    for k, (out, grad_x, grads) in results.items():
        for label, expected, rtol in (("one copy", one, 1e-6), ("dense", dense, 1e-5)):
            same(out, expected[0], f"{what} copies={k} vs {label}: output", rtol)
            same(grad_x, expected[1], f"{what} copies={k} vs {label}: input grad", rtol)
            for name, shape in parameters.items():
                mine = gathered(grads[name], shape)
                theirs = expected[2][name] if label == "dense" else gathered(
                    expected[2][name], shape)
                same(mine, theirs, f"{what} copies={k} vs {label}: grad {name}", rtol)


class Pair(torch.nn.Module):
    def __init__(self, up, down):
        super().__init__()
        self.up, self.down = up, down

    def forward(self, h):
        return self.down(F.gelu(self.up(h)))


def check_mlp():
    """ColumnParallelLinear -> gelu -> RowParallelLinear, 2-D and [sequence, batch, hidden]."""
    torch.manual_seed(3)
    dense = Pair(torch.nn.Linear(D, 4 * D), torch.nn.Linear(4 * D, D))
    shapes = {n: p.shape for n, p in dense.named_parameters()}
    for x, batch_dim in ((torch.randn(6, D), 0), (torch.randn(3, 4, D), 1)):
        results = {}
        for k in (1, 2):
            split = Pair(ColumnParallelLinear.from_dense(dense.up, num_copies=k,
                                                         batch_dim=batch_dim),
                         RowParallelLinear.from_dense(dense.down, num_copies=k,
                                                      batch_dim=batch_dim))
            results[k] = run(split, x, seed=batch_dim)
        agree(results, run(dense, x, seed=batch_dim), shapes, f"MLP batch_dim={batch_dim}")
        check("num_copies=2" in repr(split.down), f"repr lacks the copies: {split.down!r}")


class Block(torch.nn.Module):
    """Pre-norm attention and MLP, [batch, sequence, hidden]."""

    def __init__(self):
        super().__init__()
        self.norm1, self.norm2 = torch.nn.LayerNorm(D), torch.nn.LayerNorm(D)
        self.query, self.key, self.value = (torch.nn.Linear(D, D) for _ in range(3))
        self.out = torch.nn.Linear(D, D)
        self.fc1, self.fc2 = torch.nn.Linear(D, 2 * D), torch.nn.Linear(2 * D, D)

    def attention(self, h):
        b, s, _ = h.shape
        heads = [t(h).reshape(b, s, -1, D // HEADS).permute(0, 2, 1, 3)
                 for t in (self.query, self.key, self.value)]
        mixed = F.scaled_dot_product_attention(*heads, is_causal=True)
        return self.out(mixed.permute(0, 2, 1, 3).flatten(2))

    def forward(self, x):
        x = x + self.attention(self.norm1(x))
        return x + self.fc2(torch.relu(self.fc1(self.norm2(x))))


PLAN = {"query": ColwiseParallel(), "key": ColwiseParallel(), "value": ColwiseParallel(),
        "out": RowwiseParallel(), "fc1": ColwiseParallel(), "fc2": RowwiseParallel()}


def check_block():
    torch.manual_seed(5)
    dense = Block()
    shapes = {n: p.shape for n, p in dense.named_parameters()}
    x = torch.randn(4, 5, D)
    results = {}
    for k in (1, 2):
        split = parallelize_module(copy.deepcopy(dense), hvd.ProcessMesh((size,), ("tp",)),
                                   PLAN, num_copies=k)
        check(split.fc2.num_copies == k and split.query.num_copies == k,
              f"num_copies={k} did not reach the layers: {split}")
        results[k] = run(split, x, seed=11)
    agree(results, run(dense, x, seed=11), shapes, "transformer block")
    # The whole block, copies interleaved at every collective, each layer on one copy at a
    # time: the weight gradients are sums of per-copy parts, so float64 keeps the rounding
    # of that other order far below rtol 1e-6.
    dense, x = dense.double(), x.double()
    results = {}
    for k in (1, 2):
        split = parallelize_module(copy.deepcopy(dense), hvd.ProcessMesh((size,), ("tp",)),
                                   PLAN)
        interleaved = MultiCopy(split, num_copies=k)
        out, grad_x, grads = run(interleaved, x, seed=11)
        check(all(n.startswith("module.") for n in grads), "MultiCopy keeps the block in .module")
        results[k] = (out, grad_x, {n[len("module."):]: g for n, g in grads.items()})
    agree(results, run(dense, x, seed=11), shapes, "transformer block, MultiCopy")


def check_bad_input():
    """Each error is raised on both ranks before any collective; a forward that follows still
    pairs its allreduces (one sent by a failed call would have shifted them)."""
    torch.manual_seed(7)
    dense = torch.nn.Linear(4 * D, D)
    row = RowParallelLinear.from_dense(dense, input_is_parallel=False, num_copies=2)
    raises(ValueError, lambda: row(torch.randn(7, 4 * D)), "7 rows", "num_copies=2",
           "multiple of 2")
    column = ColumnParallelLinear(D, 4 * D, num_copies=3)
    raises(ValueError, lambda: column(torch.randn(4, D)), "4 rows", "num_copies=3")
    raises(ValueError, lambda: RowParallelLinear(8, 8, num_copies=0), "positive integer")
    raises(ValueError, lambda: ColumnParallelLinear(8, 8, num_copies=2, sequence_parallel=True),
           "sequence_parallel")
    raises(ValueError, lambda: parallelize_module(
        Block(), hvd.ProcessMesh((size,), ("tp",)),
        {"fc2": RowwiseParallel(output_layouts=Shard(1))}, num_copies=2), "'fc2'",
        "num_copies=1")
    raises(ValueError, lambda: parallelize_module(
        Block(), hvd.ProcessMesh((size,), ("tp",)), PLAN, num_copies=2.0), "positive integer")
    block = MultiCopy(parallelize_module(Block(), hvd.ProcessMesh((size,), ("tp",)), PLAN), 2)
    raises(ValueError, lambda: block(torch.randn(3, 5, D)), "MultiCopy", "3 rows")
    failing = MultiCopy(torch.nn.Linear(D, 3 * D), 2)
    raises(RuntimeError, lambda: failing(torch.randn(4, 2 * D)), "shapes")   # a copy's error
    x = torch.randn(8, 4 * D)
    with torch.no_grad():
        same(row(x), dense(x), "row layer after the errors", 1e-5)
    check(ColwiseParallel(output_layouts=Replicate()) is not None, "styles import")


check_mlp()
check_block()
check_bad_input()
print(f"rank {rank}: multi copy OK", flush=True)
