"""fully_shard's implicit prefetching, FSDP2's setters, shard_placement_fn and DeviceMesh,
each against single-process training on the global batch (replayed on every rank).

Modes: "two" (2 ranks: prefetching, the setters, Shard(1) placements) and "four" (4 ranks:
set_requires_all_reduce under HSDP on init_device_mesh's mesh, the DeviceMesh calls,
placements with reshard_after_forward=2 and with HSDP on two dimensions of a 3-D mesh, and a
torch.distributed DeviceMesh).
"""

import io
import socket
import sys

import torch
import torch.nn.functional as F

import horovodlike.torch as hvd
from horovodlike.torch.fsdp import (FSDPModule, Shard, full_state_dict, fully_shard,
                                    init_device_mesh, load_full_state_dict, local_shards)
from common import check, raises
from fsdp_worker import (ROWS, VOCAB, WIDTH, Net, batches, loss_of, mine, rank, same_state,
                         sharded, size)

SGD = (torch.optim.SGD, {"lr": 0.2, "momentum": 0.9})


def reference_step(reference, optimizer, tokens, targets, scale=1.0):
    optimizer.zero_grad()
    (loss_of(reference, tokens, targets) * scale).backward()
    optimizer.step()


def blocks_of(net):
    return list(net.blocks)


def prefetch_observer(net):
    """Records, inside block 0's and block 1's Linear forward, whether the next block's gather
    was started; and in block 1's backward, whether block 0's was."""
    seen = {"forward": [], "backward": []}
    blocks = blocks_of(net)
    for before, after in zip(blocks, blocks[1:]):
        before.lin.register_forward_hook(lambda *_, a=after: seen["forward"].append(
            a._fsdp_group._prefetched is not None))
    blocks[1].lin.register_full_backward_pre_hook(lambda *_: seen["backward"].append(
        blocks[0]._fsdp_group._prefetched is not None))
    return seen


def implicit_prefetch():
    """Without set_modules_to_*_prefetch the next block's gather is under way while a block
    computes (forward) and the previous one's while the backward is in a block; with both
    set to [] none is, and the two train bit for bit alike and as one process does."""
    reference = Net(1)
    ref_opt = torch.optim.Adam(reference.parameters(), lr=0.01)
    nets, observed, optimizers = [], [], []
    for implicit in (True, False):
        net = sharded(1)
        if not implicit:
            for m in net.modules():
                if isinstance(m, FSDPModule):
                    m.set_modules_to_forward_prefetch([])
                    m.set_modules_to_backward_prefetch([])
        nets.append(net)
        observed.append(prefetch_observer(net))
        optimizers.append(torch.optim.Adam(net.parameters(), lr=0.01))
    for step, (tokens, targets) in enumerate(batches(7, 3)):
        reference_step(reference, ref_opt, tokens, targets)
        for net, optimizer in zip(nets, optimizers):
            reference_step(net, optimizer, mine(tokens), mine(targets))
        same_state(full_state_dict(nets[0]), reference.state_dict(), f"prefetch step {step}")
        got, want = full_state_dict(nets[0]), full_state_dict(nets[1])
        check(all(torch.equal(got[k], want[k]) for k in want), "prefetching changed results")
    check(observed[0] == {"forward": [True] * 6, "backward": [True] * 3},
          f"implicit prefetch not started: {observed[0]}")
    check(observed[1] == {"forward": [False] * 6, "backward": [False] * 3},
          f"prefetch started though set to none: {observed[1]}")
    net = nets[0]
    net.blocks[0].set_modules_to_forward_prefetch([net.blocks[2]])    # replaces the implicit
    started = []
    net.blocks[0].lin.register_forward_hook(lambda *_: started.append(
        [b._fsdp_group._prefetched is not None for b in net.blocks[1:]]))
    with torch.no_grad():
        net(mine(batches(3, 1)[0][0]))
    check(started == [[False, True]], f"explicit forward prefetch: {started}")


def is_last_backward():
    """Two micro-batches, both synced: with set_is_last_backward(False) the first backward
    leaves its reduce-scatters under way (no .grad yet); the next last backward, or else the
    optimizer step, completes them. Equals one process on the whole batch."""
    reference, net = Net(2), sharded(2)
    ref_opt, opt = SGD[0](reference.parameters(), **SGD[1]), SGD[0](net.parameters(), **SGD[1])
    half = ROWS // 2
    for step, (tokens, targets) in enumerate(batches(9, 2)):
        reference_step(reference, ref_opt, tokens, targets)
        opt.zero_grad()
        for micro, last in ((slice(0, half), False), (slice(half, ROWS), step == 0)):
            net.set_is_last_backward(last)
            (loss_of(net, mine(tokens)[micro], mine(targets)[micro]) / 2).backward()
            pending = [len(m._fsdp_group.pending) for m in net.modules()
                       if isinstance(m, FSDPModule)]
            complete = all(p.grad is not None for p in net.parameters())
            check(complete == last and (pending == [0] * 4) == last,
                  f"last={last}: gradients complete {complete}, pending {pending}")
        opt.step()
        same_state(full_state_dict(net), reference.state_dict(), f"is_last_backward {step}")
    net.set_is_last_backward(True)


def divide_factor(factor=1.0, mesh=None):
    """Gradients summed over every data-parallel rank (both dimensions with HSDP) and divided
    by ``factor``: size / factor times the global-batch average."""
    reference, net = Net(3), sharded(3, mesh=mesh)
    for m in net.modules():
        if m is net:
            m.set_gradient_divide_factor(factor)
        elif isinstance(m, FSDPModule):
            m.set_reduce_scatter_divide_factor(factor)
    ref_opt, opt = SGD[0](reference.parameters(), **SGD[1]), SGD[0](net.parameters(), **SGD[1])
    for step, (tokens, targets) in enumerate(batches(4, 2)):
        reference_step(reference, ref_opt, tokens, targets, scale=size / factor)
        reference_step(net, opt, mine(tokens), mine(targets))
        same_state(full_state_dict(net), reference.state_dict(),
                   f"divide factor {factor} step {step}")
    raises(ValueError, lambda: net.set_gradient_divide_factor(0), "positive")


def gathers(net):
    return [m._fsdp_group._gathers for m in net.modules() if isinstance(m, FSDPModule)]


def reshard_after_backward():
    """Kept gathered after the backward: the next micro-batch's forward gathers nothing, the
    forward after the optimizer step gathers again, the training equals one process."""
    reference, net = Net(2), sharded(2)
    net.set_reshard_after_backward(False)
    ref_opt, opt = SGD[0](reference.parameters(), **SGD[1]), SGD[0](net.parameters(), **SGD[1])
    half = ROWS // 2
    for step, (tokens, targets) in enumerate(batches(9, 2)):
        reference_step(reference, ref_opt, tokens, targets)
        opt.zero_grad()
        before = gathers(net)
        for micro, sync in ((slice(0, half), False), (slice(half, ROWS), True)):
            net.set_requires_gradient_sync(sync)
            (loss_of(net, mine(tokens)[micro], mine(targets)[micro]) / 2).backward()
            check(hasattr(net.blocks[0].lin, "weight"), "resharded after the backward")
        # Per module: the first forward, its backward (the forward resharded), none in the
        # second forward (still gathered), its backward: 3, where resharding gives 4.
        check([b - a for a, b in zip(before, gathers(net))] == [3] * 4,
              f"gathers {before} -> {gathers(net)}")
        opt.step()
        same_state(full_state_dict(net), reference.state_dict(), f"reshard_after_backward {step}")


class EmbeddingNet(Net):
    """Net whose embedding is a wrapped module of its own (its backward needs no weight)."""

    def wrap(self):
        fully_shard(self.emb)
        for block in self.blocks:
            fully_shard(block)
        return fully_shard(self)


def unshard_in_backward():
    reference, net = Net(5), EmbeddingNet(5).wrap()
    net.emb.set_unshard_in_backward(False)
    ref_opt, opt = SGD[0](reference.parameters(), **SGD[1]), SGD[0](net.parameters(), **SGD[1])
    for step, (tokens, targets) in enumerate(batches(6, 2)):
        before = net.emb._fsdp_group._gathers
        reference_step(reference, ref_opt, tokens, targets)
        reference_step(net, opt, mine(tokens), mine(targets))
        check(net.emb._fsdp_group._gathers - before == 1, "the embedding gathered in backward")
        same_state(full_state_dict(net), reference.state_dict(), f"unshard_in_backward {step}")


def sync_switches():
    net = sharded(1)
    wrapped = [m for m in net.modules() if isinstance(m, FSDPModule)]
    check(all(m.get_requires_gradient_sync() for m in wrapped), "sync off at first")
    net.set_requires_gradient_sync(False, recurse=False)
    check([m.get_requires_gradient_sync() for m in wrapped] == [False, True, True, True],
          "recurse=False")
    net.set_requires_gradient_sync(False)
    check(not any(m.get_requires_gradient_sync() for m in wrapped), "recurse")
    raises(NotImplementedError, lambda: net.set_post_optim_event(None), "set_post_optim_event")


class Failure(Exception):
    pass


def reset_after_failure():
    """An accumulation broken off: the first micro-batch's backward summed its gradients
    without sync, the second's forward raised inside block 1 (block 2's gather prefetched).
    reset_iter_state drops the unsynced sum and the gather; the steps that follow equal one
    process that never saw the broken step."""
    reference, net = Net(4), sharded(4)
    ref_opt, opt = SGD[0](reference.parameters(), **SGD[1]), SGD[0](net.parameters(), **SGD[1])
    fail = []

    def maybe_raise(*_):
        if fail.pop() if fail else False:
            raise Failure("planted")

    net.blocks[1].lin.register_forward_hook(maybe_raise)
    tokens, targets = batches(2, 1)[0]
    net.set_requires_gradient_sync(False)
    loss_of(net, mine(tokens), mine(targets)).backward()
    fail.append(True)
    raises(Failure, lambda: loss_of(net, mine(tokens), mine(targets)), "planted")
    net.reset_iter_state()
    groups = [m._fsdp_group for m in net.modules() if isinstance(m, FSDPModule)]
    check(all(g.unsynced_grad is None and g._prefetched is None and not g.gathered
              for g in groups), "reset_iter_state left gathers or gradients")
    net.set_requires_gradient_sync(True)
    for step, (tokens, targets) in enumerate(batches(5, 2)):
        reference_step(reference, ref_opt, tokens, targets)
        reference_step(net, opt, mine(tokens), mine(targets))
        same_state(full_state_dict(net), reference.state_dict(), f"after reset, step {step}")


def on_columns(param):
    return Shard(1) if param.dim() == 2 else None


def placements(reshard=True, mesh=None, steps=3):
    """Every 2-D parameter sharded along its columns: each rank holds ceil(7 / n) of them;
    training, full and sharded state dicts as without placements."""
    reference = Net(1)
    net = sharded(1, reshard, mesh, shard_placement_fn=on_columns)
    shards = net.blocks[0]._fsdp_layout.set_size
    columns = -(-WIDTH // shards)
    local = local_shards(net)
    check({k: tuple(v.shape) for k, v in local.items() if v.dim() == 2} == {
        "emb.weight": (VOCAB, columns), "head.weight": (VOCAB, columns),
        **{f"blocks.{i}.lin.weight": (WIDTH, columns) for i in range(3)}},
        f"local shard shapes {[(k, tuple(v.shape)) for k, v in local.items()]}")
    index = net.blocks[0]._fsdp_layout.set_rank
    padded = F.pad(reference.blocks[0].lin.weight.detach(), (0, columns * shards - WIDTH))
    check(torch.equal(local["blocks.0.lin.weight"],
                      padded[:, index * columns:(index + 1) * columns]), "Shard(1) chunk values")
    ref_opt = torch.optim.Adam(reference.parameters(), lr=0.01)
    opt = torch.optim.Adam(net.parameters(), lr=0.01)
    for step, (tokens, targets) in enumerate(batches(7, steps)):
        reference_step(reference, ref_opt, tokens, targets)
        reference_step(net, opt, mine(tokens), mine(targets))
        same_state(full_state_dict(net), reference.state_dict(), f"Shard(1) step {step}")
    tokens = batches(3, 1)[0][0]
    fresh = sharded(5, shard_placement_fn=on_columns, mesh=mesh)
    load_full_state_dict(fresh, reference.state_dict())
    buffer = io.BytesIO()
    torch.save(net.state_dict(), buffer)
    buffer.seek(0)
    again = sharded(6, shard_placement_fn=on_columns, mesh=mesh)
    again.load_state_dict(torch.load(buffer))
    with torch.no_grad():
        want = reference(tokens)
        check(torch.allclose(fresh(tokens), want, rtol=1e-5, atol=1e-6), "full state dict load")
        check(torch.equal(again(tokens), net(tokens)), "sharded state dict round trip")


def requires_all_reduce(mesh):
    """HSDP: the first micro-batch reduce-scatters without the all-reduce (no .grad yet), the
    second all-reduces both at once: one all-reduce per step; equals one process."""
    reference, net = Net(2), sharded(2, mesh=mesh)
    ref_opt, opt = SGD[0](reference.parameters(), **SGD[1]), SGD[0](net.parameters(), **SGD[1])
    half = ROWS // 2
    groups = [m._fsdp_group for m in net.modules() if isinstance(m, FSDPModule)]
    for step, (tokens, targets) in enumerate(batches(9, 2)):
        reference_step(reference, ref_opt, tokens, targets)
        opt.zero_grad()
        for micro, all_reduce in ((slice(0, half), False), (slice(half, ROWS), True)):
            net.set_requires_all_reduce(all_reduce)
            (loss_of(net, mine(tokens)[micro], mine(targets)[micro]) / 2).backward()
            complete = all(p.grad is not None for p in net.parameters())
            check(complete == all_reduce, f"all_reduce={all_reduce}: .grad set {complete}")
        check([g._replicas for g in groups] == [step + 1] * 4 and
              [g._scatters for g in groups] == [2 * step + 2] * 4,
              f"all-reduces {[g._replicas for g in groups]}")
        opt.step()
        same_state(full_state_dict(net), reference.state_dict(), f"requires_all_reduce {step}")


def device_mesh_calls(mesh):
    shard = mesh["shard"]
    check(mesh.ndim == 2 and mesh.mesh_dim_names == ("replicate", "shard") and
          mesh.shape == (2, 2) and mesh.size() == 4 and shard.ndim == 1 and shard.size() == 2,
          f"mesh {mesh}, {shard}")
    line = shard.mesh.tolist()
    check(rank in line and shard.get_local_rank() == line.index(rank) ==
          mesh.get_local_rank("shard") and mesh.get_coordinate()[1] == line.index(rank),
          f"local ranks of {rank} in {line}")
    check(sorted(hvd.allgather_object(line, process_set=shard.get_group())) == [line, line],
          "get_group is not this rank's shard line")
    net = sharded(1, mesh=shard)
    check([p.numel() for p in net.parameters()][-1] == (WIDTH * WIDTH + 3 * WIDTH) // 2,
          "mesh['shard'] did not shard over 2 ranks")
    raises(ValueError, lambda: mesh["nope"], "no dimension 'nope'")
    raises(ValueError, lambda: mesh.get_local_rank(), "2 dimensions")


def torch_device_mesh():
    """A DeviceMesh of torch.distributed (Gloo, the same rank numbering) as fully_shard's mesh:
    HSDP training equals one process."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh as torch_init_device_mesh
    port = None
    if rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = hvd.broadcast_object(port, root_rank=0)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=size)
    mesh = torch_init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    reference, net = Net(1), sharded(1, mesh=mesh)
    ref_opt, opt = torch.optim.Adam(reference.parameters(), lr=0.01), \
        torch.optim.Adam(net.parameters(), lr=0.01)
    for step, (tokens, targets) in enumerate(batches(7, 2)):
        reference_step(reference, ref_opt, tokens, targets)
        reference_step(net, opt, mine(tokens), mine(targets))
        same_state(full_state_dict(net), reference.state_dict(), f"torch DeviceMesh {step}")
    dist.destroy_process_group()
    raises(ValueError, lambda: fully_shard(Net(1), mesh=mesh), "not initialized",
           "init_device_mesh")


mode = sys.argv[1]
if mode == "two":
    implicit_prefetch()
    is_last_backward()
    divide_factor()
    reshard_after_backward()
    unshard_in_backward()
    sync_switches()
    reset_after_failure()
    placements()
    print(f"rank {rank}: fsdp features two OK", flush=True)
elif mode == "four":
    hsdp = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    device_mesh_calls(hsdp)
    requires_all_reduce(hsdp)
    divide_factor(2.0, mesh=hsdp)
    placements(reshard=2, steps=2)
    # HSDP on two dimensions of a 3-D mesh, with placements.
    placements(mesh=init_device_mesh("cpu", (1, 2, 2), mesh_dim_names=(
        "pp", "replicate", "shard"))["replicate", "shard"], steps=2)
    torch_device_mesh()
    print(f"rank {rank}: fsdp features four OK", flush=True)
