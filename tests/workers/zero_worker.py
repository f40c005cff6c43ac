"""ZeroRedundancyOptimizer against the unsharded optimizer in one process.

Every rank replays, on its own, single-process training on the global batch with the plain
optimizer (the reference); the sharded run trains on this rank's slice of each batch. The
parameters, the state dict and the per-rank state size are compared. Modes: "train" (the whole
job is the set; shards are uneven, one rank holds an empty shard of a two-element group) and
"mesh" (4 ranks as pp x dp, one ZeRO per dp pair, each pair on its own data).
"""

import sys

import torch

import horovodlike.torch as hvd
from common import check

hvd.init()
rank, size = hvd.rank(), hvd.size()
mode = sys.argv[1] if len(sys.argv) > 1 else "train"
PER_RANK = 4


def build(seed):
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 2))
    extra = torch.nn.Parameter(torch.randn(2, dtype=torch.float64))   # 2 elements < ranks
    return net, extra


def loss_of(net, extra, x, y):
    out = net(x) + extra.to(torch.float32).sum() * 0.1
    return ((out - y) ** 2).mean() + (extra ** 2).sum().to(torch.float32) * 0.01


def groups(net, extra):
    return [{"params": list(net.parameters())}, {"params": [extra], "lr": 0.05}]


def batches(seed, steps, ranks):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(PER_RANK * ranks, 5, generator=g),
             torch.randn(PER_RANK * ranks, 2, generator=g)) for _ in range(steps)]


def params_of(net, extra):
    return [p.detach().clone() for p in net.parameters()] + [extra.detach().clone()]


def close(a, b, what):
    for i, (x, y) in enumerate(zip(a, b)):
        check(torch.allclose(x, y, rtol=1e-5, atol=1e-6),
              f"{what}: parameter {i} differs by {(x - y).abs().max().item():.3g}")


def train(optimizer, scheduler, net, extra, data, part, parts):
    for x, y in data:
        rows = slice(part * PER_RANK, (part + 1) * PER_RANK) if parts > 1 else slice(None)
        optimizer.zero_grad()
        loss_of(net, extra, x[rows], y[rows]).backward()
        optimizer.step()
        scheduler.step()


def state_numel(optimizer):
    return sum(v.numel() for s in optimizer.state.values() for v in s.values()
               if torch.is_tensor(v) and v.dim() > 0)


def compare_state_dicts(mine, reference, what):
    check(sorted(mine["state"]) == sorted(reference["state"]),
          f"{what}: state for {sorted(mine['state'])}, expected {sorted(reference['state'])}")
    for i, expected in reference["state"].items():
        check(sorted(mine["state"][i]) == sorted(expected), f"{what}: keys of state {i}")
        for key, value in expected.items():
            got = mine["state"][i][key]
            if torch.is_tensor(value):
                check(got.shape == value.shape and torch.allclose(got, value, rtol=1e-5,
                                                                  atol=1e-6),
                      f"{what}: state {i}[{key!r}] differs")
            else:
                check(got == value, f"{what}: state {i}[{key!r}] = {got}, expected {value}")
    for g, (a, b) in enumerate(zip(mine["param_groups"], reference["param_groups"])):
        check(a == b, f"{what}: param group {g} is {a}, expected {b}")


def run(optimizer_class, kwargs, process_set, part, parts, data_seed, consolidate_to):
    net, extra = build(0)
    ref_net, ref_extra = build(0)
    zero = hvd.ZeroRedundancyOptimizer(groups(net, extra), optimizer_class,
                                       process_set=process_set, **kwargs)
    reference = optimizer_class(groups(ref_net, ref_extra), **kwargs)
    zero_sched = torch.optim.lr_scheduler.StepLR(zero, step_size=2, gamma=0.5)
    ref_sched = torch.optim.lr_scheduler.StepLR(reference, step_size=2, gamma=0.5)
    data = batches(data_seed, 5, parts)
    train(zero, zero_sched, net, extra, data, part, parts)
    train(reference, ref_sched, ref_net, ref_extra, data, 0, 1)
    what = optimizer_class.__name__
    close(params_of(net, extra), params_of(ref_net, ref_extra), f"{what} after 5 steps")

    # The state is sharded: this rank holds its share of the unsharded state's elements.
    total = state_numel(reference)
    per_rank = hvd.allgather_object(state_numel(zero.optim), process_set=process_set)
    # Buckets of 58 float32 and 2 float64 elements: set rank r holds its reducescatter rows
    # of each, for each per-element state tensor (momentum; Adam's two moments).
    per_element = total // 60
    n = len(per_rank)
    expected = [per_element * sum(m // n + (r < m % n) for m in (58, 2)) for r in range(n)]
    check(per_rank == expected and sum(per_rank) == total,
          f"{what}: per-rank state elements {per_rank}, expected {expected} of {total}")

    # consolidate_state_dict + state_dict on one rank give the unsharded optimizer's dict.
    zero.consolidate_state_dict(to=consolidate_to)
    if rank == consolidate_to:
        compare_state_dicts(zero.state_dict(), reference.state_dict(), what)
    else:
        try:
            zero.state_dict()
            check(False, "state_dict() on a rank that did not consolidate did not raise")
        except RuntimeError as e:
            check("consolidate_state_dict" in str(e), str(e))

    # A fresh sharded optimizer loaded from the reference's dict goes on in step with it.
    net2, extra2 = build(1)
    with torch.no_grad():
        for p, q in zip(params_of(ref_net, ref_extra), list(net2.parameters()) + [extra2]):
            q.copy_(p)
    resumed = hvd.ZeroRedundancyOptimizer(groups(net2, extra2), optimizer_class,
                                          process_set=process_set, **kwargs)
    resumed.load_state_dict(reference.state_dict())
    check(resumed.param_groups[0]["lr"] == reference.param_groups[0]["lr"], "lr not loaded")
    more = batches(data_seed + 1, 3, parts)
    none = torch.optim.lr_scheduler.LambdaLR(resumed, lambda _: 1.0)
    train(resumed, none, net2, extra2, more, part, parts)
    train(reference, torch.optim.lr_scheduler.LambdaLR(reference, lambda _: 1.0), ref_net,
          ref_extra, more, 0, 1)
    close(params_of(net2, extra2), params_of(ref_net, ref_extra), f"{what} after resuming")


CASES = [(torch.optim.SGD, {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.01}),
         (torch.optim.Adam, {"lr": 0.01})]

if mode == "train":
    for optimizer_class, kwargs in CASES:
        run(optimizer_class, kwargs, hvd.global_process_set, rank, size, 7, size - 1)
    try:
        hvd.ZeroRedundancyOptimizer(build(0)[0].parameters(), torch.optim.SGD, lr=0.1) \
            .consolidate_state_dict(to=size)
        check(False, "consolidate_state_dict to a rank outside the set did not raise")
    except ValueError as e:
        check(f"rank {size} is not in" in str(e), str(e))
    try:
        hvd.ZeroRedundancyOptimizer(build(0)[0].parameters(), "sgd")
        check(False, "a string optimizer_class did not raise")
    except TypeError as e:
        check("optimizer_class" in str(e), str(e))
    print(f"rank {rank}: zero train OK", flush=True)

elif mode == "mesh":
    mesh = hvd.ProcessMesh((2, 2), ("pp", "dp"))
    dp = mesh.process_set("dp")
    for optimizer_class, kwargs in CASES:
        # Each dp pair trains on its own data (seed by pp) and consolidates on its first rank.
        run(optimizer_class, kwargs, dp, mesh.coordinate("dp"), 2, 11 + mesh.coordinate("pp"),
            mesh.rank_at(dp=0))
    hvd.barrier()   # the pairs finish at different times; shutdown is job-wide
    print(f"rank {rank}: zero mesh OK", flush=True)
