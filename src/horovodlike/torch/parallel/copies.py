"""Multi-copy tensor parallelism (MindSpore's multi-copy parallel): the batch is split into
``num_copies`` parts along its batch dimension, and the collective of one part is started
asynchronously and runs while the next part computes.

    RowParallelLinear(..., num_copies=2)     forward: copy 1's allreduce runs while copy 2's
                                              matmul computes, then copy 2's is started and
                                              both are waited for and concatenated
    ColumnParallelLinear(..., num_copies=2)  backward: copy 1's input-gradient allreduce runs
                                              while copy 2's input gradient and then the
                                              weight gradient are computed

Each copy is the same computation on fewer rows, so the result is the single-copy one (rows of
a matmul do not depend on each other; only float rounding inside the matmul may differ). The
collectives are started in the same order on every rank (copy 1, copy 2, ...), so their
automatic names agree.
"""

import contextlib
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
    return started if parts == 1 else synchronize(started)


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
