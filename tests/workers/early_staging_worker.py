"""Small allreduces staged before the negotiation (HOROVOD_EARLY_STAGING), against NumPy.

Every rank draws every rank's inputs from one seed, so each checks its result against the
reduction NumPy computes in float64. The calls mix what the early staging must tell apart:
  steady     one tensor at a time, seen before (the case it speeds up), Sum and Average, with
             and without pre- and postscaling, several dtypes and sizes around the one-round
             algorithm's limits
  crossed    each rank has a different tensor ready first (even ranks start "p", odd ranks "q"
             asynchronously), so the ranks stage different tensors in the same round
  pairs      two tensors ready at once (no staging), then one again
Prints the core's early_staged_allreduces and allreduce_collectives counters.
"""

import json

import numpy as np
import torch

import horovodlike.torch as hvd
from horovodlike import _core
from common import check

hvd.init()
rank, size = hvd.rank(), hvd.size()
rng = np.random.default_rng(20261127)
DTYPES = {"float32": (torch.float32, 1e-5), "float64": (torch.float64, 1e-12),
          "int32": (torch.int32, 0)}


def inputs(count, dtype):
    """Every rank's input (the same draws on every rank), as NumPy arrays of `dtype`."""
    if dtype == "int32":
        return [rng.integers(-1000, 1000, count).astype(np.int32) for _ in range(size)]
    return [rng.standard_normal(count).astype(dtype) for _ in range(size)]


def reduce_and_check(name, count, dtype="float32", op=hvd.Sum, prescale=1.0, postscale=1.0):
    data = inputs(count, dtype)
    torch_dtype, rtol = DTYPES[dtype]
    tensor = torch.from_numpy(data[rank].copy()).to(torch_dtype)
    hvd.allreduce_(tensor, op=op, name=name, prescale_factor=prescale,
                   postscale_factor=postscale)
    expected = sum(d.astype(np.float64) * prescale for d in data) * postscale
    if op == hvd.Average:
        expected = expected / size
    got = tensor.numpy().astype(np.float64)
    if dtype == "int32":
        check(np.array_equal(got, expected), f"{name}: {got[:4]} != {expected[:4]}")
    else:
        check(np.allclose(got, expected, rtol=rtol, atol=rtol),
              f"{name}: max error {np.max(np.abs(got - expected))}")


# steady: the same few tensors again and again (sizes below, at and above 16 KiB, where the
# one-round algorithm stops being staged early, and a sliced one of 256 KiB)
cases = [(1, "float32"), (7, "float64"), (1024, "float32"), (4095, "float32"),
         (4096, "float32"), (16384, "float32"), (1000, "int32"), (65536, "float32")]
for step in range(240):
    count, dtype = cases[step % len(cases)]
    op = hvd.Average if (step // len(cases)) % 2 and dtype != "int32" else hvd.Sum
    scaled = (step // (2 * len(cases))) % 2 == 1 and dtype != "int32"
    prescale, postscale = (0.5, 3.0) if scaled else (1.0, 1.0)
    reduce_and_check(f"steady.{count}.{dtype}.{op}.{scaled}", count, dtype, op, prescale,
                     postscale)

# crossed: ranks start different tensors first; each round one tensor per rank is ready
for step in range(60):
    data_p, data_q = inputs(512, "float32"), inputs(512, "float32")
    p = torch.from_numpy(data_p[rank].copy())
    q = torch.from_numpy(data_q[rank].copy())
    first, second = (p, q) if rank % 2 == 0 else (q, p)
    names = ("crossed.p", "crossed.q") if rank % 2 == 0 else ("crossed.q", "crossed.p")
    handle = hvd.allreduce_async_(first, op=hvd.Sum, name=names[0])
    hvd.allreduce_(second, op=hvd.Sum, name=names[1])
    hvd.synchronize(handle)
    for tensor, data, what in ((p, data_p, "p"), (q, data_q, "q")):
        expected = sum(d.astype(np.float64) for d in data)
        check(np.allclose(tensor.numpy(), expected, rtol=1e-5, atol=1e-5),
              f"crossed {what} step {step}: max error "
              f"{np.max(np.abs(tensor.numpy() - expected))}")

# pairs: two tensors in one round, then a single one that is staged again
for step in range(40):
    data_a, data_b = inputs(256, "float32"), inputs(300, "float32")
    a = torch.from_numpy(data_a[rank].copy())
    b = torch.from_numpy(data_b[rank].copy())
    handles = [hvd.allreduce_async_(a, op=hvd.Sum, name="pair.a"),
               hvd.allreduce_async_(b, op=hvd.Sum, name="pair.b")]
    for handle in handles:
        hvd.synchronize(handle)
    check(np.allclose(a.numpy(), sum(d.astype(np.float64) for d in data_a), rtol=1e-5,
                      atol=1e-5), f"pair a step {step}")
    check(np.allclose(b.numpy(), sum(d.astype(np.float64) for d in data_b), rtol=1e-5,
                      atol=1e-5), f"pair b step {step}")
    reduce_and_check("pair.single", 1024)

stats = _core.stats()
counts = {key: stats[key] for key in ("early_staged_allreduces", "allreduce_collectives")}
print(f"rank {rank}: STAGING {json.dumps(counts)}", flush=True)
hvd.shutdown()
