"""Multi-copy tensor parallelism (MindSpore's multi-copy parallel): the batch is split into
``num_copies`` parts along its batch dimension, and the collective of one part is started
asynchronously and runs while the next part computes.

    RowParallelLinear(..., num_copies=2)     forward: copy 1's allreduce runs while copy 2's
                                              matmul computes, then copy 2's is started and
                                              both are waited for and concatenated
    ColumnParallelLinear(..., num_copies=2)  backward: copy 1's input-gradient allreduce runs
                                              while copy 2's input gradient and then the
                                              weight gradient are computed

    MultiCopy(block, num_copies=2)           the whole block, copies interleaved: while copy
                                              1's collective runs, copy 2 computes up to its
                                              own next collective, and so on

Each copy is the same computation on fewer rows, so the result is the single-copy one (rows of
a matmul do not depend on each other; only float rounding inside the matmul may differ). The
collectives are started in the same order on every rank (copy 1, copy 2, ...), so their
automatic names agree.
"""

import contextlib
import threading
import time

import torch
import torch.nn.functional as F

from horovodlike.torch.mpi_ops import Sum, allreduce_async, synchronize

# Set to a function (label, start, end) (time.perf_counter seconds) to be told when each
# copy's compute ran: benchmarks/multi_copy.py draws it beside the timeline. None: no cost.
trace = None


@contextlib.contextmanager
def _span(label):
    if trace is None:
        yield
        return
    start = time.perf_counter()
    yield
    trace(label, start, time.perf_counter())


def check_num_copies(num_copies, what):
    """``num_copies`` must be a positive int; a clear error naming the layer otherwise."""
    if isinstance(num_copies, bool) or not isinstance(num_copies, int) or num_copies < 1:
        raise ValueError(f"{what}: num_copies must be a positive integer (1: no split), got "
                         f"{num_copies!r}")
    return num_copies


def split_batch(tensor, num_copies, batch_dim, what):
    """The ``num_copies`` parts of ``tensor`` along ``batch_dim``; raises, before anything is
    sent, when the batch does not divide."""
    if tensor.dim() == 0:
        raise ValueError(f"{what}: num_copies={num_copies} splits the batch dimension, but the "
                         "input is a scalar")
    size = tensor.shape[batch_dim]
    if size % num_copies != 0:
        raise ValueError(f"{what}: the batch (dimension {batch_dim}) has {size} rows, which "
                         f"num_copies={num_copies} does not divide; make the batch a multiple "
                         f"of {num_copies} or use another num_copies")
    return tensor.chunk(num_copies, dim=batch_dim)


def _start(tensor, process_set, parts):
    """Starts the sum of ``tensor`` over the set (nothing to send with one rank)."""
    tensor = tensor.contiguous()
    if parts == 1:
        return tensor
    return allreduce_async(tensor, op=Sum, process_set=process_set)


def _finish(started, parts):
    return started if parts == 1 else wait(started)


def _weight_grad(grad, x, weight):
    """d(loss)/d(weight) of y = x W^T summed over every leading dimension."""
    return grad.reshape(-1, weight.shape[0]).t().mm(x.reshape(-1, weight.shape[1]))


class RowLinearCopies(torch.autograd.Function):
    """y = allreduce(x W^T) computed copy by copy, each copy's allreduce started before the
    next copy's matmul. Backward sends nothing (the allreduce's gradient passes through)."""

    @staticmethod
    def forward(ctx, x, weight, process_set, parts, num_copies, batch_dim):
        ctx.save_for_backward(x, weight)
        started = []
        for i, chunk in enumerate(x.chunk(num_copies, dim=batch_dim)):
            with _span(f"copy {i + 1} compute"):
                partial = F.linear(chunk, weight)
            started.append(_start(partial, process_set, parts))
        return torch.cat([_finish(s, parts) for s in started], dim=batch_dim)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        grad_x = grad.matmul(weight) if ctx.needs_input_grad[0] else None
        grad_w = _weight_grad(grad, x, weight) if ctx.needs_input_grad[1] else None
        return grad_x, grad_w, None, None, None, None


class ColumnLinearCopies(torch.autograd.Function):
    """y = x W^T + b (nothing sent forward). Backward: the input gradient of each copy is
    computed and its allreduce started before the next copy's; the weight and bias gradients
    are computed while the last ones run."""

    @staticmethod
    def forward(ctx, x, weight, bias, process_set, parts, num_copies, batch_dim):
        ctx.save_for_backward(x, weight)
        ctx.setup = (process_set, parts, num_copies, batch_dim, bias is not None)
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        process_set, parts, num_copies, batch_dim, has_bias = ctx.setup
        started = []
        if ctx.needs_input_grad[0]:
            for i, chunk in enumerate(grad.chunk(num_copies, dim=batch_dim)):
                with _span(f"copy {i + 1} backward"):
                    part = chunk.matmul(weight)
                started.append(_start(part, process_set, parts))
        with _span("weight gradient"):
            grad_w = _weight_grad(grad, x, weight) if ctx.needs_input_grad[1] else None
            grad_b = (grad.reshape(-1, weight.shape[0]).sum(0)
                      if has_bias and ctx.needs_input_grad[2] else None)
        grad_x = (torch.cat([_finish(s, parts) for s in started], dim=batch_dim)
                  if started else None)
        return grad_x, grad_w, grad_b, None, None, None, None


class _Baton:
    """Whose turn it is to compute, for MultiCopy's copies: one at a time, in a fixed order
    (1, 2, ..., then 1 again), so that every rank starts its collectives in the same order.
    A copy hands the turn on while its collective runs and takes it back afterwards."""

    def __init__(self, num_copies):
        self.condition = threading.Condition()
        self.turn, self.finished = 0, [False] * num_copies

    def wait_for(self, index):
        with self.condition:
            self.condition.wait_for(lambda: self.turn == index)

    def hand_on(self, index, finished=False):
        with self.condition:
            self.finished[index] = self.finished[index] or finished
            n = len(self.finished)
            following = [(index + step) % n for step in range(1, n + 1)]
            self.turn = next((i for i in following if not self.finished[i]), None)
            self.condition.notify_all()


_copy = threading.local()   # .baton and .index in a MultiCopy copy's thread


def wait(handle):
    """``synchronize(handle)``; in a MultiCopy copy, the next copy computes meanwhile."""
    baton = getattr(_copy, "baton", None)
    if baton is None:
        return synchronize(handle)
    baton.hand_on(_copy.index)
    try:
        return synchronize(handle)
    finally:
        baton.wait_for(_copy.index)


def run_interleaved(function, inputs):
    """[function(x) for x in inputs], each in a thread of its own taking turns at every
    collective (see _Baton); the first error raised in a copy is raised here."""
    baton, results, errors = _Baton(len(inputs)), [None] * len(inputs), []
    grad_enabled = torch.is_grad_enabled()

    def copy(index):
        _copy.baton, _copy.index = baton, index
        try:
            baton.wait_for(index)
            with torch.set_grad_enabled(grad_enabled):
                results[index] = function(inputs[index])
        except BaseException as error:   # raised again by the caller's thread
            errors.append(error)
        finally:
            baton.hand_on(index, finished=True)
    threads = [threading.Thread(target=copy, args=(i,), name=f"copy {i + 1}", daemon=True)
               for i in range(len(inputs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


def _concatenate(outputs, dim):
    first = outputs[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(outputs, dim=dim)
    if isinstance(first, tuple):
        return tuple(_concatenate([o[i] for o in outputs], dim) if
                     isinstance(first[i], torch.Tensor) else first[i] for i in range(len(first)))
    raise ValueError(f"MultiCopy: the module returned a {type(first).__name__}; it can join "
                     "tensors and tuples of them along the batch dimension")


class MultiCopy(torch.nn.Module):
    """Runs ``module`` on ``num_copies`` parts of the batch (the first positional input split
    along ``batch_dim``; other arguments go to every copy whole), interleaved: while copy 1's
    tensor-parallel collective runs, copy 2 computes up to its own next collective, then copy 1
    goes on, and so on (MindSpore's multi-copy parallel over a whole block). The outputs are
    concatenated along ``batch_dim``. Backward runs as usual, copy by copy."""

    def __init__(self, module, num_copies=2, batch_dim=0):
        super().__init__()
        self.module = module
        self.num_copies = check_num_copies(num_copies, "MultiCopy")
        self.batch_dim = batch_dim

    def forward(self, x, *args, **kwargs):
        parts = split_batch(x, self.num_copies, self.batch_dim, "MultiCopy")
        if self.num_copies == 1:
            return self.module(x, *args, **kwargs)
        outputs = run_interleaved(lambda part: self.module(part, *args, **kwargs), parts)
        return _concatenate(outputs, self.batch_dim)

    def extra_repr(self):
        return f"num_copies={self.num_copies}, batch_dim={self.batch_dim}"
