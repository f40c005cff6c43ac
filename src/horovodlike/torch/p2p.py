"""Point-to-point for PyTorch, with ``torch.distributed``'s names: ``send`` / ``recv``,
``isend`` / ``irecv`` returning a Work, ``P2POp`` and ``batch_isend_irecv``.

    if hvd.rank() == 0:
        hvd.send(x, dst=1, tag=7)
    else:
        hvd.recv(x, src=0, tag=7)          # fills x in place

Peers are global ranks; ``process_set`` (both ranks in it) scopes the tags. Messages between
two ranks with one tag arrive in the order they were sent. There is no negotiation round: a
send returns once its bytes are written, and the receiving rank keeps a message until a receive
matches it, so two ranks may both send before they receive. Tensors are CPU tensors; a receive
checks that the dtype and number of elements are the sender's: a mismatch raises
``TensorMismatchError`` naming both ranks on the receiver, and on the sender at its pending or
next operation with that peer. ``send_differentiable`` / ``recv_differentiable`` are the autograd
pair: the gradient of what was received flows back to the sender during the backward pass.

CUDA tensors go through host memory: a send copies the tensor to the host first (which waits
for the work queued on its stream), a receive into a CUDA tensor lands in a host buffer that
``wait()`` copies into the tensor. Messages travel as bytes between processes, so a CUDA
tensor's sender and a CPU tensor's receiver match (and the reverse). ``irecv_any`` and
``recv_differentiable`` return CPU tensors; ``.to(device)`` moves one to a GPU, and the
gradient of ``recv_differentiable``'s result still flows back through that copy.
"""

import torch

from horovodlike.common import point_to_point as core
from horovodlike.common.process_sets import global_process_set
from horovodlike.torch._queue import _DTYPES, _tensor_problem

_TORCH_OF_CODE = {code: dtype for dtype, code in _DTYPES.items()}


def _check_tensor(tensor, what):
    problem = _tensor_problem(tensor)
    if problem is not None:
        raise TypeError(f"{what}: {problem}")
    if tensor.device.type not in ("cpu", "cuda"):
        raise ValueError(f"{what}: the tensor is on {tensor.device}; point-to-point takes CPU "
                         "and CUDA tensors")


def isend(tensor, dst, tag=0, process_set=global_process_set):
    """Starts sending ``tensor`` to global rank ``dst``; returns a Work (``wait()``)."""
    what = "isend"
    _check_tensor(tensor, what)
    dst = peer = core.check_peer(dst, process_set, what, "dst")
    direction = "to"
    tag = core.check_tag(tag, f"{what} {direction} rank {peer}")
    source = tensor.detach()
    if source.is_cuda:  # staged through host memory (see the module's docstring)
        source = source.to("cpu", memory_format=torch.contiguous_format)
    elif not source.is_contiguous():
        source = source.contiguous()
    return core.send_raw(source.data_ptr(), _DTYPES[source.dtype], source.shape, source, dst,
                         tag, process_set)


def irecv(tensor, src, tag=0, process_set=global_process_set):
    """Starts receiving from global rank ``src`` into ``tensor`` (in place); returns a Work whose
    ``wait()`` returns the tensor."""
    what = "irecv"
    _check_tensor(tensor, what)
    src = peer = core.check_peer(src, process_set, what, "src")
    direction = "from"
    tag = core.check_tag(tag, f"{what} {direction} rank {peer}")
    target = tensor.detach()
    if target.is_contiguous() and not target.is_cuda:
        return core.recv_raw(target.data_ptr(), _DTYPES[target.dtype], target.shape, target, src,
                             tag, process_set, lambda _: tensor)
    # Received into a contiguous host buffer, then copied into the tensor by wait().
    staging = torch.empty(target.shape, dtype=target.dtype) if target.is_cuda \
        else target.contiguous()

    def copy_back(_):
        with torch.no_grad():
            tensor.copy_(staging)
        return tensor
    return core.recv_raw(staging.data_ptr(), _DTYPES[staging.dtype], staging.shape, staging, src,
                         tag, process_set, copy_back)


def irecv_any(src, tag=0, process_set=global_process_set):
    """Starts receiving from ``src`` a tensor whose dtype and shape the sender decides; the
    Work's ``wait()`` returns it (a new tensor)."""
    what = "irecv_any"
    src = peer = core.check_peer(src, process_set, what, "src")
    direction = "from"
    tag = core.check_tag(tag, f"{what} {direction} rank {peer}")

    def unpack(raw, shape, code):
        dtype = _TORCH_OF_CODE[code]
        if raw.size == 0:
            return torch.empty(shape, dtype=dtype)
        # The core's buffer becomes the tensor's storage: no copy.
        return torch.from_numpy(raw).view(dtype).reshape(shape)
    return core.recv_any_raw(src, tag, process_set, unpack)


def send(tensor, dst, tag=0, process_set=global_process_set):
    """Sends ``tensor`` to global rank ``dst``; returns once it is written (the receiver keeps
    it until a receive matches)."""
    isend(tensor, dst, tag, process_set).wait()


def recv(tensor, src, tag=0, process_set=global_process_set):
    """Receives from global rank ``src`` into ``tensor`` (in place); returns ``src``, as
    ``torch.distributed.recv`` does."""
    irecv(tensor, src, tag, process_set).wait()
    return src


send_async = isend
recv_async = irecv


class _SendFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, dst, tag, process_set):
        ctx.peer, ctx.tag, ctx.process_set = dst, tag, process_set
        ctx.shape, ctx.dtype, ctx.device = tensor.shape, tensor.dtype, tensor.device
        send(tensor, dst, tag, process_set)
        return tensor.new_zeros(())

    @staticmethod
    def backward(ctx, _):
        grad = torch.zeros(ctx.shape, dtype=ctx.dtype, device=ctx.device)
        recv(grad, ctx.peer, ctx.tag, ctx.process_set)
        return grad, None, None, None


class _RecvFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, anchor, src, tag, process_set):
        ctx.peer, ctx.tag, ctx.process_set = src, tag, process_set
        return irecv_any(src, tag, process_set).wait()

    @staticmethod
    def backward(ctx, grad):
        send(grad.contiguous(), ctx.peer, ctx.tag, ctx.process_set)
        return None, None, None, None


def send_differentiable(tensor, dst, tag=0, process_set=global_process_set):
    """Sends ``tensor`` to ``dst`` as part of the autograd graph, for models split over ranks
    by hand. Returns a 0-d zero "token": backpropagating through it (``token.backward()``, or
    adding it to this rank's loss) waits for the gradient that ``dst``'s matching
    ``recv_differentiable`` sends back, and carries it into ``tensor``'s graph. The gradient
    travels back on the same tag."""
    what = "send_differentiable"
    _check_tensor(tensor, what)
    dst = core.check_peer(dst, process_set, what, "dst")
    tag = core.check_tag(tag, f"{what} to rank {dst}")
    if not tensor.is_floating_point():
        raise TypeError(f"{what}: a gradient needs a floating-point tensor, got "
                        f"{str(tensor.dtype).replace('torch.', '')}; use send")
    return _SendFunction.apply(tensor, dst, tag, process_set)


def recv_differentiable(src, tag=0, process_set=global_process_set):
    """Receives from ``src`` what its ``send_differentiable`` sent (the sender decides dtype and
    shape); the result requires grad, and its gradient goes back to ``src`` during this rank's
    backward pass."""
    what = "recv_differentiable"
    src = core.check_peer(src, process_set, what, "src")
    tag = core.check_tag(tag, f"{what} from rank {src}")
    anchor = torch.zeros(0, requires_grad=True)  # makes the output part of the graph
    return _RecvFunction.apply(anchor, src, tag, process_set)


class P2POp:
    """One operation of ``batch_isend_irecv``: ``P2POp(hvd.isend, tensor, peer, tag=0)`` or
    ``P2POp(hvd.irecv, tensor, peer, tag=0)``."""

    def __init__(self, op, tensor, peer, tag=0, process_set=global_process_set):
        if op not in (isend, irecv):
            raise ValueError("P2POp: op must be horovodlike.torch.isend or horovodlike.torch.irecv, "
                             f"got {op!r}")
        self.op, self.tensor, self.peer, self.tag = op, tensor, peer, tag
        self.process_set = process_set

    def __repr__(self):
        return f"P2POp({self.op.__name__}, peer={self.peer}, tag={self.tag})"


def batch_isend_irecv(p2p_op_list):
    """Starts every operation of the list and returns their Works, in order. Every operation is
    checked before any starts, so bad input sends nothing."""
    if not isinstance(p2p_op_list, (list, tuple)) or \
            not all(isinstance(op, P2POp) for op in p2p_op_list):
        raise TypeError("batch_isend_irecv: expects a list of P2POp")
    for op in p2p_op_list:
        what = f"batch_isend_irecv: {op!r}"
        _check_tensor(op.tensor, what)
        core.check_peer(op.peer, op.process_set, what, "peer")
        core.check_tag(op.tag, what)
    return [op.op(op.tensor, op.peer, op.tag, op.process_set) for op in p2p_op_list]
