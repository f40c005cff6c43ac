"""The two exchanges of a sharded table, as one autograd Function: pull (forward) sends each
rank's distinct ids to the ranks holding them and brings their rows back; push (backward) sends
the gradient of each pulled row to its holder, which turns what every rank sent into the
gradient of its shard.

Pull costs two alltoalls (ids, then rows), push one (gradient rows): the holders keep the ids
they were asked for, so the ids do not travel again.
"""

import torch

from horovodlike.torch.mpi_ops import alltoall_async, synchronize


def _alltoall(tensor, splits, name, process_set):
    return synchronize(alltoall_async(tensor.contiguous(), splits, name=name,
                                      process_set=process_set))


class PullRows(torch.autograd.Function):
    """``PullRows.apply(shard, table, unique_ids, counts)``: the rows of ``unique_ids``
    (distinct, int64, on the exchange device), whoever holds them; ``counts`` (how often each
    id occurs here, for scale_grad_by_freq) travel with the ids, or are None. Collective over
    ``table.process_set``: every rank calls it, and later its backward, in the same order."""

    @staticmethod
    def forward(ctx, shard, table, unique_ids, counts):
        owners = table.layout.owner(unique_ids)
        order = torch.argsort(owners, stable=True)
        splits = torch.bincount(owners, minlength=table.layout.set_size).tolist()
        message = unique_ids if counts is None else torch.stack([unique_ids, counts], dim=1)
        asked, asked_splits = _alltoall(message[order], splits, f"{table.name}.ids",
                                        table.process_set)
        asked, asked_counts = (asked, None) if counts is None else (asked[:, 0], asked[:, 1])
        local = table.layout.local_index(asked)
        rows = table.rows_for(shard, local)
        returned, _ = _alltoall(rows, asked_splits, f"{table.name}.rows", table.process_set)
        pulled = torch.empty_like(returned)
        pulled[order] = returned
        ctx.table, ctx.order, ctx.splits = table, order, splits
        ctx.asked_counts = asked_counts
        ctx.save_for_backward(asked, local)
        ctx.shard_shape = shard.shape
        return pulled

    @staticmethod
    def backward(ctx, grad_pulled):
        asked, local = ctx.saved_tensors
        table = ctx.table
        received, _ = _alltoall(grad_pulled[ctx.order], ctx.splits, f"{table.name}.grads",
                                table.process_set)
        return (table.shard_gradient(asked, local, received, ctx.shard_shape, ctx.asked_counts),
                None, None, None)
