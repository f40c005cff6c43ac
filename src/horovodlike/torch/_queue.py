"""What every torch collective shares on top of the common request path (common/requests.py:
names, names in flight, reduce ops, groups, handles): the checks of torch tensors, their device
and stream, outputs as tensors, and the synchronous path that runs a collective in one call into
the core."""

import torch

from horovodlike import _core
from horovodlike.common import requests
from horovodlike.common.constants import ALLTOALL, DTYPES, OP_NAMES
from horovodlike.common.exceptions import raise_for_status
from horovodlike.common.process_sets import global_process_set, set_id


# torch's dtype of each name the core numbers.
_DTYPES = {getattr(torch, name): code for name, code in DTYPES.items()}

_auto_name = requests.auto_name


def _tensor_problem(tensor):
    """Why ``tensor`` cannot go to the core (a message), or None."""
    if not isinstance(tensor, torch.Tensor):
        return f"expected a torch.Tensor, got {type(tensor).__name__}"
    if tensor.dtype not in _DTYPES:
        supported = ", ".join(str(d).replace("torch.", "") for d in _DTYPES)
        return (f"dtype {str(tensor.dtype).replace('torch.', '')} is not supported; use one of "
                f"{supported}")
    if tensor.is_sparse:
        return "sparse tensors are not supported here; use a dense tensor (tensor.to_dense())"
    return None


def _check_tensor(tensor, what, name):
    if tensor.__class__ is torch.Tensor and tensor.layout is torch.strided and \
            tensor.dtype in _DTYPES:
        return  # the common case: one quick test (the device is checked by _device_args)
    problem = _tensor_problem(tensor)
    if problem is not None:
        raise TypeError(f"{what} '{name}': {problem}")


def _check_member(tensor, what, name):
    """The checks a tensor can fail as it is queued, made for each member of a grouped call
    before the first is queued: one refused after others were queued would leave those waiting
    for it."""
    _check_tensor(tensor, what, name)
    if not tensor.is_cpu and not tensor.is_cuda:
        _raise_for_device(tensor, what, name)
    if tensor.data_ptr() == 0 and tensor.numel() > 0:  # the core's check (enqueue_checks.cc)
        raise ValueError(f"{what} '{name}': the tensor has no data (its pointer is null), as a "
                         "tensor without storage; pass a tensor on the CPU or a GPU")


def _raise_for_device(tensor, what, name):
    device = tensor.device.type
    if device == "meta":
        problem = ("the tensor is on the 'meta' device, which holds no data (only its shape and "
                   "dtype); create it on the CPU or a GPU")
    else:
        problem = (f"the tensor is on the '{device}' device; horovodlike takes CPU and CUDA "
                   "tensors: move it with .cpu() (or .cuda())")
    raise ValueError(f"{what} '{name}': {problem}")


def _device_args(tensor, op, name):
    """(device, stream) for the core, of a tensor not on the CPU: a CUDA tensor's ordinal and
    current stream; a tensor on any other device (meta, mps, xpu) raises."""
    if not tensor.is_cuda:
        _raise_for_device(tensor, OP_NAMES[op], name)
    return tensor.device.index, _cuda_stream(tensor)


def _cuda_stream(tensor):
    """The current CUDA stream on ``tensor``'s device, as an int (a cudaStream_t): the core
    starts once the work queued on it so far (what produced the tensor) is done, and the stream
    waits for the core's result before what is queued on it later."""
    return torch.cuda.current_stream(tensor.device).cuda_stream


def _output(kind, handle, raw, shape, extra, keep):
    """What synchronize() returns for a collective whose output the core allocated: the output
    tensor; for an alltoall, with the rows received from each rank (an int32 tensor)."""
    output = _output_tensor(handle, raw, shape, keep[0])
    if kind == ALLTOALL:
        device = keep[1] if len(keep) > 1 and keep[1] is not None else None
        return output, torch.tensor(extra, dtype=torch.int32, device=device)
    return output


def _output_tensor(handle, raw, shape, source):
    """The output the core allocated for ``handle`` (allgather, alltoall, reducescatter), as a
    tensor on ``source``'s device: copied from the core's bytes ``raw`` on the host, or by the
    core into a new device tensor, ordered on the current stream."""
    if source.is_cuda:
        out = torch.empty(shape, dtype=source.dtype, device=source.device)
        if out.numel():
            _core.output_to_device(handle, out.data_ptr(), _cuda_stream(out))
        return out
    if raw.size:
        return torch.from_numpy(raw).view(source.dtype).reshape(shape)
    return torch.empty(shape, dtype=source.dtype)


def _check_inplace(tensor, what, name):
    if not tensor.is_contiguous():
        raise ValueError(f"{what} '{name}': the tensor is not contiguous, so it cannot be "
                         "updated in place; call .contiguous() on it first or use the "
                         "out-of-place form")


def _resolve_op(average, op, kind, name):
    """The reduce op of a call to ``kind`` on tensor ``name`` (Horovod's average/op rules)."""
    if average is None and op.__class__ is int and op in requests.REDUCE_OPS:
        return op  # the common case, without building any message
    what = f"{kind} '{name}'"
    return requests.check_reduce_op(requests.resolve_reduce_op(average, op, what), what)


def _enqueue(op, name, tensor, output, result, keep, process_set, **kwargs):
    """Queues the collective; synchronize() will return ``result`` (or the core's output)."""
    if not tensor.is_cpu:  # the output, when given, is on the same device
        kwargs["device"], kwargs["stream"] = _device_args(tensor, op, name)
    return requests.enqueue(op, name, process_set, tensor.data_ptr(),
                            0 if output is None else output.data_ptr(), _DTYPES[tensor.dtype],
                            tensor.shape, keep, result, **kwargs)


def _run(op, name, tensor, output, process_set, reduce_op, prescale, postscale, root_rank=0):
    """A synchronous collective into the caller's ``output`` (arguments already checked):
    enqueue, wait and release in one call into the core, which runs the negotiation on this
    thread (no hand-off to the background loop and back). Every step here counts: a small
    allreduce costs a few microseconds in all."""
    set_ = 0 if process_set is global_process_set else set_id(process_set)
    if requests.in_flight and (set_, name) in requests.in_flight:
        requests.free_name(set_, name)
    if tensor.is_cpu:
        _call_core(tensor, output, op, name, tensor.data_ptr(), output.data_ptr(),
                   _DTYPES[tensor.dtype], reduce_op, prescale, postscale, root_rank, -1, set_)
    else:
        # A CUDA tensor (``output`` on the same device): ordered after the work queued on the
        # current stream, and that stream waits for the result.
        device, stream = _device_args(tensor, op, name)
        _call_core(tensor, output, op, name, tensor.data_ptr(), output.data_ptr(),
                   _DTYPES[tensor.dtype], reduce_op, prescale, postscale, root_rank, device,
                   set_, stream)


# The fast path of an in-place collective of the global set on a plain tensor (a contiguous
# CPU torch.Tensor itself, of a dtype the core takes) with an integer reduce op the core takes:
# the core reads the tensor's attributes and checks them in C (csrc/python/plain_tensor.h).
# run_plain(op, name, tensor, reduce_op, prescale, postscale) returns None when the call is not
# plain, having done nothing (then the caller takes the general path, whose checks say what is
# wrong), True when done, and (status code, message) when it failed. The same checks in Python
# cost about as much as the core's own work for a small allreduce.
_core.register_plain_tensors(torch.Tensor, _DTYPES, torch.strided, requests.REDUCE_OPS,
                             requests.in_flight, requests.keep_interrupted)
_run_plain = _core.run_plain


def _call_core(tensor, output, op, name, input_, output_, dtype, reduce_op, prescale,
               postscale, root_rank, device, set_, stream=None):
    """``_core.run`` of ``tensor`` into ``output`` (the pointers given; with the CUDA
    ``stream`` when given), the arguments passed on as they come (no tuple on the hot path);
    raises what the collective failed with. Interrupted while the core may still use the
    buffers, keeps them alive."""
    shape = tensor.shape
    try:
        if stream is None:
            failed = _core.run(op, name, input_, output_, dtype, shape, reduce_op, prescale,
                               postscale, root_rank, device, set_)
        else:
            failed = _core.run(op, name, input_, output_, dtype, shape, reduce_op, prescale,
                               postscale, root_rank, device, set_, stream=stream)
    except (ValueError, TypeError):
        raise  # refused before it was queued: the core never saw the buffers
    except BaseException:
        requests.keep_interrupted((tensor, output))
        raise
    if failed is not None:
        raise_for_status(*failed)


class _GroupHandle:
    """The handle of a grouped operation: synchronize() returns the list of outputs."""

    def __init__(self, handles):
        self.handles = handles
