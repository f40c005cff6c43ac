"""DistributedOptimizer: averages gradients across ranks, overlapping the backward pass.

Each parameter's allreduce starts from a hook the moment autograd has accumulated its
gradient (or, with groups, once every gradient of its group is ready), so communication of late
layers overlaps computation of early ones; step() waits for the outstanding allreduces and then
applies the wrapped optimizer's update.
"""

import warnings

import torch

from horovodlike.common import elastic as _elastic
from horovodlike.common.process_sets import global_process_set
from horovodlike.torch.adasum_optimizer import _DistributedAdasumOptimizer
from horovodlike.torch.compression import Compression
from horovodlike.torch.local_accumulation import exchange_deferred, no_sync
from horovodlike.torch import optimizer_common
from horovodlike.torch.optimizer_common import discard, parameter_names, too_many_passes
from horovodlike.torch.mpi_ops import (Average, Sum, Adasum, allreduce_async_,
                                       grouped_allreduce_async_, synchronize)
from horovodlike.torch.sparse_ops import sparse_allreduce_async


class _DistributedOptimizer(torch.optim.Optimizer):
    def _horovodlike_setup(self, named_parameters, compression, backward_passes_per_step, op,
                           gradient_predivide_factor, groups, sparse_as_dense, process_set):
        # Adasum reaches here only on one rank (see DistributedOptimizer), where it is the
        # gradient itself; should an elastic job grow, its gradients are combined with Adasum.
        if op not in (Average, Sum, Adasum):
            raise ValueError("DistributedOptimizer: op must be hvd.Average, hvd.Sum or "
                             f"hvd.Adasum, got {op!r}")
        if gradient_predivide_factor != 1.0 and op != Average:
            raise ValueError("gradient_predivide_factor is only defined for op=hvd.Average")
        if backward_passes_per_step < 1:
            raise ValueError("backward_passes_per_step must be at least 1")
        self._compression = compression
        self._op = op
        self._predivide = float(gradient_predivide_factor)
        self._sparse_as_dense = sparse_as_dense
        self._process_set = process_set
        self.backward_passes_per_step = backward_passes_per_step

        params = [p for group in self.param_groups for p in group["params"]]
        self._params = params
        self._names = parameter_names(params, named_parameters)
        self._parameter_names = self._names  # Horovod's attribute name, read by its tests
        self._synchronized = False  # synchronize() ran and no gradient has been produced since
        self._group_of = self._make_groups(params, groups)
        self._handles = {}      # param or group index -> (handle, [(param, compressed, ctx)])
        self._ready = {}        # group index -> params whose gradient is ready
        self._passes_left = {}  # params with a hook -> backward passes until their allreduce
        self._should_synchronize = True
        self._hooks = []
        if process_set.size() is None:
            raise ValueError(f"{process_set} is not registered; add it first")
        # An elastic job may grow from one rank: the hooks stay on whatever the size. A rank
        # outside the process set steps on its own gradients (as in Horovod): every rank may
        # build the same optimizer for a set, and only the set's members exchange.
        self._distributed = process_set.included() and (
            process_set.size() > 1 or _elastic.is_elastic())
        self._hook_new_params()

    @staticmethod
    def _make_groups(params, groups):
        """Maps each parameter to the index of its allreduce group (None: on its own)."""
        if groups is None or groups == 0:
            return {}
        if isinstance(groups, int):
            if groups < 0:
                raise ValueError("groups must be a non-negative int or a list of lists of "
                                 "parameters")
            ordered = [p for p in params if p.requires_grad]
            per = -(-len(ordered) // groups) if ordered else 1
            return {p: i // per for i, p in enumerate(ordered)}
        mapping = {}
        for index, group in enumerate(groups):
            for p in group:
                if p in mapping:
                    raise ValueError("a parameter appears in two groups")
                mapping[p] = index
        return mapping

    def _hook_new_params(self):
        """Hooks every parameter that requires a gradient and has no hook yet (requires_grad may
        be switched on between steps)."""
        if not self._distributed:
            return
        for p in self._params:
            if p.requires_grad and p not in self._passes_left:
                self._passes_left[p] = self.backward_passes_per_step
                self._hooks.append(p.register_post_accumulate_grad_hook(self._grad_ready))

    def _scales(self):
        if self._op == Average:
            # The core divides by size for Average; split it around the sum as asked.
            return 1.0 / self._predivide, self._predivide
        return 1.0, 1.0

    def _prepare(self, p):
        """The tensor to reduce for p's gradient: densified or compressed as configured."""
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        if p.grad.is_sparse and not self._sparse_as_dense:
            return p.grad, None
        # sparse_as_dense: reduce a dense copy; the gradient goes back sparse (as in Horovod),
        # so optimizers that want sparse gradients (SparseAdam) still get them.
        grad = p.grad.to_dense() if p.grad.is_sparse else p.grad
        compressed, ctx = self._compression.compress(grad)
        return compressed.contiguous(), ctx

    def _start_allreduce(self, p):
        group = self._group_of.get(p)
        if group is not None:
            members = [q for q, g in self._group_of.items() if g == group and q.requires_grad]
            self._ready.setdefault(group, set()).add(p)
            if len(self._ready[group]) < len(members):
                return
            prepared = [(q, *self._prepare(q)) for q in members]
            prescale, postscale = self._scales()
            handle = grouped_allreduce_async_(
                [c for _, c, _ in prepared], name=f"allreduce.group.{group}", op=self._op,
                prescale_factor=prescale, postscale_factor=postscale,
                process_set=self._process_set)
            self._handles[("group", group)] = (handle, prepared)
            del self._ready[group]
            return
        compressed, ctx = self._prepare(p)
        name = f"allreduce.{self._names[p]}"
        if compressed.is_sparse:
            handle = sparse_allreduce_async(compressed, name=name, op=self._op,
                                            process_set=self._process_set)
        else:
            prescale, postscale = self._scales()
            handle = allreduce_async_(compressed, name=name, op=self._op,
                                      prescale_factor=prescale, postscale_factor=postscale,
                                      process_set=self._process_set)
        self._handles[p] = (handle, [(p, compressed, ctx)])

    def _pending(self, p):
        group = self._group_of.get(p)
        if group is None:
            return p in self._handles
        return ("group", group) in self._handles or p in self._ready.get(group, ())

    def _grad_ready(self, p):
        self._synchronized = False
        if self._pending(p):
            raise too_many_passes(self._names[p], self.backward_passes_per_step)
        self._passes_left[p] -= 1
        # Past the count inside no_sync: the first pass outside it starts the exchange.
        if self._passes_left[p] <= 0 and not exchange_deferred(p):
            self._start_allreduce(p)

    def synchronize(self):
        """Waits for every gradient's allreduce. Parameters whose gradient was not produced
        this step are reduced too (with a zero gradient) so that all ranks stay in step."""
        if not self._distributed:
            return
        self._hook_new_params()
        for p in self._passes_left:
            if p.requires_grad and not self._pending(p):
                self._start_allreduce(p)
        try:
            for key, (handle, prepared) in list(self._handles.items()):
                result = synchronize(handle)
                outputs = result if isinstance(result, list) else [result]
                for (p, compressed, ctx), output in zip(prepared, outputs):
                    if compressed.is_sparse:
                        p.grad = output
                        continue
                    reduced = self._compression.decompress(compressed, ctx)
                    if p.grad.is_sparse:
                        p.grad = reduced.to_sparse()
                        continue
                    if reduced.data_ptr() != p.grad.data_ptr():
                        p.grad.copy_(reduced)
        finally:
            # Also after a failure: an elastic job restores the state and goes on from here.
            for handle, _ in self._handles.values():
                discard(handle)
            self._handles.clear()
            self._ready.clear()
            for p in self._passes_left:
                self._passes_left[p] = self.backward_passes_per_step
        self._synchronized = True

    set_backward_passes_per_step = optimizer_common.set_backward_passes_per_step
    remove_hooks = optimizer_common.remove_hooks

    def no_sync(self):
        """Context manager: backward passes inside it accumulate the gradients locally; the
        first one after it exchanges the sum (local_accumulation.py)."""
        return no_sync(self._params)

    def skip_synchronize(self):
        """Context manager: step() inside it does not synchronize (call synchronize() first)."""
        optimizer = self

        class _Skip:
            def __enter__(self):
                optimizer._should_synchronize = False

            def __exit__(self, *exc):
                optimizer._should_synchronize = True

        return _Skip()

    def step(self, closure=None):
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() "
                              "context after optimizer.synchronize(): the gradients are "
                              "reduced a second time. Call step() inside "
                              "`with optimizer.skip_synchronize():` after synchronize().")
            self.synchronize()
        self._synchronized = False
        return super(self._horovodlike_class, self).step(closure)

    def zero_grad(self, set_to_none=True):
        if self._handles or self._ready:
            raise RuntimeError("zero_grad() was called after backward() and before step(); "
                               "call step() first, or synchronize() to finish the allreduces")
        return super(self._horovodlike_class, self).zero_grad(set_to_none=set_to_none)


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         num_groups=0, groups=None, sparse_as_dense=False,
                         process_set=global_process_set):
    """Wraps a torch optimizer so that step() applies gradients averaged over all ranks.

    ``groups``: an int (split the parameters into that many groups) or a list of lists of
    parameters; each group is reduced as one fused allreduce once all of its gradients are
    ready. ``num_groups`` is the older name of the int form. ``sparse_as_dense``: reduce sparse
    gradients as dense tensors instead of gathering their indices and values.

    ``op=hvd.Adasum`` (on more than one rank) combines each rank's update with Adasum instead of
    averaging gradients (adasum_optimizer.py); as in Horovod, gradient_predivide_factor is then
    not allowed, and groups and sparse_as_dense do not apply.

    The returned object is an instance of a subclass of the optimizer's own class and shares its
    parameter groups and state.
    """
    if num_groups and groups is not None:
        raise ValueError("give num_groups or groups, not both")
    if op == Adasum and gradient_predivide_factor != 1.0:
        raise ValueError("DistributedOptimizer: gradient_predivide_factor is only defined for "
                         "op=hvd.Average, not for op=hvd.Adasum (Adasum is not averaged)")
    if process_set.size() is None:
        raise ValueError(f"{process_set} is not registered; add it first")
    adasum = op == Adasum and process_set.size() > 1 and process_set.included()
    if adasum and (groups or num_groups):
        raise ValueError("DistributedOptimizer: groups and num_groups do not apply to "
                         "op=hvd.Adasum, which combines each parameter's update on its own")
    base = _DistributedAdasumOptimizer if adasum else _DistributedOptimizer
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               {k: v for k, v in base.__dict__.items()
                if k not in ("__dict__", "__weakref__")})
    # The wrapper's methods reach the wrapped class's through this, not self.__class__: an
    # object whose class subclasses the wrapper (PyTorch Lightning's LightningOptimizer)
    # would otherwise call the wrapper's method again, without end.
    cls._horovodlike_class = cls
    wrapped = cls.__new__(cls)
    wrapped.__dict__.update(optimizer.__dict__)
    _keep_scheduler_tracking(wrapped, optimizer)
    if adasum:
        wrapped._horovodlike_setup(named_parameters, compression, backward_passes_per_step,
                                   process_set)
        return wrapped
    wrapped._horovodlike_setup(named_parameters, compression, backward_passes_per_step, op,
                               gradient_predivide_factor, groups if groups is not None else
                               num_groups, sparse_as_dense, process_set)
    return wrapped


def _keep_scheduler_tracking(wrapped, optimizer):
    """An LR scheduler made before the wrapping has put a ``step`` of its own on the optimizer
    object (to notice a scheduler step taken before the first optimizer step). Copied over, it
    would call the plain optimizer's step on the original object, skipping the allreduce, and
    the ranks would drift apart without a word. The wrapped object gets a step that runs the
    wrapper's and still tells the scheduler (on the object it holds) that a step was taken."""
    for name in ("step", "zero_grad"):
        if name in wrapped.__dict__:
            del wrapped.__dict__[name]
    patched = optimizer.__dict__.get("step")
    if patched is None:
        return
    wrapper_step = type(wrapped).step

    def step(*args, **kwargs):
        optimizer._opt_called = True
        return wrapper_step(wrapped, *args, **kwargs)

    step._wrapped_by_lr_sched = getattr(patched, "_wrapped_by_lr_sched", True)
    wrapped.step = step

