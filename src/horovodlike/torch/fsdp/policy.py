"""FSDP2's mixed precision and offload policies (``torch.distributed.fsdp``'s names and fields).

A wrapped module keeps its shards (the parameters the optimizer steps) in their own dtype;
``MixedPrecisionPolicy`` says in which dtype they are gathered and computed with, in which the
gradients are reduced, and what the module's outputs are cast to. ``CPUOffloadPolicy`` keeps the
shards, their gradients and so the optimizer's state in host memory, copying them to the
module's device for the gather and the gradient back after the reduction.
"""

from dataclasses import dataclass

import torch
from torch.utils._pytree import tree_map


@dataclass(frozen=True)
class MixedPrecisionPolicy:
    """``param_dtype``: the gathered parameters (and the gather itself) in this dtype, so the
    forward and backward compute in it; ``reduce_dtype``: the gradient reduction in this dtype
    (``param_dtype`` when left out); ``output_dtype``: floating-point outputs cast to it;
    ``cast_forward_inputs``: floating-point inputs cast to ``param_dtype``. None keeps the
    parameters' own dtype; the shards stay in it whatever these say."""

    param_dtype: torch.dtype = None
    reduce_dtype: torch.dtype = None
    output_dtype: torch.dtype = None
    cast_forward_inputs: bool = True


@dataclass
class OffloadPolicy:
    """No offloading (the default)."""


@dataclass
class CPUOffloadPolicy(OffloadPolicy):
    """Shards, their gradients and the optimizer step in host memory (pinned with
    ``pin_memory`` where a GPU makes pinning possible, so that the copies can overlap)."""

    pin_memory: bool = True


def check_policies(mp_policy, offload_policy):
    """The policies given (None: the defaults), checked before anything is changed."""
    mp_policy = MixedPrecisionPolicy() if mp_policy is None else mp_policy
    offload_policy = OffloadPolicy() if offload_policy is None else offload_policy
    if not isinstance(mp_policy, MixedPrecisionPolicy):
        raise TypeError(f"fully_shard: mp_policy must be a horovodlike.torch.fsdp."
                        f"MixedPrecisionPolicy, got {type(mp_policy).__name__}")
    if not isinstance(offload_policy, OffloadPolicy):
        raise TypeError(f"fully_shard: offload_policy must be a horovodlike.torch.fsdp."
                        f"OffloadPolicy or CPUOffloadPolicy, got {type(offload_policy).__name__}")
    for field in ("param_dtype", "reduce_dtype", "output_dtype"):
        value = getattr(mp_policy, field)
        if value is not None and not (isinstance(value, torch.dtype) and value.is_floating_point):
            raise TypeError(f"fully_shard: MixedPrecisionPolicy.{field} must be a floating-point "
                            f"torch.dtype or None, got {value!r}")
    return mp_policy, offload_policy


def cast_floats(dtype, tree):
    """``tree`` with its floating-point tensors cast to ``dtype`` (None: unchanged)."""
    if dtype is None:
        return tree
    return tree_map(lambda t: t.to(dtype) if torch.is_tensor(t) and t.is_floating_point()
                    else t, tree)
