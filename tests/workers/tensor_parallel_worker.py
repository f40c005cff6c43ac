"""Megatron-style tensor-parallel layers against their dense single-process equivalents,
forward and backward. Modes: "layers" (the whole job is the tensor-parallel group) and "block"
(4 ranks as dp x tp: a transformer block, heads and MLP split over tp, trained with
DistributedOptimizer over dp, against dense training on the global batch)."""

import sys

import torch
import torch.nn.functional as F

import horovodlike.torch as hvd
from horovodlike.torch.parallel import (ColumnParallelLinear, ParallelEmbedding,
                                        RowParallelLinear, VocabParallelEmbedding)
from common import check, expect_error

hvd.init()
rank, size = hvd.rank(), hvd.size()
mode = sys.argv[1] if len(sys.argv) > 1 else "layers"


def close(got, expected, what):
    check(got.shape == expected.shape, f"{what}: shape {tuple(got.shape)}, expected "
                                       f"{tuple(expected.shape)}")
    check(torch.allclose(got, expected, rtol=1e-5, atol=1e-6),
          f"{what}: differs by {(got - expected).abs().max().item():.3g}")


def columns(t, part, parts):
    n = t.shape[0] // parts
    return t[part * n:(part + 1) * n]


def inputs(*shape):
    x = torch.randn(*shape)
    return x.clone().requires_grad_(), x.clone().requires_grad_()


if mode == "layers":
    torch.manual_seed(0)   # every rank draws the same dense layers and data
    # Column with gather_output: every rank gets the whole output.
    dense = torch.nn.Linear(6, 8)
    layer = ColumnParallelLinear.from_dense(dense, gather_output=True)
    x, x_ref = inputs(3, 6)
    r = torch.randn(3, 8)
    (layer(x) * r).sum().backward()
    y_ref = dense(x_ref)
    (y_ref * r).sum().backward()
    close(layer(x.detach()), y_ref.detach(), "column gather_output forward")
    close(x.grad, x_ref.grad, "column input gradient")
    close(layer.weight.grad, columns(dense.weight.grad, rank, size), "column weight gradient")
    close(layer.bias.grad, columns(dense.bias.grad, rank, size), "column bias gradient")

    # Same seed, built directly: the split layer starts where nn.Linear does.
    torch.manual_seed(5)
    built = ColumnParallelLinear(6, 8)
    torch.manual_seed(5)
    fresh = torch.nn.Linear(6, 8)
    close(built.weight.detach(), columns(fresh.weight.detach(), rank, size), "initialisation")

    # Column (no gather) -> Row (input_is_parallel): the MLP pair, one allreduce forward.
    torch.manual_seed(1)
    up, down = torch.nn.Linear(6, 8), torch.nn.Linear(8, 6)
    col = ColumnParallelLinear.from_dense(up)
    row = RowParallelLinear.from_dense(down)
    x, x_ref = inputs(2, 4, 6)
    r = torch.randn(2, 4, 6)
    y = row(F.gelu(col(x)))
    y_ref = down(F.gelu(up(x_ref)))
    (y * r).sum().backward()
    (y_ref * r).sum().backward()
    close(y.detach(), y_ref.detach(), "column -> row forward")
    close(x.grad, x_ref.grad, "column -> row input gradient")
    close(col.weight.grad, columns(up.weight.grad, rank, size), "up weight gradient")
    close(row.weight.grad, columns(down.weight.grad.t(), rank, size).t(), "down weight grad")
    close(row.bias.grad, down.bias.grad, "down bias gradient")

    # Row with input_is_parallel=False splits a whole input itself.
    torch.manual_seed(2)
    dense = torch.nn.Linear(8, 3)
    row = RowParallelLinear.from_dense(dense, input_is_parallel=False)
    x, x_ref = inputs(5, 8)
    row(x).pow(2).sum().backward()
    dense(x_ref).pow(2).sum().backward()
    close(row(x.detach()), dense(x_ref.detach()), "row forward")
    close(x.grad, x_ref.grad, "row input gradient")

    # Sequence parallel: each rank holds a slice of the sequence (first dimension) in and out.
    torch.manual_seed(3)
    up, down = torch.nn.Linear(6, 8), torch.nn.Linear(8, 6)
    col = ColumnParallelLinear.from_dense(up, sequence_parallel=True)
    row = RowParallelLinear.from_dense(down, sequence_parallel=True)
    x_full = torch.randn(4 * size, 2, 6)
    r = torch.randn(4 * size, 2, 6)
    x = columns(x_full, rank, size).clone().requires_grad_()
    x_ref = x_full.clone().requires_grad_()
    y = row(F.gelu(col(x)))
    y_ref = down(F.gelu(up(x_ref)))
    (y * columns(r, rank, size)).sum().backward()
    (y_ref * r).sum().backward()
    close(y.detach(), columns(y_ref.detach(), rank, size), "sequence parallel forward")
    close(x.grad, columns(x_ref.grad, rank, size), "sequence parallel input gradient")
    close(col.weight.grad, columns(up.weight.grad, rank, size), "sp up weight gradient")
    close(row.bias.grad, down.bias.grad, "sp down bias gradient")

    # Vocabulary-parallel embedding.
    torch.manual_seed(4)
    dense = torch.nn.Embedding(10, 3)
    emb = VocabParallelEmbedding.from_dense(dense)
    ids = torch.randint(0, 10, (4, 5))
    r = torch.randn(4, 5, 3)
    y = emb(ids)
    (y * r).sum().backward()
    y_ref = dense(ids)
    (y_ref * r).sum().backward()
    close(y.detach(), y_ref.detach(), "embedding forward")
    close(emb.weight.grad, columns(dense.weight.grad, rank, size), "embedding gradient")

    # Sizes that do not split: a clear error on every rank, before anything is sent.
    expect_error(lambda: ColumnParallelLinear(4, 2 * size + 1), "out_features",
                 f"{2 * size + 1} is not divisible by the {size} ranks")
    expect_error(lambda: RowParallelLinear(2 * size + 1, 4), "in_features")
    expect_error(lambda: VocabParallelEmbedding(2 * size + 1, 4), "num_embeddings")
    # ParallelEmbedding, the short name, builds the same split: num_embeddings/N rows.
    check(tuple(ParallelEmbedding(2 * size, 3).weight.shape) == (2, 3), "ParallelEmbedding")
    print(f"rank {rank}: tensor parallel layers OK", flush=True)


class Block(torch.nn.Module):
    """A pre-LayerNorm transformer block; ``linear(kind, dense)`` decides how each dense
    projection runs (itself, or split over the tp set)."""

    def __init__(self, d, heads, dense, tp_size=1, linear=lambda kind, m: m):
        super().__init__()
        self.heads, self.d = heads // tp_size, d
        self.ln1, self.ln2 = dense["ln1"], dense["ln2"]
        self.q, self.k, self.v = (linear("column", dense[n]) for n in "qkv")
        self.o = linear("row", dense["o"])
        self.up, self.down = linear("column", dense["up"]), linear("row", dense["down"])

    def forward(self, x):
        b, s, _ = x.shape
        h = self.ln1(x)
        split = lambda t: t.view(b, s, self.heads, -1).transpose(1, 2)  # noqa: E731
        q, k, v = split(self.q(h)), split(self.k(h)), split(self.v(h))
        att = torch.softmax(q @ k.transpose(-1, -2) / (q.shape[-1] ** 0.5), dim=-1) @ v
        x = x + self.o(att.transpose(1, 2).reshape(b, s, -1))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


def dense_layers(d):
    torch.manual_seed(10)
    return torch.nn.ModuleDict({"ln1": torch.nn.LayerNorm(d), "ln2": torch.nn.LayerNorm(d),
                                **{n: torch.nn.Linear(d, d) for n in "qkvo"},
                                "up": torch.nn.Linear(d, 4 * d),
                                "down": torch.nn.Linear(4 * d, d)})


if mode == "block":
    mesh = hvd.ProcessMesh((2, 2), ("dp", "tp"))
    tp, dp = mesh.process_set("tp"), mesh.process_set("dp")
    d, heads, batch = 8, 4, 4
    reference = Block(d, heads, dense_layers(d))
    split_from = dense_layers(d)
    model = Block(d, heads, split_from, tp_size=2, linear=lambda kind, m: (
        ColumnParallelLinear if kind == "column" else RowParallelLinear).from_dense(
            m, process_set=tp))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters(),
                                         process_set=dp)
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(3)
    for step in range(3):
        x = torch.randn(batch, 5, d, generator=g)
        target = torch.randn(batch, 5, d, generator=g)
        mine = slice(mesh.coordinate("dp") * batch // 2, (mesh.coordinate("dp") + 1) * batch // 2)
        optimizer.zero_grad()
        F.mse_loss(model(x[mine]), target[mine]).backward()
        optimizer.step()
        ref_optimizer.zero_grad()
        F.mse_loss(reference(x), target).backward()
        ref_optimizer.step()
    part = mesh.coordinate("tp")
    for name in "qkv":
        close(getattr(model, name).weight.detach(),
              columns(getattr(reference, name).weight.detach(), part, 2), f"{name} weight")
    close(model.o.weight.detach(), columns(reference.o.weight.detach().t(), part, 2).t(),
          "o weight")
    close(model.down.bias.detach(), reference.down.bias.detach(), "down bias")
    close(model.ln1.weight.detach(), reference.ln1.weight.detach(), "ln1 weight")
    x = torch.randn(2, 5, d, generator=g)
    close(model(x).detach(), reference(x).detach(), "block output after training")
    hvd.barrier()   # the tp pairs finish at different times; shutdown is job-wide
    print(f"rank {rank}: tensor parallel block OK", flush=True)


if mode == "2d":
    from horovodlike.torch.parallel import Linear2D, gather_2d, split_2d
    mesh = hvd.ProcessMesh((2, 2), ("row", "col"))
    a, b = mesh.coordinate("row"), mesh.coordinate("col")
    for algorithm in Linear2D.ALGORITHMS:
        # SUMMA keeps the layout; allgather_reducescatter swaps it, so its pair swaps dims.
        first_dims = ("row", "col")
        second_dims = first_dims if algorithm == "summa" else ("col", "row")
        in_dims = first_dims if algorithm == "summa" else ("col", "row")
        torch.manual_seed(20)
        up, down = torch.nn.Linear(8, 12), torch.nn.Linear(12, 8)
        first = Linear2D.from_dense(up, mesh, dims=first_dims, algorithm=algorithm)
        second = Linear2D.from_dense(down, mesh, dims=second_dims, algorithm=algorithm)
        x, x_ref = inputs(6, 8)
        r = torch.randn(6, 8)
        block = split_2d(x, mesh, dims=in_dims)
        rows, cols = mesh.coordinate(in_dims[0]), mesh.coordinate(in_dims[1])
        close(block.detach(), x.detach()[3 * rows:3 * rows + 3, 4 * cols:4 * cols + 4],
              f"{algorithm} split_2d block")
        y = gather_2d(second(F.gelu(first(block))), mesh, dims=in_dims)
        y_ref = down(F.gelu(up(x_ref)))
        (y * r).sum().backward()
        (y_ref * r).sum().backward()
        close(y.detach(), y_ref.detach(), f"{algorithm} forward")
        close(x.grad, x_ref.grad, f"{algorithm} input gradient")
        # Weight block (outputs j, inputs i) as nn.Linear stores it; bias block j.
        i, j = mesh.coordinate(first_dims[0]), mesh.coordinate(first_dims[1])
        close(first.weight.grad, up.weight.grad[6 * j:6 * j + 6, 4 * i:4 * i + 4],
              f"{algorithm} first weight gradient")
        close(first.bias.grad, up.bias.grad[6 * j:6 * j + 6], f"{algorithm} first bias")
        i, j = mesh.coordinate(second_dims[0]), mesh.coordinate(second_dims[1])
        close(second.weight.grad, down.weight.grad[4 * j:4 * j + 4, 6 * i:6 * i + 6],
              f"{algorithm} second weight gradient")
        close(second.bias.grad, down.bias.grad[4 * j:4 * j + 4], f"{algorithm} second bias")
    # A q x q grid built directly draws what nn.Linear draws with the same seed.
    torch.manual_seed(21)
    built = Linear2D(8, 12, mesh)
    torch.manual_seed(21)
    close(built.weight.detach(), torch.nn.Linear(8, 12).weight.detach()[6 * b:6 * b + 6,
                                                                        4 * a:4 * a + 4],
          "Linear2D initialisation")
    expect_error(lambda: Linear2D(7, 12, mesh), "in_features = 7")
    expect_error(lambda: Linear2D(8, 12, hvd.ProcessMesh((4,), ("tp",))), "two-dimensional")
    expect_error(lambda: built(torch.randn(3, 8)), "block of the input")
    expect_error(lambda: Linear2D(8, 12, mesh, algorithm="cannon"), "'cannon'")
    hvd.barrier()
    print(f"rank {rank}: tensor parallel 2d OK", flush=True)
