"""The communication patterns of tensor parallelism, each an autograd Function with its
gradient beside it (Megatron's copy/reduce, split/gather, and the sequence-parallel pair).

Every function takes the process set of the tensor-parallel group; a rank's piece is the one at
its index in the set's ranks (ascending global ranks), the order allgather concatenates in. The
split/gather pairs work on the last dimension and the sequence-parallel ones on the first by
default; ``dim=`` picks another (PyTorch's [batch, sequence, hidden] has the sequence at 1).
"""

import torch

from horovodlike.common import basics
from horovodlike.common.process_sets import global_process_set, set_ranks
from horovodlike.torch.mpi_ops import Sum, allgather_async, allreduce_async, reducescatter_async
from horovodlike.torch.parallel.copies import wait


def group_size(process_set):
    return len(set_ranks(process_set))


def group_rank(process_set):
    ranks = set_ranks(process_set)
    if basics.rank() not in ranks:
        raise ValueError(f"rank {basics.rank()} is not in the tensor-parallel set {ranks}")
    return ranks.index(basics.rank())


def divide(numerator, denominator, what):
    """``numerator / denominator``, or a clear error naming ``what`` when it does not divide."""
    if numerator % denominator != 0:
        raise ValueError(f"{what} = {numerator} is not divisible by the {denominator} ranks it "
                         "is split over; choose a size that is a multiple of the split")
    return numerator // denominator


def _allreduce_sum(tensor, process_set):
    if group_size(process_set) == 1:
        return tensor
    return wait(allreduce_async(tensor.contiguous(), op=Sum, process_set=process_set))


def _gather_first(tensor, process_set):
    if group_size(process_set) == 1:
        return tensor
    return wait(allgather_async(tensor.contiguous(), process_set=process_set))


def _reduce_scatter_first(tensor, process_set):
    if group_size(process_set) == 1:
        return tensor
    n = group_size(process_set)
    divide(tensor.shape[0], n, "the split (sequence) dimension")
    return wait(reducescatter_async(tensor.contiguous(), op=Sum, process_set=process_set))


def _split_last(tensor, process_set):
    n = group_size(process_set)
    chunk = divide(tensor.shape[-1], n, "the split dimension")
    start = group_rank(process_set) * chunk
    return tensor[..., start:start + chunk].contiguous()


def _gather_last(tensor, process_set):
    if group_size(process_set) == 1:
        return tensor
    # allgather concatenates along the first dimension: move the last one there and back.
    moved = tensor.movedim(-1, 0).contiguous()
    return _gather_first(moved, process_set).movedim(0, -1).contiguous()


def _split_first(tensor, process_set):
    n = group_size(process_set)
    chunk = divide(tensor.shape[0], n, "the split (sequence) dimension")
    start = group_rank(process_set) * chunk
    return tensor[start:start + chunk].contiguous()


class _CopyToRegion(torch.autograd.Function):
    """Identity forward; allreduce (sum) of the gradient: the input feeds every rank's part."""

    @staticmethod
    def forward(ctx, tensor, process_set):
        ctx.process_set = process_set
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, grad):
        return _allreduce_sum(grad, ctx.process_set), None


class _ReduceFromRegion(torch.autograd.Function):
    """Allreduce (sum) of partial results forward; the gradient passes through unchanged."""

    @staticmethod
    def forward(ctx, tensor, process_set):
        return _allreduce_sum(tensor, process_set)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _ScatterToRegion(torch.autograd.Function):
    """Keep this rank's slice of the last dimension; gather the gradient's slices back."""

    @staticmethod
    def forward(ctx, tensor, process_set):
        ctx.process_set = process_set
        return _split_last(tensor, process_set)

    @staticmethod
    def backward(ctx, grad):
        return _gather_last(grad, ctx.process_set), None


class _GatherFromRegion(torch.autograd.Function):
    """Concatenate every rank's slice along the last dimension; the gradient is split."""

    @staticmethod
    def forward(ctx, tensor, process_set):
        ctx.process_set = process_set
        return _gather_last(tensor, process_set)

    @staticmethod
    def backward(ctx, grad):
        return _split_last(grad, ctx.process_set), None


class _GatherFromSequenceRegion(torch.autograd.Function):
    """Sequence parallel in: allgather along the first (sequence) dimension; the gradient is
    reduce-scattered (every rank's output used the whole sequence)."""

    @staticmethod
    def forward(ctx, tensor, process_set):
        ctx.process_set = process_set
        return _gather_first(tensor, process_set)

    @staticmethod
    def backward(ctx, grad):
        return _reduce_scatter_first(grad, ctx.process_set), None


class _ReduceScatterToSequenceRegion(torch.autograd.Function):
    """Sequence parallel out: partial sums reduce-scattered along the sequence; the gradient
    is allgathered."""

    @staticmethod
    def forward(ctx, tensor, process_set):
        ctx.process_set = process_set
        return _reduce_scatter_first(tensor, process_set)

    @staticmethod
    def backward(ctx, grad):
        return _gather_first(grad, ctx.process_set), None


class _ScatterToSequenceRegion(torch.autograd.Function):
    """Keep this rank's slice of the sequence; the gradient's slices are gathered back."""

    @staticmethod
    def forward(ctx, tensor, process_set):
        ctx.process_set = process_set
        return _split_first(tensor, process_set)

    @staticmethod
    def backward(ctx, grad):
        return _gather_first(grad, ctx.process_set), None


def _along(function, tensor, process_set, dim, home):
    """``function`` works on dimension ``home`` (0 or -1): apply it to ``dim`` by moving that
    dimension there and back (the moves are views, their gradients free)."""
    if dim % tensor.dim() == home % tensor.dim():
        return function.apply(tensor, process_set)
    return function.apply(tensor.movedim(dim, home), process_set).movedim(home, dim)


def copy_to_tensor_model_parallel_region(tensor, process_set=global_process_set):
    return _CopyToRegion.apply(tensor, process_set)


def reduce_from_tensor_model_parallel_region(tensor, process_set=global_process_set):
    return _ReduceFromRegion.apply(tensor, process_set)


def scatter_to_tensor_model_parallel_region(tensor, process_set=global_process_set, dim=-1):
    return _along(_ScatterToRegion, tensor, process_set, dim, -1)


def gather_from_tensor_model_parallel_region(tensor, process_set=global_process_set, dim=-1):
    return _along(_GatherFromRegion, tensor, process_set, dim, -1)


def gather_from_sequence_parallel_region(tensor, process_set=global_process_set, dim=0):
    return _along(_GatherFromSequenceRegion, tensor, process_set, dim, 0)


def reduce_scatter_to_sequence_parallel_region(tensor, process_set=global_process_set, dim=0):
    return _along(_ReduceScatterToSequenceRegion, tensor, process_set, dim, 0)


def scatter_to_sequence_parallel_region(tensor, process_set=global_process_set, dim=0):
    return _along(_ScatterToSequenceRegion, tensor, process_set, dim, 0)
