"""fully_shard against single-process training on the global batch.

Every rank replays, on its own, training of the unwrapped model on the whole global batch (the
reference); the sharded model (fully_shard on each block, then the root) trains on this rank's
rows. Compared: the gathered state dict after each step, the elements each rank holds, the
freeing of the gathered parameters after the forward, gradient accumulation without sync,
loading a full and a sharded state dict, the switches, tied and ignored parameters, and the
errors; mixed precision against the float32 run, offloading against none. Modes: "train" (2
ranks, everything) and "four" (4 ranks: a 1-D ProcessMesh, HSDP over a 2x2 ("replicate",
"shard") mesh, reshard_after_forward=2, and the shard sizes).
"""

import io
import math
import sys

import torch
import torch.nn.functional as F

import horovodlike.torch as hvd
from horovodlike.torch.fsdp import (CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, Shard,
                                    full_state_dict, fully_shard, load_full_state_dict)
from common import check, raises

hvd.init()
rank, size = hvd.rank(), hvd.size()
mode = sys.argv[1] if len(sys.argv) > 1 else "train"
VOCAB, WIDTH, TOKENS, ROWS = 11, 7, 5, 4       # 7-wide blocks: 70 elements, uneven over 4


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(WIDTH, WIDTH)
        self.norm = torch.nn.LayerNorm(WIDTH)

    def forward(self, x):
        return x + F.gelu(self.norm(self.lin(x)))


class Net(torch.nn.Module):
    def __init__(self, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.emb = torch.nn.Embedding(VOCAB, WIDTH)
        self.blocks = torch.nn.ModuleList([Block() for _ in range(3)])
        self.head = torch.nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens):
        x = self.emb(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def sharded(seed, reshard=True, mesh=None, **policies):
    net = Net(seed)
    for block in net.blocks:
        fully_shard(block, reshard_after_forward=reshard, mesh=mesh, **policies)
    return fully_shard(net, reshard_after_forward=reshard, mesh=mesh, **policies)


def shard_count(mesh):
    """The ranks one module is sharded over: the mesh's last dimension, or the whole job."""
    return size if mesh is None else mesh.size(mesh.dim_names[-1])


def loss_of(net, tokens, targets):
    return F.cross_entropy(net(tokens).reshape(-1, VOCAB), targets.reshape(-1))


def batches(seed, steps):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, VOCAB, (ROWS * size, TOKENS), generator=g),
             torch.randint(0, VOCAB, (ROWS * size, TOKENS), generator=g)) for _ in range(steps)]


def mine(tensor):
    return tensor[rank * ROWS:(rank + 1) * ROWS]


def same_state(got, want, what):
    check(sorted(got) == sorted(want), f"{what}: keys {sorted(got)} != {sorted(want)}")
    for key in want:
        check(torch.allclose(got[key], want[key], rtol=1e-5, atol=1e-6),
              f"{what}: {key} differs by {(got[key] - want[key]).abs().max().item():.3g}")


def check_shard_sizes(net, reference, shards):
    """Each wrapped module's parameters on this rank: one flat shard of ceil(numel / shards)."""
    own = {"": sum(p.numel() for n, p in reference.named_parameters()
                   if not n.startswith("blocks."))}
    for i, block in enumerate(reference.blocks):
        own[f"blocks.{i}."] = sum(p.numel() for p in block.parameters())
    held = {n[:-len("_flat_shard")]: p.numel() for n, p in net.named_parameters()}
    check(held == {k: math.ceil(v / shards) for k, v in own.items()},
          f"shard sizes {held} for module sizes {own} over {shards} ranks")


def train_and_compare(optimizer_class, kwargs, reshard, steps=3, mesh=None, prefetch=False):
    reference, net = Net(1), sharded(1, reshard, mesh)
    started = []            # inside block 0's computation: is block 1's gather under way?
    if prefetch:        # each block starts the next one's gather (the previous one's backward)
        blocks = list(net.blocks)
        for before, after in zip(blocks, blocks[1:]):
            before.set_modules_to_forward_prefetch([after])
            after.set_modules_to_backward_prefetch([before])
        net.set_modules_to_forward_prefetch(blocks[:1])
        blocks[0].lin.register_forward_hook(
            lambda *_: started.append(blocks[1]._fsdp_group._prefetched is not None))
    check_shard_sizes(net, reference, shard_count(mesh))
    ref_opt = optimizer_class(reference.parameters(), **kwargs)
    opt = optimizer_class(net.parameters(), **kwargs)
    for step, (tokens, targets) in enumerate(batches(7, steps)):
        ref_opt.zero_grad()
        loss_of(reference, tokens, targets).backward()
        ref_opt.step()
        opt.zero_grad()
        if step == 0:
            check_freed_after_forward(net, tokens, targets, reshard, shard_count(mesh))
        else:
            loss_of(net, mine(tokens), mine(targets)).backward()
        opt.step()
        same_state(full_state_dict(net), reference.state_dict(),
                   f"{optimizer_class.__name__} reshard={reshard} step {step}")
    check(not prefetch or started == [True] * steps, f"forward prefetch started: {started}")
    return reference, net


def check_freed_after_forward(net, tokens, targets, reshard, shards=None):
    """The parameter views autograd saves live in the gathered buffers (one per wrapped module,
    padded_numel * 4 bytes); with reshard_after_forward their storage is empty between the
    forward and the backward, and after the backward in both modes. With an int, each module
    keeps 1/int of its gathered parameters until the backward gathers from them."""
    padded = {p.numel() * (shards or size) * 4 for p in net.parameters()}
    saved = []

    def pack(t):
        if t.untyped_storage().nbytes() in padded:
            saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = loss_of(net, mine(tokens), mine(targets))
    sizes = [t.untyped_storage().nbytes() for t in saved]
    check(len(saved) >= 4, f"only {len(saved)} saved parameter views found")
    check(all(s == 0 for s in sizes) if reshard else all(s > 0 for s in sizes),
          f"reshard_after_forward={reshard}: saved parameter storages after forward {sizes}")
    check(hasattr(net.blocks[0].lin, "weight") != bool(reshard),
          f"reshard_after_forward={reshard}: weight attribute present after forward")
    groups = [m._fsdp_group for m in net.modules() if isinstance(m, FSDPModule)]
    kept = [g.piece[0].numel() * reshard if g.piece else 0 for g in groups]
    check(kept == ([g.padded_numel for g in groups] if reshard is not True and reshard
                   else [0] * len(groups)), f"reshard_after_forward={reshard}: kept {kept}")
    loss.backward()
    check(all(g.piece is None for g in groups), "the backward did not gather from the piece")
    check(all(t.untyped_storage().nbytes() == 0 for t in saved), "not freed after backward")


def gradient_accumulation():
    reference, net = Net(2), sharded(2)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.2, momentum=0.9)
    opt = torch.optim.SGD(net.parameters(), lr=0.2, momentum=0.9)
    for tokens, targets in batches(9, 2):
        ref_opt.zero_grad()
        loss_of(reference, tokens, targets).backward()
        ref_opt.step()
        opt.zero_grad()
        half = ROWS // 2
        for micro, sync in ((slice(0, half), False), (slice(half, ROWS), True)):
            net.set_requires_gradient_sync(sync)
            (loss_of(net, mine(tokens)[micro], mine(targets)[micro]) / 2).backward()
            if not sync:
                check(all(p.grad is None for p in net.parameters()),
                      "a shard got a gradient while gradient sync was off")
        opt.step()
    same_state(full_state_dict(net), reference.state_dict(), "gradient accumulation")


def state_dicts(reference, net):
    full = full_state_dict(net, rank0_only=True)
    check((full == {}) == (rank != 0), f"rank0_only gave {len(full)} entries on rank {rank}")
    tokens = batches(3, 1)[0][0]
    fresh = sharded(5)
    load_full_state_dict(fresh, reference.state_dict())
    with torch.no_grad():
        check(torch.allclose(fresh(tokens), reference(tokens), rtol=1e-6, atol=1e-6),
              "a full state dict loaded into a sharded model gives other outputs")
    buffer = io.BytesIO()
    torch.save(net.state_dict(), buffer)
    buffer.seek(0)
    again = sharded(6, reshard=False)
    with torch.no_grad():
        again(tokens)               # keeps the gathered parameters of seed 6: loading must
    again.load_state_dict(torch.load(buffer))   # make the next forward gather again
    with torch.no_grad():
        check(torch.equal(again(tokens), net(tokens)), "sharded state dict round trip differs")
    raises(ValueError, lambda: load_full_state_dict(sharded(5), {"emb.weight": None}),
           "missing keys", "head.weight")


def switches_and_ties():
    """unshard/reshard by hand, set_reshard_after_forward, ignored_params, and a parameter tied
    inside one wrapped module (the embedding and the head of the root)."""
    reference, net = Net(1), sharded(1)
    net.blocks[0].unshard()
    check(torch.equal(net.blocks[0].lin.weight, reference.blocks[0].lin.weight), "unshard()")
    net.blocks[0].reshard()
    check(not hasattr(net.blocks[0].lin, "weight"), "reshard() left the weight")
    net.set_reshard_after_forward(False)
    tokens, targets = batches(4, 1)[0]
    check_freed_after_forward(net, tokens, targets, False)
    kept = Net(1)
    fully_shard(kept, ignored_params=[kept.head.bias])
    check(dict(kept.named_parameters())["head.bias"].shape == (VOCAB,), "ignored_params sharded")
    same_state(full_state_dict(kept), reference.state_dict(), "ignored_params")
    torch.manual_seed(4)
    stack = torch.nn.Sequential(Block(), Block())       # a root with no parameters of its own
    stack_reference = torch.nn.Sequential(Block(), Block())
    stack_reference.load_state_dict(stack.state_dict())
    for block in stack:
        fully_shard(block)
    fully_shard(stack)
    x = torch.randn(2, WIDTH)
    check(torch.allclose(stack(x), stack_reference(x), rtol=1e-6, atol=1e-6), "stack forward")
    same_state(full_state_dict(stack), stack_reference.state_dict(), "a root without parameters")
    tied_reference, tied = Net(3), Net(3)
    for model in (tied_reference, tied):
        model.head.weight = model.emb.weight
    for block in tied.blocks:
        fully_shard(block)
    fully_shard(tied)
    ref_opt = torch.optim.SGD(tied_reference.parameters(), lr=0.2, momentum=0.9)
    opt = torch.optim.SGD(tied.parameters(), lr=0.2, momentum=0.9)
    for tokens, targets in batches(8, 2):
        for model, optimizer, rows in ((tied_reference, ref_opt, slice(None)),
                                       (tied, opt, slice(rank * ROWS, (rank + 1) * ROWS))):
            optimizer.zero_grad()
            loss_of(model, tokens[rows], targets[rows]).backward()
            optimizer.step()
    same_state(full_state_dict(tied), tied_reference.state_dict(), "tied embedding and head")


def errors():
    net = sharded(1)
    raises(ValueError, lambda: fully_shard(net), "already wrapped")
    raises(ValueError, lambda: net.set_modules_to_forward_prefetch([Net(1)]), "not wrapped")
    raises(ValueError, lambda: fully_shard(net.blocks[0]), "already wrapped")
    raises(ValueError, lambda: fully_shard(Net(1), reshard_after_forward=3), "=3", "divide")
    raises(TypeError, lambda: fully_shard(Net(1), reshard_after_forward="2"), "True, False")
    raises(TypeError, lambda: fully_shard(Net(1), mp_policy=object()), "MixedPrecisionPolicy")
    raises(TypeError, lambda: fully_shard(Net(1), mp_policy=MixedPrecisionPolicy(torch.int8)),
           "param_dtype")
    raises(TypeError, lambda: fully_shard(Net(1), offload_policy=True), "CPUOffloadPolicy")
    raises(TypeError, lambda: fully_shard(Net(1), shard_placement_fn=len), "returned 11",
           "Shard(dim)")
    raises(ValueError, lambda: fully_shard(Net(1), shard_placement_fn=lambda p: Shard(2)),
           "Shard(2)", "out of range")
    top_down = fully_shard(Net(1))
    raises(ValueError, lambda: fully_shard(top_down.blocks[0]), "bottom-up")
    tied = Net(1)
    tied.blocks[1].lin.weight = tied.blocks[0].lin.weight
    fully_shard(tied.blocks[0])
    raises(ValueError, lambda: fully_shard(tied.blocks[1]), "shared with", "ignored_params")
    early = Net(1)
    optimizer = torch.optim.SGD(early.parameters(), lr=0.1)
    for block in early.blocks:
        fully_shard(block)
    raises(RuntimeError, optimizer.step, "build the optimizer after fully_shard")
    others = [hvd.add_process_set([r]) for r in range(size)]
    raises(ValueError, lambda: fully_shard(Net(1), mesh=others[1 - rank]), f"rank {rank} is not in")
    mesh = hvd.ProcessMesh((1, 1, size), ("a", "b", "c"))
    raises(NotImplementedError, lambda: fully_shard(Net(1), mesh=mesh), "2-D")
    check(isinstance(net, FSDPModule) and isinstance(net, Net), "class not extended")


def mixed_precision():
    """bfloat16 compute with a float32 reduction, 3 SGD steps: within bfloat16's rounding of
    the float32 run; the shards, their gradients and the outputs stay float32."""
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    reference, net = Net(1), Net(1)
    for block in net.blocks:            # the blocks pass bfloat16 on; the root gives float32
        fully_shard(block, mp_policy=policy)
    fully_shard(net, mp_policy=MixedPrecisionPolicy(torch.bfloat16, torch.float32, torch.float32))
    seen = []
    net.blocks[0].lin.register_forward_hook(lambda m, i, o: seen.append((m.weight.dtype,
                                                                         i[0].dtype)))
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.2, momentum=0.9)
    opt = torch.optim.SGD(net.parameters(), lr=0.2, momentum=0.9)
    for tokens, targets in batches(7, 3):
        ref_opt.zero_grad()
        loss_of(reference, tokens, targets).backward()
        ref_opt.step()
        opt.zero_grad()
        out = net(mine(tokens))
        check(out.dtype == torch.float32, f"output_dtype: {out.dtype}")
        F.cross_entropy(out.reshape(-1, VOCAB), mine(targets).reshape(-1)).backward()
        check(all(p.dtype == p.grad.dtype == torch.float32 for p in net.parameters()),
              "shards or their gradients not float32")
        opt.step()
    check(seen == [(torch.bfloat16, torch.bfloat16)] * 3, f"computed in {seen}")
    got, want = full_state_dict(net), reference.state_dict()
    worst = max((got[k] - want[k]).abs().max().item() for k in want)
    check(all(v.dtype == torch.float32 for v in got.values()), "master parameters not float32")
    check(worst < MIXED_PRECISION_TOLERANCE, f"bfloat16 run off by {worst:.3g}")
    check(worst > 0, "bfloat16 run equals the float32 one exactly: not computed in bfloat16")
    cast_at_boundaries(policy)


def cast_at_boundaries(policy):
    """cast_forward_inputs casts a float32 input to bfloat16; a root without parameters of its
    own still casts its output to output_dtype."""
    torch.manual_seed(4)
    stack, reference = torch.nn.Sequential(Block(), Block()), torch.nn.Sequential(Block(), Block())
    reference.load_state_dict(stack.state_dict())
    for block in stack:
        fully_shard(block, mp_policy=policy)
    fully_shard(stack, mp_policy=MixedPrecisionPolicy(output_dtype=torch.float32))
    seen = []
    stack[0].lin.register_forward_hook(lambda m, i, o: seen.append(i[0].dtype))
    x = torch.randn(3, WIDTH)
    out = stack(x)
    check(seen == [torch.bfloat16] and out.dtype == torch.float32,
          f"inputs computed in {seen}, output {out.dtype}")
    worst = (out - reference(x)).abs().max().item()
    check(worst < MIXED_PRECISION_TOLERANCE * 10, f"bfloat16 forward off by {worst:.3g}")


# bfloat16 keeps 8 bits of mantissa (relative error 2^-9 per rounding): after 3 steps of lr 0.2
# the parameters (|values| < 1.5) are about 1e-3 from the float32 run; 5x that is allowed.
MIXED_PRECISION_TOLERANCE = 5e-3


def offloaded():
    """CPUOffloadPolicy: the shards, gradients and Adam's state in host memory, the training
    bit for bit the one without offloading (on a CPU-only machine the module's device is the
    host too, so this checks the bookkeeping; the copies matter with GPUs)."""
    runs = []
    for policy in (CPUOffloadPolicy(), None):
        net = sharded(1, offload_policy=policy)
        opt = torch.optim.Adam(net.parameters(), lr=0.01)
        for tokens, targets in batches(7, 2):
            opt.zero_grad()
            loss_of(net, mine(tokens), mine(targets)).backward()
            opt.step()
        states = [t for s in opt.state.values() for t in s.values() if t.dim() > 0]
        check(all(t.device.type == "cpu" for t in list(net.parameters()) + states),
              "offloaded shards or optimizer state not in host memory")
        runs.append(full_state_dict(net))
    check(all(torch.equal(runs[0][k], runs[1][k]) for k in runs[1]), "offloading changed results")


if __name__ == "__main__" and mode == "train":
    for reshard in (True, False):
        train_and_compare(torch.optim.SGD, {"lr": 0.2, "momentum": 0.9}, reshard)
    reference, net = train_and_compare(torch.optim.Adam, {"lr": 0.01}, True)
    train_and_compare(torch.optim.Adam, {"lr": 0.01}, False)
    train_and_compare(torch.optim.Adam, {"lr": 0.01}, True, prefetch=True)
    gradient_accumulation()
    state_dicts(reference, net)
    switches_and_ties()
    errors()
    mixed_precision()
    offloaded()
    print(f"rank {rank}: fsdp train OK", flush=True)
elif __name__ == "__main__" and mode == "four":
    # Over a 1-D mesh of the whole job (ProcessMesh): the same as over the global set.
    train_and_compare(torch.optim.Adam, {"lr": 0.01}, True, mesh=hvd.ProcessMesh((4,), ("dp",)))
    # HSDP: each module sharded over 2 ranks (1/2 of it each), replicated over the other 2.
    hsdp = hvd.ProcessMesh((2, 2), ("replicate", "shard"))
    train_and_compare(torch.optim.Adam, {"lr": 0.01}, True, mesh=hsdp)
    # Resharded to pairs after the forward: the backward gathers inside each pair.
    train_and_compare(torch.optim.SGD, {"lr": 0.2, "momentum": 0.9}, 2)
    switched = sharded(1)
    switched.set_reshard_after_forward(2)
    check_freed_after_forward(switched, *batches(4, 1)[0], 2)
    print(f"rank {rank}: fsdp four OK", flush=True)
