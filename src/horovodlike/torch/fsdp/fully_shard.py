"""fully_shard: a module's parameters sharded over a process set, gathered for its forward and
backward, their gradients reduce-scattered (ZeRO-3), under the names of PyTorch's FSDP2.

    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)                   # the root last: bottom-up, as FSDP2
    optimizer = torch.optim.Adam(model.parameters())    # after fully_shard: it steps on shards

Each call makes the module's own parameters (those not under an already wrapped submodule) one
ShardedParamGroup, registered on the module as the parameter ``_flat_shard``, and changes the
module's class to a subclass of FSDPModule and of its class, which adds unshard/reshard and the
switches. Hooks: before the forward, gather and set the parameters as views of the gathered
buffer; after it, free the buffer (reshard_after_forward) and register, on the outputs, a hook
that gathers again when the backward reaches the module; when the backward has accumulated the
module's gradient, start its reduce-scatter, free the buffer, and add the result to
``_flat_shard.grad`` when the whole backward is done (the rest of the backward runs meanwhile).
Each forward and backward also starts the gather of the module expected next (prefetch.py).
"""

import itertools
import weakref

import torch
from torch.autograd import Variable
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.utils._pytree import tree_flatten

from horovodlike.common import basics
from horovodlike.torch.fsdp.mesh import check_reshard, reshard_set, resolve_mesh
from horovodlike.torch.fsdp import prefetch
from horovodlike.torch.fsdp.param_group import ShardedParamGroup
from horovodlike.torch.fsdp.policy import cast_floats, check_policies
from horovodlike.torch.fsdp.shard_layout import placement_dim

FLAT_SHARD = "_flat_shard"

# The parameters fully_shard took (to find an optimizer built on them, or a second owner) and
# the submodules whose parameters it took, each with the wrapped module that owns them.
_taken_modules = weakref.WeakKeyDictionary()


class _TakenParams:
    """Parameter -> owner, by identity (a tensor's == compares values), forgetting a
    parameter once it is collected."""

    def __init__(self):
        self._owners = {}

    def add(self, param, owner):
        key = id(param)
        self._owners[key] = (weakref.ref(param, lambda _: self._owners.pop(key, None)), owner)

    def get(self, param):
        entry = self._owners.get(id(param))
        return entry[1] if entry is not None and entry[0]() is param else None


_taken_params = _TakenParams()
# Collective names must agree across ranks: groups are numbered in creation order, the same on
# every rank of a set because wrapping is part of the same program.
_instances = itertools.count()
_subclasses = {}


class FSDPModule:
    """What fully_shard adds to a module (``isinstance(module, FSDPModule)`` tells a wrapped
    one). The methods act on this module's group; the setters also on wrapped submodules
    unless ``recurse=False``."""

    def unshard(self, async_op=False):
        """Gathers this module's parameters and sets them on its submodules until reshard().
        The gather is done when this returns; with ``async_op=True`` a handle whose ``wait()``
        returns at once is given, as code written for FSDP2 expects one."""
        group = self._fsdp_group
        if group is not None:
            group.gather()
            group.expose(self._fsdp_on_grad_ready)
        return _DoneHandle() if async_op else None

    def reshard(self):
        """Frees the gathered parameters; the module keeps only its shard."""
        group = self._fsdp_group
        if group is not None:
            group.hide()
            group.free()

    def reset_iter_state(self):
        """After a forward or backward that raised, on the root: waits for the gathers and
        gradient reductions under way and discards them, with the gradients accumulated
        without sync or kept from HSDP's all-reduce (restart an accumulation), reshards every
        wrapped module under this one and forgets the unfinished iteration. Collective: every
        rank calls it (the failure happened on all of them)."""
        prefetch.reset()
        for module in _wrapped(self, True):
            if module._fsdp_group is not None:
                module._fsdp_group.reset()
                _unfinished.pop(module._fsdp_group.name, None)
                module.reshard()

    def set_requires_gradient_sync(self, requires_gradient_sync, *, recurse=True):
        """Off: backward sums the full gradients locally (gradient accumulation without
        communication); the first backward with it on again reduce-scatters the sum (and, with
        HSDP, all-reduces it: this switch covers both)."""
        _set_sync(self, recurse, requires_gradient_sync=bool(requires_gradient_sync),
                  requires_all_reduce=bool(requires_gradient_sync))
        for module in _wrapped(self, recurse):
            module._fsdp_requires_gradient_sync = bool(requires_gradient_sync)

    def get_requires_gradient_sync(self):
        """Whether this module's next backward reduces its gradients (what
        ``set_requires_gradient_sync`` last set on it; True at first)."""
        return self._fsdp_requires_gradient_sync

    def set_requires_all_reduce(self, requires_all_reduce, *, recurse=True):
        """HSDP: off, each backward still reduce-scatters inside the shard set but keeps the
        result apart instead of all-reducing it over the replicate set (the shards' ``.grad``
        stays untouched); the first backward with it on adds them up and all-reduces once.
        Without a replicate dimension it changes nothing."""
        _set_sync(self, recurse, requires_all_reduce=bool(requires_all_reduce))

    def set_reshard_after_forward(self, reshard_after_forward, *, recurse=True):
        """True frees the gathered parameters after the forward and gathers them again in the
        backward (least memory); False keeps them until the backward (one gather less); an int
        keeps 1/int of them, gathered again inside sets of that many consecutive ranks (a
        host). Collective with an int (it registers those sets): every rank calls it."""
        for module in _wrapped(self, recurse):
            _set_reshard(module, reshard_after_forward)

    def set_reshard_after_backward(self, reshard_after_backward, *, recurse=True):
        """False keeps the gathered parameters after the backward, so that the next forward
        (another micro-batch of an accumulation, with no optimizer step between) needs no
        gather; a step or a loaded state dict still makes the next forward gather again."""
        _set_sync(self, recurse, reshard_after_backward=bool(reshard_after_backward))

    def set_unshard_in_backward(self, unshard_in_backward):
        """False: the backward does not gather this module's parameters, for modules whose
        backward does not read them (an embedding: its gradient needs only the indices).
        Only for those: any other module computes with freed parameters."""
        _set_sync(self, False, unshard_in_backward=bool(unshard_in_backward))

    def set_is_last_backward(self, is_last_backward):
        """False: the backwards that follow return without waiting for the gradient
        reductions they started (they go on under the next micro-batch's forward and
        backward); the next backward while it is True, or the next optimizer ``step()``,
        waits for them all and adds them to the shards' ``.grad``."""
        _set_sync(self, True, is_last_backward=bool(is_last_backward))

    def set_gradient_divide_factor(self, factor):
        """The gradients are summed over every data-parallel rank (both dimensions with HSDP)
        and divided by ``factor``, instead of averaged over them."""
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or factor <= 0:
            raise ValueError(f"set_gradient_divide_factor: factor must be a positive number, "
                             f"got {factor!r}")
        _set_sync(self, False, divide_factor=float(factor))

    def set_reduce_scatter_divide_factor(self, factor):
        """FSDP2's older name of ``set_gradient_divide_factor``."""
        self.set_gradient_divide_factor(factor)

    def set_post_optim_event(self, event):
        """FSDP2 makes the next gathers wait for this CUDA event; here the gathers start from
        the shards' values when they are issued, after the optimizer step in program order,
        so there is no event to wait for."""
        raise NotImplementedError(
            "set_post_optim_event: horovodlike's gathers are ordered after the optimizer "
            "step by the program itself (they copy the shards when issued); there is no "
            "stream to make wait: leave the call out")

    def set_modules_to_forward_prefetch(self, modules):
        """Wrapped modules whose gather starts right after this module's, before its forward
        (typically the next block): their gather overlaps this module's computation. Replaces
        the implicit choice (the module that ran next last time); ``[]`` prefetches none."""
        self._fsdp_forward_prefetch = _check_prefetch(modules, "forward")

    def set_modules_to_backward_prefetch(self, modules):
        """Wrapped modules whose gather starts when the backward reaches this module (typically
        the block before it). Replaces the implicit choice (the module whose forward ended
        before this one's); ``[]`` prefetches none."""
        self._fsdp_backward_prefetch = _check_prefetch(modules, "backward")

    # ------------------------------------------------------------------------------ hooks

    def _fsdp_pre_forward(self, module, args, kwargs):
        prefetch.forward_started(self, self._fsdp_group is not None)
        self.unshard()
        _prefetch(prefetch.forward_targets(self))
        policy = self._fsdp_mp_policy
        if policy.cast_forward_inputs and policy.param_dtype is not None:
            return cast_floats(policy.param_dtype, (args, kwargs))
        return None

    def _fsdp_post_forward(self, module, args, output):
        group = self._fsdp_group
        output = cast_floats(self._fsdp_mp_policy.output_dtype, output)
        prefetch.forward_ended(self, group is not None)
        if group is None:               # a module without parameters of its own: casts only
            return output
        keep = self._fsdp_reshard_after_forward
        if keep is not True and keep is not False:
            group.keep_piece(self._fsdp_reshard_set, keep)
        if keep is not False:
            self.reshard()
        tensors = [t for t in tree_flatten(output)[0]
                   if torch.is_tensor(t) and t.requires_grad]
        if tensors and group.leaf is not None and group.leaf.requires_grad:
            # The first output gradient the backward computes gathers again (once: gather()
            # does nothing while gathered).
            for t in tensors:
                t.register_hook(self._fsdp_pre_backward)
        return output

    def _fsdp_pre_backward(self, grad):
        group = self._fsdp_group
        if group.sync.unshard_in_backward:
            group.gather()
        _prefetch(prefetch.backward_targets(self))

    def _fsdp_on_grad_ready(self, leaf):
        grad, leaf.grad = leaf.grad, None
        group = self._fsdp_group
        if group.reduce_gradient(grad):
            _unfinished[group.name] = group
            if group.sync.is_last_backward:
                # The shard's gradient is complete when the whole backward is: wait there.
                Variable._execution_engine.queue_callback(finish_gradients)
        if group.sync.reshard_after_backward:
            self.reshard()
        elif group.gathered:            # unsharded, as after unshard(): the views are set
            group.expose(self._fsdp_on_grad_ready)


# Groups whose reduce-scatters are under way, by name (the same on every rank).
_unfinished = {}


def finish_gradients():
    """Waits for every gradient reduction under way and adds it to its shard's ``.grad``, in
    the groups' creation order (the same on every rank: HSDP's all-reduce is collective)."""
    for name in sorted(_unfinished, key=lambda n: int(n.rsplit(".", 1)[1])):
        _unfinished.pop(name).finish_gradient()


def _set_sync(module, recurse, **values):
    for wrapped in _wrapped(module, recurse):
        if wrapped._fsdp_group is not None:
            for field, value in values.items():
                setattr(wrapped._fsdp_group.sync, field, value)


def _check_prefetch(modules, which):
    modules = list(modules)
    for m in modules:
        if not isinstance(m, FSDPModule):
            raise ValueError(f"set_modules_to_{which}_prefetch: {type(m).__name__} is not "
                             "wrapped by fully_shard; give wrapped modules")
    return modules


def _prefetch(modules):
    for m in modules:
        if m._fsdp_group is not None:
            m._fsdp_group.prefetch()


class _DoneHandle:
    def wait(self):
        return None


def _wrapped(module, recurse):
    return [m for m in module.modules() if isinstance(m, FSDPModule)] if recurse else [module]


def _set_reshard(module, value):
    value = check_reshard(value, module._fsdp_layout)
    module._fsdp_reshard_set = (reshard_set(module._fsdp_layout, value)
                                if value is not True and value is not False else None)
    module._fsdp_reshard_after_forward = value


def _own_submodules(module, prefix=""):
    """(path, submodule) of ``module`` and its submodules, not entering wrapped ones."""
    yield prefix, module
    for name, child in module.named_children():
        if not isinstance(child, FSDPModule):
            yield from _own_submodules(child, f"{prefix}{name}.")


def _own_parameters(module, ignored):
    """The module's own parameters (each once, in module order) and where each one is set."""
    params, places = {}, {}
    for path, submodule in _own_submodules(module):
        if submodule in _taken_modules:
            raise ValueError(
                f"fully_shard: submodule '{path.rstrip('.') or type(module).__name__}' already "
                f"had its parameters sharded with {_taken_modules[submodule]}; apply fully_shard "
                "bottom-up: each block first, then the modules that hold them, the root last")
        for name, param in submodule._parameters.items():
            if param is None or id(param) in ignored:
                continue
            if _taken_params.get(param) is not None:
                raise ValueError(
                    f"fully_shard: parameter '{path}{name}' is shared with "
                    f"{_taken_params.get(param)}, "
                    "which fully_shard already wrapped; a parameter can belong to one wrapped "
                    "module only: wrap a module that holds every use of it (do not wrap the "
                    "submodules that share it separately), pass it in ignored_params, or untie it")
            params.setdefault(id(param), param)
            places.setdefault(id(param), []).append((submodule, name))
    params = list(params.values())
    kinds = {(p.dtype, p.device, p.requires_grad) for p in params}
    if len(kinds) > 1:
        raise ValueError(
            f"fully_shard: the parameters of {type(module).__name__} mix dtype/device/"
            f"requires_grad {sorted(map(str, kinds))}; one wrapped module shards parameters of "
            "one kind: wrap the differing submodules separately or pass them in ignored_params")
    return params, [places[id(p)] for p in params]


def _check_optimizer(optimizer, args, kwargs):
    """Before any optimizer step: an optimizer built before fully_shard holds the parameters it
    replaced, which no longer get gradients; say so instead of silently not training. The
    reductions left under way by backwards that were not the last end here."""
    finish_gradients()
    for group in optimizer.param_groups:
        for param in group["params"]:
            owner = _taken_params.get(param)
            if owner is not None:
                raise RuntimeError(
                    f"{type(optimizer).__name__} holds a parameter that fully_shard replaced by "
                    f"the shards of {owner}; build the optimizer after "
                    "fully_shard(model), from model.parameters()")


_optimizer_check = []


def _subclass(cls):
    if cls not in _subclasses:
        _subclasses[cls] = type(f"FSDP{cls.__name__}", (FSDPModule, cls), {})
    return _subclasses[cls]


def _placements(shard_placement_fn, params, locations):
    """The Shard dimension of each parameter (None: the default), from shard_placement_fn."""
    if shard_placement_fn is None:
        return None
    if not callable(shard_placement_fn):
        raise TypeError(f"fully_shard: shard_placement_fn must be a callable taking a "
                        f"parameter, got {type(shard_placement_fn).__name__}")
    return [placement_dim(shard_placement_fn(p),
                          f"{type(places[0][0]).__name__}.{places[0][1]}", p.shape)
            for p, places in zip(params, locations)]


def fully_shard(module, *, mesh=None, reshard_after_forward=True, ignored_params=None,
                shard_placement_fn=None, mp_policy=None, offload_policy=None):
    """Shards ``module``'s own parameters over ``mesh`` (a ProcessSet; a 1-D ProcessMesh or
    DeviceMesh; or a 2-D one whose last dimension shards and first replicates (HSDP); the whole
    job by default) and returns the module, now also an FSDPModule.

    Apply it to the blocks first, then the root. Every rank of the mesh calls it with the same
    module (same parameter values: build it from one seed or broadcast it first). Parameters in
    ``ignored_params`` stay as they are, neither sharded nor averaged. ``shard_placement_fn``
    maps a parameter to ``Shard(dim)`` (each rank holds ``ceil(size / n)`` consecutive
    entries along ``dim``, the last ones padded) or None (the default). ``mp_policy`` (a
    MixedPrecisionPolicy) and ``offload_policy`` (CPUOffloadPolicy) are FSDP2's
    (horovodlike.torch.fsdp.policy)."""
    if not basics.is_initialized():
        raise ValueError("fully_shard needs horovodlike.init() first")
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"fully_shard takes one torch.nn.Module, got {type(module).__name__}")
    if isinstance(module, FSDPModule):
        raise ValueError(f"fully_shard: {type(module).__name__} is already wrapped by "
                         "fully_shard; wrap each module once")
    mp_policy, offload_policy = check_policies(mp_policy, offload_policy)
    layout = resolve_mesh(mesh)
    check_reshard(reshard_after_forward, layout)
    params, locations = _own_parameters(module, {id(p) for p in ignored_params or ()})
    dims = _placements(shard_placement_fn, params, locations)
    name = f"fsdp.{next(_instances)}"
    owner = f"{type(module).__name__} ({name})"
    group = (ShardedParamGroup(params, locations, layout, name, mp_policy, offload_policy, dims)
             if params else None)
    for param, places in zip(params, locations):
        _taken_params.add(param, owner)
        for submodule, attribute in places:
            del submodule._parameters[attribute]
            _taken_modules[submodule] = owner
    if group is not None:
        module.register_parameter(FLAT_SHARD, group.flat_shard)
    module.__class__ = _subclass(type(module))
    module._fsdp_group = group
    module._fsdp_layout, module._fsdp_mp_policy = layout, mp_policy
    _set_reshard(module, reshard_after_forward)
    module._fsdp_process_set = layout.process_set
    # Prefetching: None until set by hand (then the implicit order of prefetch.py is used).
    module._fsdp_forward_prefetch, module._fsdp_backward_prefetch = None, None
    module._fsdp_next_forward, module._fsdp_next_backward = None, None
    module._fsdp_requires_gradient_sync = True
    module.register_forward_pre_hook(module._fsdp_pre_forward, with_kwargs=True)
    module.register_forward_hook(module._fsdp_post_forward)
    if not _optimizer_check:
        _optimizer_check.append(
            register_optimizer_step_pre_hook(_check_optimizer))
    return module
