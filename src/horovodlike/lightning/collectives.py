"""Lightning's collective calls (reduce, all_gather, and torchmetrics' state syncing) in
horovodlike's terms: which reduction a Lightning op name means, which process set a group is."""

import torch

import horovodlike.torch as hvd

# Lightning names reductions with strings ("mean", "sum", or a reduce_fx's __name__ such as
# "max") or with torch.distributed.ReduceOp members, whose .name is "SUM", "AVG", ...
_REDUCTIONS = {"mean": hvd.Average, "avg": hvd.Average, "sum": hvd.Sum, "max": hvd.Max,
               "min": hvd.Min, "product": hvd.Product, "prod": hvd.Product}


def reduction(reduce_op):
    """horovodlike's op for a Lightning reduce_op (None is Lightning's default, the mean)."""
    if reduce_op is None:
        return hvd.Average
    name = reduce_op if isinstance(reduce_op, str) else getattr(reduce_op, "name", None)
    op = _REDUCTIONS.get(name.lower()) if isinstance(name, str) else None
    if op is None:
        raise ValueError(f"HorovodStrategy.reduce: reduce_op={reduce_op!r} is not one horovodlike "
                         f"can reduce with; use one of {', '.join(sorted(_REDUCTIONS))} (or the "
                         "matching torch.distributed.ReduceOp)")
    return op


def process_set(group):
    """The process set a Lightning `group` names: None (Lightning's default) or
    torch.distributed's WORLD (LightningModule.all_gather's) is every rank; a horovodlike
    ProcessSet is itself. Other torch.distributed groups mean nothing to horovodlike."""
    world = torch.distributed.group.WORLD if torch.distributed.is_available() else None
    if group is None or group is world:
        return hvd.global_process_set
    if isinstance(group, hvd.ProcessSet):
        return group
    raise ValueError(f"HorovodStrategy: group={group!r} is not a horovodlike process set; pass "
                     "None for every rank, or an hvd.ProcessSet (hvd.add_process_set([...]))")


def allreduce(tensor, reduce_op, group=None):
    """`tensor` reduced over the group's ranks; a mean of integers is taken in float32, as the
    mean of whole numbers is not one."""
    op = reduction(reduce_op)
    if op == hvd.Average and not (tensor.is_floating_point() or tensor.is_complex()):
        tensor = tensor.float()
    return hvd.allreduce(tensor, op=op, process_set=process_set(group))


def all_gather(tensor, group=None, sync_grads=False):
    """Every rank's `tensor` stacked along a new first dimension, in rank order (Lightning's
    all_gather). With sync_grads the result carries gradients back to each rank's input, by
    Horovod's rule for allgather (averaged over ranks); without, it is cut from the graph."""
    ranks = process_set(group)
    if sync_grads:
        return hvd.allgather(tensor.unsqueeze(0), process_set=ranks)
    with torch.no_grad():
        return hvd.allgather(tensor.detach().unsqueeze(0), process_set=ranks)


def gather_all_tensors(tensor, group=None):
    """torchmetrics' ``dist_sync_fn``: the list of every rank's `tensor`, which may differ in
    length along the first dimension (a metric's list states hold what each rank saw)."""
    ranks = process_set(group)
    tensor = tensor.contiguous()
    if tensor.dim() == 0:
        return list(hvd.allgather(tensor.reshape(1), process_set=ranks).unbind(0))
    lengths = hvd.allgather(torch.tensor([tensor.shape[0]]), process_set=ranks).tolist()
    return list(hvd.allgather(tensor, process_set=ranks).split(lengths))


def metric_sync_options(group=None):
    """Keyword arguments for a torchmetrics Metric so that it syncs its states through
    horovodlike: ``Accuracy(task=..., **metric_sync_options())``. torchmetrics otherwise syncs
    only through torch.distributed, which a horovodlike job does not start."""
    def gather(tensor, group=group):
        return gather_all_tensors(tensor, group)

    return {"dist_sync_fn": gather, "distributed_available_fn": hvd.is_initialized,
            "process_group": group}
