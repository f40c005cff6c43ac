"""parallelize_module on a small transformer written for one device: Megatron-style plans (with
and without sequence parallelism) against the unsplit model, forward and every parameter's
gradient gathered back; "mesh" (4 ranks) trains tp=2 x dp=2 with DistributedOptimizer over dp
against dense training on the global batch; bad plans raise, naming what to change."""

import copy
import sys

import torch
import torch.nn.functional as F

import horovodlike.torch as hvd
from horovodlike.torch.parallel import (ColwiseParallel, PrepareModuleInput,
                                        PrepareModuleOutput, Replicate,
                                        RowwiseParallel, SequenceParallel, Shard,
                                        parallelize_module)
from common import check, raises

hvd.init()
rank, size = hvd.rank(), hvd.size()
mode = sys.argv[1]
VOCAB, D, HEADS, SEQ = 16, 8, 4, 6


class Attention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.head_dim = D // HEADS
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (torch.nn.Linear(D, D)
                                                              for _ in range(4))

    def forward(self, h):
        b, s, _ = h.shape
        # -1 heads: the split model holds HEADS / tp of them.
        split = lambda t: t.view(b, s, -1, self.head_dim).transpose(1, 2)  # noqa: E731
        q, k, v = split(self.q_proj(h)), split(self.k_proj(h)), split(self.v_proj(h))
        att = torch.softmax(q @ k.transpose(-1, -2) / self.head_dim ** 0.5, dim=-1) @ v
        return self.o_proj(att.transpose(1, 2).reshape(b, s, -1))


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = torch.nn.Linear(D, 4 * D), torch.nn.Linear(4 * D, D)

    def forward(self, h):
        return self.down(F.gelu(self.up(h)))


class Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.attn_norm, self.attn = torch.nn.LayerNorm(D), Attention()
        self.mlp_norm, self.mlp = torch.nn.LayerNorm(D), Mlp()

    def forward(self, x):
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class Model(torch.nn.Module):
    def __init__(self, seed=0):
        super().__init__()
        torch.manual_seed(seed)   # every rank draws the same weights
        self.embed = torch.nn.Embedding(VOCAB, D)
        self.layers = torch.nn.ModuleList(Layer() for _ in range(2))
        self.norm, self.head = torch.nn.LayerNorm(D), torch.nn.Linear(D, VOCAB)
        with torch.no_grad():   # norms away from 1/0, so that their gradients matter
            for m in self.modules():
                if isinstance(m, torch.nn.LayerNorm):
                    m.weight.uniform_(0.5, 1.5)
                    m.bias.uniform_(-0.5, 0.5)

    def forward(self, ids):
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


def megatron_plan():
    """Megatron's layers, the embedding split by its dimension and gathered; the last layer's
    output split on the sequence for a sequence-parallel final norm."""
    return {"embed": ColwiseParallel(output_layouts=Replicate()),
            "layers.*.attn.q_proj": ColwiseParallel(), "layers.*.attn.k_proj": ColwiseParallel(),
            "layers.*.attn.v_proj": ColwiseParallel(), "layers.*.attn.o_proj": RowwiseParallel(),
            "layers.*.mlp.up": ColwiseParallel(), "layers.*.mlp.down": RowwiseParallel(),
            "layers.1": PrepareModuleOutput(output_layouts=Replicate(),
                                            desired_output_layouts=Shard(1)),
            "norm": SequenceParallel(),
            "head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())}


def sequence_parallel_plan(declared=True):
    """Activations outside attention and the MLP split on the sequence (dimension 1). With
    ``declared=False`` the up projection and the head leave their input layout out: the norm
    before them (SequenceParallel keeps its output's layout) tells them."""
    sharded = {"input_layouts": Shard(1)} if declared else {}
    return {"embed": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            "layers.*.attn_norm": SequenceParallel(),
            "layers.*.attn": PrepareModuleInput(input_layouts=Shard(1),
                                                desired_input_layouts=Replicate()),
            "layers.*.attn.[qkv]_proj": ColwiseParallel(),
            "layers.*.attn.o_proj": RowwiseParallel(output_layouts=Shard(1)),
            "layers.*.mlp_norm": SequenceParallel(),
            "layers.*.mlp.up": ColwiseParallel(**sharded),
            "layers.*.mlp.down": RowwiseParallel(output_layouts=Shard(1)),
            "norm": SequenceParallel(),
            "head": ColwiseParallel(**sharded, output_layouts=Replicate())}


def close(got, expected, what):
    check(got.shape == expected.shape, f"{what}: shape {tuple(got.shape)}, expected "
                                       f"{tuple(expected.shape)}")
    check(torch.allclose(got, expected, rtol=1e-5, atol=1e-6),
          f"{what}: differs by {(got - expected).abs().max().item():.3g}")


def whole(local, dense_shape, process_set):
    """A split parameter (or gradient) gathered back along the dimension that was split."""
    if tuple(local.shape) == tuple(dense_shape):
        return local
    dim = next(d for d, (a, b) in enumerate(zip(local.shape, dense_shape)) if a != b)
    gathered = hvd.allgather(local.movedim(dim, 0).contiguous(), process_set=process_set)
    return gathered.movedim(0, dim)


def compare_parameters(model, reference, process_set, what, gradients):
    mine = dict(model.named_parameters())
    check(set(mine) == {n for n, _ in reference.named_parameters()},
          f"{what}: parameter names changed: {sorted(mine)}")
    for name, dense in reference.named_parameters():
        got, expected = (mine[name].grad, dense.grad) if gradients else (mine[name], dense)
        close(whole(got.detach(), dense.shape, process_set), expected.detach(), f"{what} {name}")


def check_plan(plan_name, plan):
    reference, model = Model(), Model()
    model = parallelize_module(model, hvd.ProcessMesh((size,), ("tp",)), plan)
    check(type(model.layers[1].attn.q_proj).__name__ == "ColumnParallelLinear",
          f"{plan_name}: q_proj was not replaced")
    check(model.layers[0].mlp.up.weight.shape == (4 * D // size, D),
          f"{plan_name}: up keeps {tuple(model.layers[0].mlp.up.weight.shape)}")
    torch.manual_seed(7)
    ids = torch.randint(0, VOCAB, (3, SEQ))
    target = torch.randint(0, VOCAB, (3, SEQ))
    out = model(ids)
    expected = reference(ids)
    close(out.detach(), expected.detach(), f"{plan_name} forward")
    F.cross_entropy(out.flatten(0, 1), target.flatten()).backward()
    F.cross_entropy(expected.flatten(0, 1), target.flatten()).backward()
    compare_parameters(model, reference, hvd.global_process_set, f"{plan_name} gradient",
                       gradients=True)


def two_layers():
    torch.manual_seed(5)
    return torch.nn.Sequential(torch.nn.Linear(D, 2 * D), torch.nn.Tanh(),
                               torch.nn.Linear(2 * D, D))


class Keyword(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = two_layers()

    def forward(self, *, x):
        return self.inner(x)


class Outer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Keyword()

    def forward(self, x):
        return self.block(x=x)


def check_conversions():
    """Layouts that make the styles convert: a column layer's output split on the sequence
    for a row layer that wants its features split, and a row layer splitting a whole input."""
    mesh = hvd.ProcessMesh((size,), ("tp",))
    plans = {"sequence between": {"0": ColwiseParallel(output_layouts=Shard(1)),
                                  "2": RowwiseParallel(input_layouts=Shard(1))},
             "row first": {"0": RowwiseParallel(input_layouts=Replicate()),
                           "2": ColwiseParallel(output_layouts=Replicate())}}
    for plan_name, plan in plans.items():
        reference, model = two_layers(), parallelize_module(two_layers(), mesh, plan)
        x = torch.randn(2, 2 * size, D)
        x_ref = x.clone().requires_grad_()
        x.requires_grad_()
        out, expected = model(x), reference(x_ref)
        close(out.detach(), expected.detach(), f"{plan_name} forward")
        out.pow(2).sum().backward()
        expected.pow(2).sum().backward()
        close(x.grad, x_ref.grad, f"{plan_name} input gradient")
        compare_parameters(model, reference, hvd.global_process_set, f"{plan_name} gradient",
                           gradients=True)
    # Keyword inputs: the block is called with x= its rank's part of the sequence.
    reference, model = Outer(), parallelize_module(Outer(), mesh, {
        "block": PrepareModuleInput(input_kwarg_layouts={"x": Shard(1)},
                                    desired_input_kwarg_layouts={"x": Replicate()}),
        "block.inner.0": ColwiseParallel(),
        "block.inner.2": RowwiseParallel(output_layouts=Shard(1))})
    x = torch.randn(2, 2 * size, D)
    r = torch.randn(2, 2 * size, D)
    mine = slice(2 * rank, 2 * rank + 2)
    out, expected = model(x[:, mine]), reference(x)
    close(out.detach(), expected[:, mine].detach(), "keyword input forward")
    (out * r[:, mine]).sum().backward()
    (expected * r).sum().backward()
    compare_parameters(model, reference, hvd.global_process_set, "keyword input gradient",
                       gradients=True)
    # A plan that is one style splits the module passed in, returning its replacement.
    torch.manual_seed(6)
    dense = torch.nn.Linear(D, 2 * D)
    layer = parallelize_module(copy.deepcopy(dense), mesh, ColwiseParallel(
        output_layouts=Replicate()))
    check(tuple(layer.weight.shape) == (2 * D // size, D), "a lone layer was not split")
    x = torch.randn(3, D)
    close(layer(x).detach(), dense(x).detach(), "lone layer forward")


def check_bad_plans():
    mesh = hvd.ProcessMesh((size,), ("tp",))
    model = Model()
    raises(ValueError, lambda: parallelize_module(
        model, mesh, {"layers.*.attn.qproj": ColwiseParallel()}),
        "'layers.*.attn.qproj'", "matches no module", "layers.0.attn.q_proj")
    # A valid entry before a bad one: nothing is replaced, nothing sent.
    raises(ValueError, lambda: parallelize_module(
        model, mesh, {"layers.*.mlp.up": ColwiseParallel(),
                      "layers.0.attn_norm": ColwiseParallel()}),
        "'layers.0.attn_norm' is a LayerNorm", "SequenceParallel")
    check(type(model.layers[0].mlp.up) is torch.nn.Linear, "a failed plan changed the model")
    raises(ValueError, lambda: parallelize_module(
        model, mesh, {"head": SequenceParallel()}), "'head' is a Linear", "ColwiseParallel")
    odd = torch.nn.Sequential(torch.nn.Linear(D, 2 * size + 1))
    raises(ValueError, lambda: parallelize_module(odd, mesh, {"0": ColwiseParallel()}),
           "'0'", f"out_features = {2 * size + 1}", f"the {size} ranks", "multiple of")
    raises(ValueError, lambda: parallelize_module(
        torch.nn.Sequential(torch.nn.Embedding(VOCAB, D, padding_idx=0)), mesh,
        {"0": RowwiseParallel()}), "padding_idx")
    first_only = hvd.add_process_set([0])   # before the mesh below reuses it
    if rank != 0:
        raises(ValueError, lambda: parallelize_module(model, first_only, megatron_plan()),
               f"rank {rank} is not in the process set [0]")
    tied = Model()
    tied.head.weight = tied.embed.weight
    raises(ValueError, lambda: parallelize_module(tied, mesh, {"head": ColwiseParallel()}),
           "'head' shares a parameter with 'embed'", "tied")
    grid = hvd.ProcessMesh((1, size), ("dp", "tp"))
    raises(ValueError, lambda: parallelize_module(model, grid, megatron_plan()), "mesh_dim=")
    raises(ValueError, lambda: parallelize_module(model, grid, megatron_plan(),
                                                  mesh_dim="pp"), "no dimension 'pp'")
    raises(ValueError, lambda: parallelize_module(model, mesh, {"head": "colwise"}),
           "'head'", "ColwiseParallel")
    raises(ValueError, lambda: ColwiseParallel(input_layouts="shard"), "Shard(dim)")
    # Ranks that disagree about the plan all raise instead of waiting for each other.
    lopsided = {"head": ColwiseParallel(output_layouts=Replicate() if rank else Shard(-1))}
    raises(ValueError, lambda: parallelize_module(model, mesh, lopsided),
           "another plan or model")
    check(type(model.head) is torch.nn.Linear, "a refused plan changed the model")


def train_on_mesh():
    """tp=2 x dp=2: each dp replica a split model on half the batch, averaged over dp."""
    mesh = hvd.ProcessMesh((2, 2), ("dp", "tp"))
    reference = Model(seed=3)
    model = parallelize_module(Model(seed=3), mesh, sequence_parallel_plan(declared=False),
                               mesh_dim="tp")
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5),
                                         named_parameters=model.named_parameters(),
                                         process_set=mesh.process_set("dp"))
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.5)
    torch.manual_seed(11)
    mine = slice(mesh.coordinate("dp") * 2, mesh.coordinate("dp") * 2 + 2)
    for step in range(2):
        ids, target = torch.randint(0, VOCAB, (4, SEQ)), torch.randint(0, VOCAB, (4, SEQ))
        optimizer.zero_grad()
        F.cross_entropy(model(ids[mine]).flatten(0, 1), target[mine].flatten()).backward()
        optimizer.step()
        ref_optimizer.zero_grad()
        F.cross_entropy(reference(ids).flatten(0, 1), target.flatten()).backward()
        ref_optimizer.step()
        compare_parameters(model, reference, mesh.process_set("tp"), f"step {step} gradient",
                           gradients=True)
    compare_parameters(model, reference, mesh.process_set("tp"), "trained", gradients=False)
    ids = torch.randint(0, VOCAB, (2, SEQ))
    close(model(ids).detach(), reference(ids).detach(), "forward after training")


if mode == "plans":
    check_plan("megatron", megatron_plan())
    check_plan("sequence parallel", sequence_parallel_plan())
    check_conversions()
    check_bad_plans()
elif mode == "mesh":
    train_on_mesh()
hvd.barrier()
print(f"rank {rank}: parallelize {mode} OK", flush=True)
