"""PyTorch collectives: asynchronous handles, synchronous forms, in-place forms, autograd.

Tensors go to the core as raw pointers (CUDA tensors with their device and the current stream,
docs/gpu.md); the Python side keeps them alive until the handle is synchronized, and checks
every argument before anything is queued.
"""

import torch

from horovodlike import _core  # noqa: F401 (hvd.mpi_ops._core: the counters, as tests read them)
from horovodlike.common import basics, requests
from horovodlike.common import basics as _basics  # Horovod's name; its tests call hvd.mpi_ops._basics
from horovodlike.common.constants import (ALLGATHER as _OP_ALLGATHER,
                                          ALLREDUCE as _OP_ALLREDUCE,
                                          ALLTOALL as _OP_ALLTOALL,
                                          BROADCAST as _OP_BROADCAST,
                                          REDUCESCATTER as _OP_REDUCESCATTER,
                                          Adasum, Average, Max, Min, Product, Sum)  # noqa: F401
from horovodlike.common.exceptions import DeviceMismatchError, raise_for_status
from horovodlike.common.numpy_ops import check_name_length
from horovodlike.common.process_sets import global_process_set, set_id, set_ranks
from horovodlike.torch.compression import Compression
from horovodlike.torch._queue import (  # noqa: F401 (_auto_name: sparse_ops.py's)
    _auto_name, _check_tensor, _check_member, _check_inplace, _resolve_op, _enqueue,
    _output, _run, _run_plain, _GroupHandle)


# ---------------------------------------------------------------------------------- allreduce

def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set, _group=(0, 0)):
    """Starts an allreduce of ``tensor`` into a new tensor; returns a handle for synchronize()."""
    name = name or _auto_name("allreduce", process_set)
    _check_tensor(tensor, "allreduce", name)
    op = _resolve_op(average, op, "allreduce", name)
    source = tensor.detach().contiguous()
    output = torch.empty_like(source, memory_format=torch.contiguous_format)
    return _enqueue(_OP_ALLREDUCE, name, source, output, output, (source,), process_set,
                    reduce_op=op, prescale=float(prescale_factor),
                    postscale=float(postscale_factor), group_id=_group[0], group_size=_group[1])


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set, _group=(0, 0)):
    """Starts an in-place allreduce of ``tensor``; returns a handle for synchronize()."""
    name = name or _auto_name("allreduce", process_set)
    _check_tensor(tensor, "allreduce", name)
    _check_inplace(tensor, "allreduce", name)
    op = _resolve_op(average, op, "allreduce", name)
    data = tensor.detach()
    return _enqueue(_OP_ALLREDUCE, name, data, data, tensor, (tensor,), process_set,
                    reduce_op=op, prescale=float(prescale_factor),
                    postscale=float(postscale_factor), group_id=_group[0], group_size=_group[1])


class _AllreduceFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor, process_set):
        ctx.args = (op, prescale_factor, postscale_factor, process_set)
        name = name or _auto_name("allreduce", process_set)
        _check_tensor(tensor, "allreduce", name)
        source = tensor.detach().contiguous()
        output = torch.empty_like(source, memory_format=torch.contiguous_format)
        _run(_OP_ALLREDUCE, name, source, output, process_set, op, float(prescale_factor),
             float(postscale_factor))
        return output

    @staticmethod
    def backward(ctx, grad_output):
        op, pre, post, process_set = ctx.args
        grad = allreduce(grad_output, op=op, prescale_factor=pre, postscale_factor=post,
                         process_set=process_set)
        return grad, None, None, None, None, None


def allreduce(tensor, average=None, name=None, compression=None, op=None, prescale_factor=1.0,
              postscale_factor=1.0, process_set=global_process_set):
    """Returns the reduction of ``tensor`` over all ranks (differentiable)."""
    compression = compression or Compression.none
    op = _resolve_op(average, op, "allreduce", name)
    compressed, ctx = compression.compress(tensor)
    reduced = _AllreduceFunction.apply(compressed, name, op, prescale_factor, postscale_factor,
                                       process_set)
    return compression.decompress(reduced, ctx)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set):
    """Reduces ``tensor`` over all ranks in place and returns it."""
    name = name or _auto_name("allreduce", process_set)
    if average is None and process_set is global_process_set:
        done = _run_plain(_OP_ALLREDUCE, name, tensor, op, prescale_factor, postscale_factor)
        if done is True:
            return tensor
        if done is not None:
            raise_for_status(*done)
    _check_tensor(tensor, "allreduce", name)
    _check_inplace(tensor, "allreduce", name)
    op = _resolve_op(average, op, "allreduce", name)
    _run(_OP_ALLREDUCE, name, tensor, tensor, process_set, op, float(prescale_factor),
         float(postscale_factor))
    return tensor


def _new_group(tensors, what, name):
    """A grouped call's (id, size), after the checks of every member (see _check_member)."""
    if not isinstance(tensors, (list, tuple)) or not tensors:
        raise ValueError(f"{what} expects a non-empty list of tensors")
    for i, tensor in enumerate(tensors):
        _check_member(tensor, what, f"{name}.{i}" if name else f"tensor {i}")
    devices = [tensor.device for tensor in tensors]
    if any(device != devices[0] for device in devices):
        other = next(i for i, device in enumerate(devices) if device != devices[0])
        raise DeviceMismatchError(
            f"{what}{f' {name!r}' if name else ''}: tensor 0 is on {devices[0]} and tensor "
            f"{other} on {devices[other]}; a group's tensors must all be on one device (move "
            "them with .to(device), or make one call per device)")
    if name:
        check_name_length(f"{name}.{len(tensors) - 1}", what)  # the longest member name
    return requests.new_group(len(tensors))


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set):
    """Starts one fused allreduce of all ``tensors``; synchronize() returns the list."""
    group = _new_group(tensors, "grouped_allreduce", name)
    name = name or _auto_name("grouped_allreduce", process_set)
    return _GroupHandle([allreduce_async(t, average, f"{name}.{i}", op, prescale_factor,
                                         postscale_factor, process_set, _group=group)
                         for i, t in enumerate(tensors)])


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set):
    group = _new_group(tensors, "grouped_allreduce_", name)
    name = name or _auto_name("grouped_allreduce", process_set)
    return _GroupHandle([allreduce_async_(t, average, f"{name}.{i}", op, prescale_factor,
                                          postscale_factor, process_set, _group=group)
                         for i, t in enumerate(tensors)])


class _GroupedAllreduceFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, prescale_factor, postscale_factor, process_set, *tensors):
        ctx.args = (op, prescale_factor, postscale_factor, process_set)
        return tuple(synchronize(grouped_allreduce_async(
            list(tensors), name=name, op=op, prescale_factor=prescale_factor,
            postscale_factor=postscale_factor, process_set=process_set)))

    @staticmethod
    def backward(ctx, *grads):
        op, pre, post, process_set = ctx.args
        reduced = grouped_allreduce([g.contiguous() for g in grads], op=op, prescale_factor=pre,
                                    postscale_factor=post, process_set=process_set)
        return (None, None, None, None, None, *reduced)


def grouped_allreduce(tensors, average=None, name=None, compression=None, op=None,
                      prescale_factor=1.0, postscale_factor=1.0,
                      process_set=global_process_set):
    """Reduces every tensor of the list as one fused operation (differentiable)."""
    compression = compression or Compression.none
    op = _resolve_op(average, op, "grouped_allreduce", name)
    pairs = [compression.compress(t) for t in tensors]
    reduced = _GroupedAllreduceFunction.apply(name, op, prescale_factor, postscale_factor,
                                              process_set, *[c for c, _ in pairs])
    return [compression.decompress(r, ctx) for r, (_, ctx) in zip(reduced, pairs)]


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set):
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor, process_set))


# ---------------------------------------------------------------------------------- allgather

def allgather_async(tensor, name=None, process_set=global_process_set, _group=(0, 0)):
    """Starts an allgather along the first dimension (which may differ across ranks)."""
    name = name or _auto_name("allgather", process_set)
    _check_tensor(tensor, "allgather", name)
    if tensor.dim() == 0:
        raise ValueError(f"allgather '{name}': a scalar cannot be gathered; "
                         "reshape it to one dimension first")
    source = tensor.detach().contiguous()
    return _enqueue(_OP_ALLGATHER, name, source, None, None, (source,), process_set,
                    group_id=_group[0], group_size=_group[1])


def _slice_own_rows(grad, first_dims, process_set):
    """Horovod's allgather gradient: the average over the set of the incoming gradient, then
    this rank's rows of it."""
    averaged = allreduce(grad.contiguous(), op=Average, process_set=process_set)
    me = set_ranks(process_set).index(basics.rank())
    start = sum(first_dims[:me])
    return averaged[start:start + first_dims[me]]


class _AllgatherFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, process_set):
        output, first_dims = _synchronize(allgather_async(tensor, name, process_set),
                                          want_extra=True)
        ctx.first_dims, ctx.process_set = first_dims, process_set
        return output

    @staticmethod
    def backward(ctx, grad_output):
        return _slice_own_rows(grad_output, ctx.first_dims, ctx.process_set), None, None


def allgather(tensor, name=None, process_set=global_process_set):
    """Concatenates every rank's ``tensor`` along the first dimension (differentiable)."""
    return _AllgatherFunction.apply(tensor, name, process_set)


def grouped_allgather_async(tensors, name=None, process_set=global_process_set):
    group = _new_group(tensors, "grouped_allgather", name)
    name = name or _auto_name("grouped_allgather", process_set)
    return _GroupHandle([allgather_async(t, f"{name}.{i}", process_set, _group=group)
                         for i, t in enumerate(tensors)])


class _GroupedAllgatherFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        results = _synchronize(grouped_allgather_async(list(tensors), name, process_set),
                               want_extra=True)
        ctx.first_dims = [dims for _, dims in results]
        ctx.process_set = process_set
        return tuple(out for out, _ in results)

    @staticmethod
    def backward(ctx, *grads):
        return (None, None, *[_slice_own_rows(g, dims, ctx.process_set)
                              for g, dims in zip(grads, ctx.first_dims)])


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """Gathers every tensor of the list as one fused operation (differentiable)."""
    return list(_GroupedAllgatherFunction.apply(name, process_set, *tensors))


# ---------------------------------------------------------------------------------- broadcast

def _relative_root(root_rank, name, process_set):
    """Root ranks are global ranks (as in Horovod); the core wants the rank within the set."""
    if not isinstance(root_rank, int) or isinstance(root_rank, bool):
        raise TypeError(f"broadcast '{name}': root_rank must be an int, got {root_rank!r}")
    ranks = set_ranks(process_set)
    if root_rank not in ranks:
        where = (f"a rank of this job (0 to {len(ranks) - 1})" if set_id(process_set) == 0
                 else f"in process set {set_id(process_set)} (ranks {ranks})")
        raise ValueError(f"broadcast '{name}': root_rank {root_rank} is not {where}")
    return ranks.index(root_rank)


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    """Starts a broadcast of root_rank's ``tensor`` into a new tensor on every rank."""
    name = name or _auto_name("broadcast", process_set)
    _check_tensor(tensor, "broadcast", name)
    root = _relative_root(root_rank, name, process_set)
    source = tensor.detach().contiguous()
    output = torch.empty_like(source, memory_format=torch.contiguous_format)
    return _enqueue(_OP_BROADCAST, name, source, output, output, (source,), process_set,
                    root_rank=root)


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    """Starts an in-place broadcast of root_rank's ``tensor``."""
    name = name or _auto_name("broadcast", process_set)
    _check_tensor(tensor, "broadcast", name)
    _check_inplace(tensor, "broadcast", name)
    root = _relative_root(root_rank, name, process_set)
    data = tensor.detach()
    return _enqueue(_OP_BROADCAST, name, data, data, tensor, (tensor,), process_set,
                    root_rank=root)


class _BroadcastFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return synchronize(broadcast_async(tensor, root_rank, name, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        # Horovod's rule: the average of the incoming gradients, kept on the root (the only
        # input that reaches the outputs) and zero on every other rank.
        averaged = allreduce(grad_output.contiguous(), op=Average, process_set=ctx.process_set)
        if basics.rank() != ctx.root_rank:
            averaged = torch.zeros_like(averaged)
        return averaged, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """Returns root_rank's ``tensor`` on every rank (differentiable)."""
    return _BroadcastFunction.apply(tensor, root_rank, name, process_set)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """Overwrites ``tensor`` with root_rank's in place and returns it."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


# ---------------------------------------------------------------------------------- alltoall

def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    """Starts an alltoall: rows splits[j] of ``tensor`` go to rank j of the set (equal parts
    when splits is None). synchronize() returns (output, received_splits)."""
    name = name or _auto_name("alltoall", process_set)
    _check_tensor(tensor, "alltoall", name)
    if tensor.dim() == 0:
        raise ValueError(f"alltoall '{name}': a scalar cannot be split; give it a dimension")
    n = len(set_ranks(process_set))
    if splits is None:
        if tensor.shape[0] % n != 0:
            raise ValueError(f"alltoall '{name}': the first dimension {tensor.shape[0]} does "
                             f"not divide evenly among {n} ranks; pass splits")
        splits = [tensor.shape[0] // n] * n
    source = tensor.detach().contiguous()
    # The received splits come back on the device of the splits given (as Horovod's), else
    # on the CPU.
    splits_device = splits.device if isinstance(splits, torch.Tensor) else None
    if isinstance(splits, torch.Tensor):
        splits = splits.tolist()
    splits = [int(s) for s in splits]
    if len(splits) != n or any(s < 0 for s in splits) or sum(splits) != tensor.shape[0]:
        raise ValueError(f"alltoall '{name}': splits {splits} must be {n} non-negative counts "
                         f"adding up to the first dimension {tensor.shape[0]}")
    return _enqueue(_OP_ALLTOALL, name, source, None, None, (source, splits_device),
                    process_set, splits=splits)


class _AlltoallFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        output, received = synchronize(alltoall_async(tensor, splits, name, process_set))
        ctx.received, ctx.process_set = received, process_set
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx, grad_output, _):
        # Each row goes back where it came from.
        grad, _ = synchronize(alltoall_async(grad_output.contiguous(), ctx.received,
                                             process_set=ctx.process_set))
        return grad, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Scatters rows of ``tensor`` to the ranks and gathers theirs (differentiable). Returns
    the output, and also the received splits when ``splits`` is given."""
    output, received = _AlltoallFunction.apply(tensor, splits, name, process_set)
    return output if splits is None else (output, received)


# ---------------------------------------------------------------------------------- reducescatter

def _check_reducescatter_op(op, name):
    op = Average if op is None else op
    if op == Adasum:
        # RuntimeError, as Horovod raises: Adasum combines whole tensors, not scattered parts.
        raise NotImplementedError(f"reducescatter '{name}': op=hvd.Adasum is not supported; "
                                  "use hvd.Sum or hvd.Average")
    if op not in (Average, Sum, Min, Max, Product):
        raise ValueError(f"reducescatter '{name}': unknown reduce op {op!r}")
    return op


def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set,
                        prescale_factor=1.0, postscale_factor=1.0, _group=(0, 0)):
    """Starts a reduce-scatter: the reduction over ranks, split along the first dimension (the
    first ranks get one more row when it does not divide evenly)."""
    name = name or _auto_name("reducescatter", process_set)
    _check_tensor(tensor, "reducescatter", name)
    if tensor.dim() == 0:
        raise ValueError(f"reducescatter '{name}': a scalar cannot be scattered")
    op = _check_reducescatter_op(op, name)
    source = tensor.detach().contiguous()
    return _enqueue(_OP_REDUCESCATTER, name, source, None, None, (source,), process_set,
                    reduce_op=op, prescale=float(prescale_factor),
                    postscale=float(postscale_factor), group_id=_group[0], group_size=_group[1])


def _reducescatter_grad(grad, op, pre, post, process_set):
    """Horovod's rule: every rank's gradient gathered back to full size, times the set's size
    for Sum (and times the scale factors the forward applied)."""
    gathered = allgather(grad.contiguous(), process_set=process_set)
    scale = pre * post * (len(set_ranks(process_set)) if op == Sum else 1.0)
    return gathered * scale if scale != 1.0 else gathered


class _ReducescatterFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, process_set, prescale_factor, postscale_factor):
        ctx.args = (op, prescale_factor, postscale_factor, process_set)
        return synchronize(reducescatter_async(tensor, name, op, process_set, prescale_factor,
                                               postscale_factor))

    @staticmethod
    def backward(ctx, grad_output):
        op, pre, post, process_set = ctx.args
        return _reducescatter_grad(grad_output, op, pre, post, process_set), None, None, None, \
            None, None


def reducescatter(tensor, name=None, compression=None, op=Average,
                  process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """This rank's part of the reduction over ranks (differentiable)."""
    compression = compression or Compression.none
    compressed, ctx = compression.compress(tensor)
    out = _ReducescatterFunction.apply(compressed, name, op, process_set, prescale_factor,
                                       postscale_factor)
    return compression.decompress(out, ctx)


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0):
    group = _new_group(tensors, "grouped_reducescatter", name)
    name = name or _auto_name("grouped_reducescatter", process_set)
    return _GroupHandle([reducescatter_async(t, f"{name}.{i}", op, process_set, prescale_factor,
                                             postscale_factor, _group=group)
                         for i, t in enumerate(tensors)])


class _GroupedReducescatterFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, process_set, pre, post, *tensors):
        ctx.args = (op, pre, post, process_set)
        return tuple(synchronize(grouped_reducescatter_async(list(tensors), name, op,
                                                             process_set, pre, post)))

    @staticmethod
    def backward(ctx, *grads):
        op, pre, post, process_set = ctx.args
        return (None, None, None, None, None,
                *[_reducescatter_grad(g, op, pre, post, process_set) for g in grads])


def grouped_reducescatter(tensors, name=None, compression=None, op=Average,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0):
    """Reduce-scatters every tensor of the list as one fused operation (differentiable)."""
    compression = compression or Compression.none
    pairs = [compression.compress(t) for t in tensors]
    outs = _GroupedReducescatterFunction.apply(name, _check_reducescatter_op(op, name),
                                               process_set, prescale_factor, postscale_factor,
                                               *[c for c, _ in pairs])
    return [compression.decompress(o, ctx) for o, (_, ctx) in zip(outs, pairs)]


# ---------------------------------------------------------------------------------- handles

def poll(handle):
    """True when the operation behind ``handle`` has finished (synchronize() will not block)."""
    if isinstance(handle, _GroupHandle):
        return all(requests.poll(h) for h in handle.handles)
    if hasattr(handle, "parts"):  # a sparse allreduce (sparse_ops.py)
        return all(poll(h) for h in handle.parts)
    return requests.poll(handle)


def _synchronize(handle, want_extra=False):
    if isinstance(handle, _GroupHandle):
        return [_synchronize(h, want_extra) for h in handle.handles]
    if hasattr(handle, "parts"):  # a sparse allreduce (sparse_ops.py)
        return handle.combine(*(_synchronize(h) for h in handle.parts))
    result, extra = requests.wait(handle, _output)
    return (result, extra) if want_extra else result


def synchronize(handle):
    """Waits for an asynchronous operation and returns its output (a list for grouped ops;
    (output, received_splits) for alltoall)."""
    return _synchronize(handle)


def barrier(process_set=global_process_set):
    """Blocks until every rank of the set has called barrier()."""
    requests.barrier(process_set)


def join(device=-1):
    """Declares that this rank has no more data. Until every rank has joined, the others'
    allreduces go on with this rank contributing zeros. Returns the last rank to join.

    ``device`` is Horovod's (the GPU for this rank's zeros, -1 for the host); it is accepted and
    not passed on: the core makes the zeros itself, and a join request names no device."""
    return requests.join()
