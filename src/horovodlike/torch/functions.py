"""Broadcasting model and optimizer state, and Python objects, between ranks."""

import torch

from horovodlike.common import basics
# Objects travel the same way for every framework.
from horovodlike.common.objects import allgather_object, broadcast_object  # noqa: F401
from horovodlike.torch.mpi_ops import broadcast_async_, synchronize


def broadcast_parameters(params, root_rank):
    """Overwrites every rank's parameters with root_rank's, in place.

    ``params`` is a ``state_dict()`` or an iterable of (name, tensor) such as
    ``model.named_parameters()``.
    """
    if isinstance(params, dict):
        items = sorted(params.items())
    else:
        items = list(params)
        if items and not (isinstance(items[0], tuple) and len(items[0]) == 2):
            raise ValueError("broadcast_parameters expects a state_dict or an iterable of "
                             "(name, tensor) pairs such as model.named_parameters()")
    handles = []
    for name, tensor in items:
        if tensor is None:
            continue
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"broadcast_parameters: '{name}' is a {type(tensor).__name__}, "
                            "not a tensor")
        handles.append(broadcast_async_(tensor.data, root_rank, name=f"broadcast.{name}"))
    for handle in handles:
        synchronize(handle)


def _strip_tensors(value, tensors):
    """Replaces every tensor in a nested structure by a placeholder naming its slot."""
    if isinstance(value, torch.Tensor):
        tensors.append(value)
        return ("__horovodlike_tensor__", len(tensors) - 1, tuple(value.shape), value.dtype)
    if isinstance(value, dict):
        return {k: _strip_tensors(v, tensors) for k, v in value.items()}
    if isinstance(value, list):
        return [_strip_tensors(v, tensors) for v in value]
    if isinstance(value, tuple):
        return tuple(_strip_tensors(v, tensors) for v in value)
    return value


def _fill_tensors(value, tensors):
    if isinstance(value, tuple) and len(value) == 4 and value[0] == "__horovodlike_tensor__":
        return tensors[value[1]]
    if isinstance(value, dict):
        return {k: _fill_tensors(v, tensors) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill_tensors(v, tensors) for v in value]
    if isinstance(value, tuple):
        return tuple(_fill_tensors(v, tensors) for v in value)
    return value


def broadcast_optimizer_state(optimizer, root_rank):
    """Makes every rank's optimizer state (hyper-parameters and per-parameter state) equal to
    root_rank's. The structure travels pickled; the tensors travel as tensors.

    As in Horovod, an optimizer without state yet gets it first from one step on zero
    gradients, so that every parameter that requires a gradient has one (zeros) and its state
    afterwards; the parameters themselves are left as they were."""
    _create_state(optimizer)
    own = []
    structure = _strip_tensors(optimizer.state_dict(), own)
    structure = broadcast_object(structure, root_rank, name="broadcast_optimizer_state.structure")
    placeholders = []
    _strip_tensors_meta(structure, placeholders)
    # The state travels on the host whatever its device: every rank then uses the same device
    # for each tensor, and load_state_dict moves the values to their parameters' devices.
    if basics.rank() == root_rank:
        tensors = [t.detach().cpu().contiguous() for t in own]
    else:
        tensors = [torch.empty(shape, dtype=dtype) for shape, dtype in placeholders]
    handles = [broadcast_async_(t, root_rank, name=f"broadcast_optimizer_state.{i}")
               for i, t in enumerate(tensors)]
    for handle in handles:
        synchronize(handle)
    if basics.rank() != root_rank:
        optimizer.load_state_dict(_fill_tensors(structure, tensors))


def _create_state(optimizer):
    if optimizer.state_dict()["state"]:
        return
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for p in params:
        if p.requires_grad and p.grad is None:
            p.grad = torch.zeros_like(p)
    kept = [p.detach().clone() for p in params]
    # A DistributedOptimizer is a subclass of the wrapped optimizer's class: step with the
    # wrapped class's own step(), which communicates nothing.
    plain = super(type(optimizer), optimizer) if hasattr(optimizer, "_horovodlike_setup") \
        else optimizer
    try:
        plain.step()
    except (RuntimeError, TypeError, ValueError):
        # An optimizer that cannot step on zero dense gradients (LBFGS wants a closure,
        # SparseAdam sparse gradients) keeps no state; root's state, if any, still arrives.
        pass
    with torch.no_grad():
        for p, value in zip(params, kept):
            p.copy_(value)


def _strip_tensors_meta(value, out):
    if isinstance(value, tuple) and len(value) == 4 and value[0] == "__horovodlike_tensor__":
        out.append((value[2], value[3]))
    elif isinstance(value, dict):
        for v in value.values():
            _strip_tensors_meta(v, out)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _strip_tensors_meta(v, out)
