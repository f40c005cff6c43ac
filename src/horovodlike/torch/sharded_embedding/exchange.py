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
    """``PullRows.apply(shard, table, unique_ids)``: the rows of ``unique_ids`` (distinct,
    int64, on the exchange device), whoever holds them. Collective over ``table.process_set``:
    every rank calls it, and later its backward, in the same order."""

    @staticmethod
    def forward(ctx, shard, table, unique_ids):
        owners = table.layout.owner(unique_ids)
        order = torch.argsort(owners, stable=True)
        splits = torch.bincount(owners, minlength=table.layout.set_size).tolist()
        asked, asked_splits = _alltoall(unique_ids[order], splits, f"{table.name}.ids",
                                        table.process_set)
        local = table.layout.local_index(asked)
        rows = table.rows_for(shard, local)
        returned, _ = _alltoall(rows, asked_splits, f"{table.name}.rows", table.process_set)
        pulled = torch.empty_like(returned)
        pulled[order] = returned
        ctx.table, ctx.order, ctx.splits = table, order, splits
        ctx.save_for_backward(asked, local)
        ctx.shard_shape = shard.shape
        return pulled

    @staticmethod
    def backward(ctx, grad_pulled):
        asked, local = ctx.saved_tensors
        table = ctx.table
        received, _ = _alltoall(grad_pulled[ctx.order], ctx.splits, f"{table.name}.grads",
                                table.process_set)
        return table.shard_gradient(asked, local, received, ctx.shard_shape), None, None
