"""hvd.allreduce_'s fast path (_core.run_plain, csrc/python/plain_tensor.h) against NumPy: on a
plain tensor (a contiguous CPU torch.Tensor itself, of any dtype the core takes) it reduces in
place; on anything else it does nothing and returns None, and allreduce_ takes the general path
with the same result or the same error; a failure comes back as (code, message)."""

import numpy as np
import torch

import horovodlike.torch as hvd
from horovodlike.common.exceptions import TensorMismatchError
from horovodlike.torch import _queue

hvd.init()
rank, size = hvd.rank(), hvd.size()
ALLREDUCE = hvd.mpi_ops._OP_ALLREDUCE


def values(dtype, n=7):
    """Rank-dependent inputs and their sum over the ranks, computed with NumPy (float64)."""
    base = np.arange(n, dtype=np.float64) % 5
    mine = base + rank
    expected = sum(base + r for r in range(size))
    return torch.tensor(mine).to(dtype), expected


# Every dtype the core takes goes through the fast path and sums as NumPy does.
for dtype in _queue._DTYPES:
    if dtype == torch.bool:
        tensor = torch.tensor([rank == 0, False, True])
        assert _queue._run_plain(ALLREDUCE, f"plain.{dtype}", tensor, hvd.Max, 1.0, 1.0) is True
        assert tensor.tolist() == [True, False, True], tensor
        continue
    tensor, expected = values(dtype)
    done = _queue._run_plain(ALLREDUCE, f"plain.{dtype}", tensor, hvd.Sum, 1.0, 1.0)
    assert done is True, (dtype, done)
    np.testing.assert_allclose(tensor.double().numpy(), expected, rtol=1e-2, err_msg=str(dtype))

# Scales as ints and floats; the average of hvd.allreduce_ with op=hvd.Average.
tensor, expected = values(torch.float64)
assert _queue._run_plain(ALLREDUCE, "plain.scaled", tensor, hvd.Sum, 2, 0.5) is True
np.testing.assert_allclose(tensor.numpy(), expected)
tensor, expected = values(torch.float32, n=1000)
hvd.allreduce_(tensor, op=hvd.Average, name="plain.average")
np.testing.assert_allclose(tensor.numpy(), expected / size, rtol=1e-6)

# Not plain: nothing done (the tensor unchanged), None; allreduce_ then gives the same sum.
source, expected = values(torch.float32, n=8)
parameter = torch.nn.Parameter(source.clone(), requires_grad=False)
not_plain = {
    "a subclass": (parameter, hvd.Sum, 1.0),
    "not contiguous": (source.clone().view(2, 4).t(), hvd.Sum, 1.0),
    "sparse": (source.clone().to_sparse(), hvd.Sum, 1.0),
    "op None": (source.clone(), None, 1.0),
    "op a bool": (source.clone(), True, 1.0),
    "op unknown": (source.clone(), 99, 1.0),
    "scale a string": (source.clone(), hvd.Sum, "2"),
    "scale a NumPy float": (source.clone(), hvd.Sum, np.float64(2.0)),
}
for why, (tensor, op, scale) in not_plain.items():
    before = tensor.clone()
    assert _queue._run_plain(ALLREDUCE, "plain.no", tensor, op, scale, 1.0) is None, why
    assert torch.equal(tensor.to_dense(), before.to_dense()), why
hvd.allreduce_(parameter, op=hvd.Sum, name="plain.parameter")
np.testing.assert_allclose(parameter.detach().numpy(), expected)
transposed = source.clone().view(2, 4).t()
try:
    hvd.allreduce_(transposed, op=hvd.Sum, name="plain.transposed")
except ValueError as error:  # the general path's error for an in-place non-contiguous tensor
    assert "contiguous" in str(error), error
else:
    np.testing.assert_allclose(transposed.t().reshape(-1).numpy(), expected)
scaled = source.clone()
hvd.allreduce_(scaled, op=hvd.Sum, prescale_factor=np.float64(2.0), name="plain.np_scale")
np.testing.assert_allclose(scaled.numpy(), 2 * expected)

# An asynchronous operation in flight: the fast path steps aside for its name (nothing done)
# and runs other names; the general path refuses the same name while it is in flight (with no
# other wait since it was queued: see test_torch_horovod_rules for names released after one).
pending = torch.ones(4)
handle = hvd.allreduce_async_(pending, op=hvd.Sum, name="plain.pending")
same = torch.ones(4)
assert _queue._run_plain(ALLREDUCE, "plain.pending", same, hvd.Sum, 1.0, 1.0) is None
assert same.tolist() == [1.0] * 4, same
try:
    hvd.allreduce_(torch.ones(4), op=hvd.Sum, name="plain.pending")
except ValueError as error:
    assert "plain.pending" in str(error), error
else:
    raise AssertionError("a name in flight was taken twice")
other = torch.ones(4)
assert _queue._run_plain(ALLREDUCE, "plain.other", other, hvd.Sum, 1.0, 1.0) is True
assert other.tolist() == [float(size)] * 4, other
hvd.synchronize(handle)
assert pending.tolist() == [float(size)] * 4

# A failure comes back from the fast path as (code, message), and allreduce_ raises it.
mismatched = torch.ones(4 + rank)
done = _queue._run_plain(ALLREDUCE, "plain.mismatch", mismatched, hvd.Sum, 1.0, 1.0)
assert isinstance(done, tuple) and "plain.mismatch" in done[1], done
try:
    hvd.allreduce_(torch.ones(4 + rank), op=hvd.Sum, name="plain.mismatch2")
except TensorMismatchError as error:
    assert "plain.mismatch2" in str(error), error
else:
    raise AssertionError("ranks with different shapes did not fail")

hvd.shutdown()
print(f"rank {rank}: plain tensor OK", flush=True)
