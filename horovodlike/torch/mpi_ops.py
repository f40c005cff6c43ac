"""PyTorch collectives: asynchronous handles, synchronous forms, in-place forms, autograd.

Tensors go to the core as raw pointers; the Python side keeps them alive until the handle is
synchronized, and checks every argument before anything is queued.
"""

import itertools
import threading

import torch

from horovodlike import _core
from horovodlike.common import basics
from horovodlike.common.exceptions import HorovodInternalError, TensorMismatchError

# Reduce ops, numbered as in the core.
Average = 0
Sum = 1
Min = 2
Max = 3
Product = 4
Adasum = -1  # named for compatibility; rejected when used

_OP_ALLREDUCE, _OP_ALLGATHER, _OP_BROADCAST, _OP_BARRIER = 0, 1, 2, 3

_DTYPES = {
    torch.uint8: 0,
    torch.int8: 1,
    torch.int16: 2,
    torch.int32: 3,
    torch.int64: 4,
    torch.float16: 5,
    torch.bfloat16: 6,
    torch.float32: 7,
    torch.float64: 8,
    torch.bool: 9,
}

_lock = threading.Lock()
_handle_map = {}  # handle -> (output or None, objects to keep alive, op)
_name_counters = {}


def _auto_name(prefix):
    with _lock:
        counter = _name_counters.setdefault(prefix, itertools.count())
        return f"{prefix}.noname.{next(counter)}"


def _check_tensor(tensor, what, name):
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{what} '{name}': expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype not in _DTYPES:
        supported = ", ".join(str(d).replace("torch.", "") for d in _DTYPES)
        raise TypeError(f"{what} '{name}': dtype {str(tensor.dtype).replace('torch.', '')} "
                        f"is not supported; use one of {supported}")
    if tensor.is_sparse:
        raise TypeError(f"{what} '{name}': sparse tensors are not supported here; "
                        "use a dense tensor (tensor.to_dense())")


def _device(tensor):
    return tensor.device.index if tensor.is_cuda else -1


def _check_inplace(tensor, what, name):
    if not tensor.is_contiguous():
        raise ValueError(f"{what} '{name}': the tensor is not contiguous, so it cannot be "
                         "updated in place; call .contiguous() on it first or use the "
                         "out-of-place form")


def _resolve_op(average, op, what):
    if op is not None and average is not None:
        raise ValueError(f"{what}: the op and average arguments are mutually exclusive")
    if op is None:
        op = Average if average is None or average else Sum
    if op == Adasum:
        raise ValueError(f"{what}: Adasum is not supported by horovodlike; use Average or Sum")
    if op not in (Average, Sum, Min, Max, Product):
        raise ValueError(f"{what}: unknown reduce op {op!r}; use hvd.Average, hvd.Sum, "
                         "hvd.Min, hvd.Max or hvd.Product")
    return op


def _enqueue(op, name, tensor, output, result, keep, **kwargs):
    """Queues the collective; synchronize() will return ``result``."""
    handle = _core.enqueue(op, name, tensor.data_ptr(), 0 if output is None else output.data_ptr(),
                           _DTYPES[tensor.dtype], list(tensor.shape), device=_device(tensor),
                           **kwargs)
    with _lock:
        _handle_map[handle] = (result, keep, op)
    return handle


def _raise_for(code, message):
    if code == _core.STATUS_MISMATCH:
        raise TensorMismatchError(message)
    raise HorovodInternalError(message)


# ---------------------------------------------------------------------------------- allreduce

def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0):
    """Starts an allreduce of ``tensor`` into a new tensor; returns a handle for synchronize()."""
    name = name or _auto_name("allreduce")
    _check_tensor(tensor, "allreduce", name)
    op = _resolve_op(average, op, f"allreduce '{name}'")
    source = tensor.detach().contiguous()
    output = torch.empty_like(source, memory_format=torch.contiguous_format)
    return _enqueue(_OP_ALLREDUCE, name, source, output, output, (source,), reduce_op=op,
                    prescale=float(prescale_factor), postscale=float(postscale_factor))


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0):
    """Starts an in-place allreduce of ``tensor``; returns a handle for synchronize()."""
    name = name or _auto_name("allreduce")
    _check_tensor(tensor, "allreduce", name)
    _check_inplace(tensor, "allreduce", name)
    op = _resolve_op(average, op, f"allreduce '{name}'")
    data = tensor.detach()
    return _enqueue(_OP_ALLREDUCE, name, data, data, tensor, (tensor,), reduce_op=op,
                    prescale=float(prescale_factor), postscale=float(postscale_factor))


class _AllreduceFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor):
        ctx.op = op
        ctx.scales = (prescale_factor, postscale_factor)
        return synchronize(allreduce_async(tensor, name=name, op=op,
                                           prescale_factor=prescale_factor,
                                           postscale_factor=postscale_factor))

    @staticmethod
    def backward(ctx, grad_output):
        grad = allreduce(grad_output, op=ctx.op, prescale_factor=ctx.scales[0],
                         postscale_factor=ctx.scales[1])
        return grad, None, None, None, None


def allreduce(tensor, average=None, name=None, compression=None, op=None, prescale_factor=1.0,
              postscale_factor=1.0):
    """Returns the reduction of ``tensor`` over all ranks (differentiable)."""
    from horovodlike.torch.compression import Compression
    compression = compression or Compression.none
    op = _resolve_op(average, op, f"allreduce '{name}'")
    compressed, ctx = compression.compress(tensor)
    reduced = _AllreduceFunction.apply(compressed, name, op, prescale_factor, postscale_factor)
    return compression.decompress(reduced, ctx)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0):
    """Reduces ``tensor`` over all ranks in place and returns it."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                        postscale_factor))


# ---------------------------------------------------------------------------------- allgather

def allgather_async(tensor, name=None):
    """Starts an allgather along the first dimension (which may differ across ranks)."""
    name = name or _auto_name("allgather")
    _check_tensor(tensor, "allgather", name)
    if tensor.dim() == 0:
        raise ValueError(f"allgather '{name}': a scalar cannot be gathered; "
                         "reshape it to one dimension first")
    source = tensor.detach().contiguous()
    return _enqueue(_OP_ALLGATHER, name, source, None, None, (source,))


class _AllgatherFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name):
        handle = allgather_async(tensor, name=name)
        output, first_dims = _synchronize(handle, want_first_dims=True)
        ctx.first_dims = first_dims
        return output

    @staticmethod
    def backward(ctx, grad_output):
        # d(sum of all ranks' losses)/d(my rows) = sum over ranks of the gradient at my rows.
        summed = allreduce(grad_output.contiguous(), op=Sum)
        start = sum(ctx.first_dims[:basics.rank()])
        return summed[start:start + ctx.first_dims[basics.rank()]], None


def allgather(tensor, name=None):
    """Concatenates every rank's ``tensor`` along the first dimension (differentiable)."""
    return _AllgatherFunction.apply(tensor, name)


# ---------------------------------------------------------------------------------- broadcast

def _check_root(root_rank, name):
    if not isinstance(root_rank, int) or isinstance(root_rank, bool):
        raise TypeError(f"broadcast '{name}': root_rank must be an int, got {root_rank!r}")
    if not 0 <= root_rank < basics.size():
        raise ValueError(f"broadcast '{name}': root_rank {root_rank} is not a rank of this job "
                         f"(ranks 0 to {basics.size() - 1})")


def broadcast_async(tensor, root_rank, name=None):
    """Starts a broadcast of root_rank's ``tensor`` into a new tensor on every rank."""
    name = name or _auto_name("broadcast")
    _check_tensor(tensor, "broadcast", name)
    _check_root(root_rank, name)
    source = tensor.detach().contiguous()
    output = torch.empty_like(source, memory_format=torch.contiguous_format)
    return _enqueue(_OP_BROADCAST, name, source, output, output, (source,), root_rank=root_rank)


def broadcast_async_(tensor, root_rank, name=None):
    """Starts an in-place broadcast of root_rank's ``tensor``."""
    name = name or _auto_name("broadcast")
    _check_tensor(tensor, "broadcast", name)
    _check_inplace(tensor, "broadcast", name)
    _check_root(root_rank, name)
    data = tensor.detach()
    return _enqueue(_OP_BROADCAST, name, data, data, tensor, (tensor,), root_rank=root_rank)


class _BroadcastFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name):
        ctx.root_rank = root_rank
        return synchronize(broadcast_async(tensor, root_rank, name=name))

    @staticmethod
    def backward(ctx, grad_output):
        # Only the root's input reaches the outputs: it gets the sum of all ranks' gradients.
        summed = allreduce(grad_output.contiguous(), op=Sum)
        if basics.rank() != ctx.root_rank:
            summed = torch.zeros_like(summed)
        return summed, None, None


def broadcast(tensor, root_rank, name=None):
    """Returns root_rank's ``tensor`` on every rank (differentiable)."""
    return _BroadcastFunction.apply(tensor, root_rank, name)


def broadcast_(tensor, root_rank, name=None):
    """Overwrites ``tensor`` with root_rank's in place and returns it."""
    return synchronize(broadcast_async_(tensor, root_rank, name))


# ---------------------------------------------------------------------------------- handles

def poll(handle):
    """True when the operation behind ``handle`` has finished (synchronize() will not block)."""
    return _core.poll(handle)


def _synchronize(handle, want_first_dims=False):
    with _lock:
        if handle not in _handle_map:
            raise ValueError(f"unknown handle {handle}: it was already synchronized")
    code, message = _core.wait(handle)
    with _lock:
        result, keep, op = _handle_map.pop(handle)
    first_dims = None
    try:
        if code != _core.STATUS_OK:
            _raise_for(code, message)
        if op == _OP_ALLGATHER:
            raw, shape, first_dims = _core.allgather_output(handle)
            result = torch.from_numpy(raw).view(keep[0].dtype).reshape(shape)
    finally:
        _core.release(handle)
    return (result, first_dims) if want_first_dims else result


def synchronize(handle):
    """Waits for an asynchronous operation and returns its output tensor."""
    return _synchronize(handle)


def barrier():
    """Blocks until every rank has called barrier()."""
    handle = _core.enqueue(_OP_BARRIER, "barrier", 0, 0, _DTYPES[torch.uint8], [0])
    with _lock:
        _handle_map[handle] = (None, (), _OP_BARRIER)
    _synchronize(handle)
