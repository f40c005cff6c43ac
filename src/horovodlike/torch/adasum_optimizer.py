"""DistributedOptimizer(op=hvd.Adasum): combines each rank's update, not its gradient.

As in Horovod, Adasum is applied to what the wrapped optimizer would change: once a parameter's
gradient is ready (after ``backward_passes_per_step`` passes), the wrapped optimizer steps that
parameter alone on this rank, the change (new value minus old) is allreduced with op=Adasum
while the backward pass goes on, and step() sets every parameter to its old value plus the
combined change. For plain SGD the change is -lr times the gradient, so this is SGD on the
Adasum of the gradients; for optimizers with state (momentum, Adam) each rank keeps its own state.
"""

import torch

from horovodlike.torch.local_accumulation import exchange_deferred, no_sync
from horovodlike.torch.mpi_ops import Adasum, allreduce_async_, synchronize
from horovodlike.torch import optimizer_common
from horovodlike.torch.optimizer_common import discard, parameter_names, too_many_passes


class _DistributedAdasumOptimizer(torch.optim.Optimizer):
    def _horovodlike_setup(self, named_parameters, compression, backward_passes_per_step,
                           process_set):
        if backward_passes_per_step < 1:
            raise ValueError("backward_passes_per_step must be at least 1")
        self._compression = compression
        self._process_set = process_set
        self.backward_passes_per_step = backward_passes_per_step
        params = [p for group in self.param_groups for p in group["params"]]
        self._names = parameter_names(params, named_parameters)
        self._starts = {}       # param -> its value before this step's local update
        self._handles = {}      # param -> (handle, compressed change, ctx)
        self._passes_left = {}  # param -> backward passes until its local step
        self._hooks = []
        self._hook_new_params()

    def _hook_new_params(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.requires_grad and p not in self._passes_left:
                    self._passes_left[p] = self.backward_passes_per_step
                    self._hooks.append(p.register_post_accumulate_grad_hook(self._grad_ready))

    def _local_step(self, p):
        """Steps the wrapped optimizer on p alone and starts the Adasum of p's change."""
        if p.grad is not None and p.grad.is_sparse:
            raise ValueError(f"DistributedOptimizer(op=Adasum): the gradient of "
                             f"'{self._names[p]}' is sparse; Adasum needs dense gradients")
        start = self._starts.get(p)
        if start is None:
            start = self._starts[p] = torch.empty_like(p, memory_format=torch.contiguous_format)
        with torch.no_grad():
            start.copy_(p)
        # The other parameters are hidden from the wrapped step, which then touches p only.
        stashed = [group["params"] for group in self.param_groups]
        try:
            for group in self.param_groups:
                group["params"] = [p] if any(q is p for q in group["params"]) else []
            super(self._horovodlike_class, self).step()
        finally:
            for group, params in zip(self.param_groups, stashed):
                group["params"] = params
        with torch.no_grad():
            change = p.detach().sub(start).contiguous()
        compressed, ctx = self._compression.compress(change)
        compressed = compressed.contiguous()
        handle = allreduce_async_(compressed, name=f"adasum.{self._names[p]}", op=Adasum,
                                  process_set=self._process_set)
        self._handles[p] = (handle, compressed, ctx)

    def _grad_ready(self, p):
        if p in self._handles:
            raise too_many_passes(self._names[p], self.backward_passes_per_step)
        self._passes_left[p] -= 1
        if self._passes_left[p] <= 0 and not exchange_deferred(p):
            self._local_step(p)

    def synchronize(self):
        """Nothing to wait for before step(): with Adasum the update is combined, so step()
        does the waiting (as in Horovod)."""

    set_backward_passes_per_step = optimizer_common.set_backward_passes_per_step
    remove_hooks = optimizer_common.remove_hooks

    def no_sync(self):
        """Context manager: backward passes inside it accumulate the gradients locally; the
        first one after it takes the local step and starts its Adasum."""
        return no_sync(p for group in self.param_groups for p in group["params"])

    def skip_synchronize(self):
        raise RuntimeError("DistributedOptimizer(op=Adasum) has no separate synchronize(): "
                           "each rank's update is combined inside step(), so gradients cannot "
                           "be changed between the two (as in Horovod); call step() alone")

    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._hook_new_params()
        try:
            # Parameters whose gradient did not arrive (or not yet for every pass) still take
            # part, so that all ranks run the same allreduces.
            for p in self._passes_left:
                if p.requires_grad and p not in self._handles:
                    self._local_step(p)
            for p, (handle, compressed, ctx) in list(self._handles.items()):
                synchronize(handle)
                combined = self._compression.decompress(compressed, ctx)
                with torch.no_grad():
                    p.copy_(self._starts[p] + combined.view_as(p).to(p.dtype))
        finally:
            for handle, _, _ in self._handles.values():
                discard(handle)
            self._handles.clear()
            for p in self._passes_left:
                self._passes_left[p] = self.backward_passes_per_step
        return loss

    def zero_grad(self, set_to_none=True):
        if self._handles:
            raise RuntimeError("zero_grad() was called after backward() and before step(); "
                               "call step() first")
        return super(self._horovodlike_class, self).zero_grad(set_to_none=set_to_none)
