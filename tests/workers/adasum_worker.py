"""op=hvd.Adasum against a NumPy replay of the same recursive pairing in float64; all ranks
bit-identical; clear errors for integer dtypes and a rank count that is not a power of two;
DistributedOptimizer(op=Adasum) against a replica that combines the per-rank updates."""

import numpy as np
import torch

import horovodlike.torch as hvd
from common import check, expect_error
from reference import expected_adasum

hvd.init()
rank, size = hvd.rank(), hvd.size()
torch.set_num_threads(1)


if size & (size - 1):
    # Every rank raises at once, before anything is sent; the job then goes on.
    expect_error(lambda: hvd.allreduce(torch.ones(3), op=hvd.Adasum, name="odd"),
                 "'odd'", "power-of-two", f"has {size}")
    check(hvd.allreduce(torch.ones(3), op=hvd.Sum, name="after").tolist() == [size] * 3,
          "the job did not go on after the Adasum error")
    print(f"rank {rank}: adasum OK", flush=True)
    raise SystemExit(0)


def rank_values(seed, r, count):
    """Per-rank values that share a common direction, so the combination is not a plain sum."""
    gen = np.random.default_rng(seed)
    common = gen.standard_normal(count)
    return common + 0.5 * np.random.default_rng([seed, r]).standard_normal(count)


def all_identical(tensor, name):
    gathered = hvd.allgather(tensor.reshape(1, -1).view(torch.uint8), name=f"{name}.bits")
    return all(torch.equal(gathered[0], gathered[r]) for r in range(size))


TOLERANCE = {np.float16: 2e-3, np.float32: 1e-6, np.float64: 1e-12}
TORCH = {np.float16: torch.float16, np.float32: torch.float32, np.float64: torch.float64}
checks = 0
for dtype in (np.float32, np.float64, np.float16):
    # Sizes: tiny, odd, all zero (index 2), and one of 1 MiB or more in float32 and float64
    # (reduced in place, outside the fusion buffer).
    counts = [1, 1001, 64, 300_000 if dtype != np.float16 else 600_000]
    vectors = [[rank_values(7 + i, r, c) for r in range(size)] for i, c in enumerate(counts)]
    for r in range(size):
        vectors[2][r] = np.zeros(counts[2])
    tag = np.dtype(dtype).name
    inputs = [torch.from_numpy(v[rank].astype(dtype)) for v in vectors]
    results = {"single": [hvd.allreduce(t, op=hvd.Adasum, name=f"one.{tag}.{i}")
                          for i, t in enumerate(inputs)],
               "grouped": hvd.grouped_allreduce(inputs, op=hvd.Adasum, name=f"group.{tag}")}
    for how, outputs in results.items():
        for i, out in enumerate(outputs):
            check(out.dtype == TORCH[dtype], f"{how} {tag}: dtype {out.dtype}")
            want = expected_adasum([v for v in vectors[i]], dtype)
            got = out.numpy().astype(np.float64)
            scale = max(1.0, float(np.abs(want).max()))
            error = float(np.abs(got - want).max()) / scale
            check(error <= TOLERANCE[dtype],
                  f"{how} {tag} tensor {i} ({counts[i]} elements): error {error:.3g}")
            if i == 2:
                check(not got.any(), f"{how} {tag}: the all-zero tensor is not zero")
            check(all_identical(out, f"{how}.{tag}.{i}"), f"{how} {tag} {i}: ranks differ")
            checks += 1
    # Not the plain sum: the shared direction is counted about once.
    plain = sum(v.astype(np.float64) for v in vectors[1])
    check(not np.allclose(results["single"][1].numpy().astype(np.float64), plain, rtol=1e-2),
          "Adasum equals the plain sum")

# Prescale and postscale apply as for Sum; nothing is divided by the size.
values = [rank_values(3, r, 50) for r in range(size)]
out = hvd.allreduce(torch.from_numpy(values[rank]), op=hvd.Adasum, name="scaled",
                    prescale_factor=2.0, postscale_factor=0.25)
check(np.allclose(out.numpy(), 0.5 * expected_adasum(values, np.float64), rtol=1e-12),
      "prescale/postscale not applied as for Sum")
check(np.allclose(hvd.allreduce(torch.from_numpy(values[rank]), op=hvd.Adasum,
                                name="unscaled").numpy(),
                  expected_adasum(values, np.float64), rtol=1e-12), "unscaled result differs")

expect_error(lambda: hvd.allreduce(torch.ones(3, dtype=torch.int32), op=hvd.Adasum,
                                   name="ints"), "'ints'", "int32")
# As in Horovod, reducescatter refuses Adasum with a RuntimeError (NotImplementedError).
try:
    hvd.reducescatter(torch.ones(2 * size), op=hvd.Adasum, name="rs")
    raise AssertionError("reducescatter accepted op=hvd.Adasum")
except NotImplementedError as e:
    check("Adasum" in str(e), f"unclear error: {e}")
expect_error(lambda: hvd.DistributedOptimizer(torch.optim.SGD([torch.zeros(1)], lr=1),
                                              op=hvd.Adasum, gradient_predivide_factor=2.0),
             "gradient_predivide_factor")


# ---- DistributedOptimizer(op=Adasum): each rank's update combined with Adasum
def make_model():
    torch.manual_seed(11)
    return torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(),
                               torch.nn.Linear(7, 2)).double()


def batch(r):
    gen = torch.Generator().manual_seed(100 + r)
    return torch.randn(6, 5, generator=gen, dtype=torch.float64), \
        torch.randn(6, 2, generator=gen, dtype=torch.float64)


def local_updates(optimizer_class, steps_done_states, **kwargs):
    """Each rank's change of every parameter after one local step of a fresh optimizer."""
    updates = []
    for r in range(size):
        model = make_model()
        opt = optimizer_class(model.parameters(), **kwargs)
        x, y = batch(r)
        torch.nn.functional.mse_loss(model(x), y).backward()
        before = [p.detach().clone() for p in model.parameters()]
        opt.step()
        updates.append([(p.detach() - b).numpy() for p, b in zip(model.parameters(), before)])
    return updates


for optimizer_class, kwargs in ((torch.optim.SGD, {"lr": 0.1}),
                                # Adam's first step is lr * sign(g) when eps is small, so two
                                # ranks' updates of a bias can cancel exactly, and Adasum then
                                # divides rounding noise by a vanishing norm: a larger eps keeps
                                # each update proportional to its gradient.
                                (torch.optim.Adam, {"lr": 0.01, "eps": 0.1})):
    model = make_model()
    start = [p.detach().clone() for p in model.parameters()]
    opt = hvd.DistributedOptimizer(optimizer_class(model.parameters(), **kwargs),
                                   named_parameters=model.named_parameters(), op=hvd.Adasum)
    x, y = batch(rank)
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    updates = local_updates(optimizer_class, None, **kwargs)
    for i, (p, s) in enumerate(zip(model.parameters(), start)):
        want = s.numpy() + expected_adasum([u[i].ravel() for u in updates],
                                           np.float64).reshape(s.shape)
        check(np.allclose(p.detach().numpy(), want, rtol=1e-10, atol=1e-12),
              f"{optimizer_class.__name__}: parameter {i} differs from the replica")
        check(all_identical(p.detach(), f"opt.{optimizer_class.__name__}.{i}"),
              "parameters differ across ranks")
    if optimizer_class is torch.optim.SGD:
        # Plain SGD: the step is -lr times the Adasum of the per-rank gradients.
        grads = []
        for r in range(size):
            m = make_model()
            xr, yr = batch(r)
            torch.nn.functional.mse_loss(m(xr), yr).backward()
            grads.append([q.grad.numpy().ravel() for q in m.parameters()])
        for i, (p, s) in enumerate(zip(model.parameters(), start)):
            want = s.numpy() - 0.1 * expected_adasum([g[i] for g in grads],
                                                     np.float64).reshape(s.shape)
            check(np.allclose(p.detach().numpy(), want, rtol=1e-10, atol=1e-12),
                  f"SGD step {i} is not -lr * Adasum(gradients)")
        # The same step from two half-batch passes, the first accumulated inside no_sync.
        halves = make_model()
        opt_halves = hvd.DistributedOptimizer(torch.optim.SGD(halves.parameters(), lr=0.1),
                                              named_parameters=halves.named_parameters(),
                                              op=hvd.Adasum)
        with opt_halves.no_sync():
            (0.5 * torch.nn.functional.mse_loss(halves(x[:3]), y[:3])).backward()
        (0.5 * torch.nn.functional.mse_loss(halves(x[3:]), y[3:])).backward()
        opt_halves.step()
        for i, (p, q) in enumerate(zip(halves.parameters(), model.parameters())):
            check(torch.allclose(p, q, rtol=1e-10, atol=1e-12),
                  f"SGD step {i} from passes in no_sync differs from the one-pass step")
    opt.zero_grad()
    checks += 1

print(f"rank {rank}: {checks} Adasum checks passed; adasum OK", flush=True)
