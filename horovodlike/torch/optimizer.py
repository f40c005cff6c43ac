"""DistributedOptimizer: averages gradients across ranks, overlapping the backward pass.

Each parameter's allreduce starts from a hook the moment autograd has accumulated its
gradient, so communication of late layers overlaps computation of early ones; step() waits for
the outstanding allreduces and then applies the wrapped optimizer's update.
"""

import torch

from horovodlike.common import basics
from horovodlike.torch.compression import Compression
from horovodlike.torch.mpi_ops import Average, Sum, Adasum, allreduce_async_, synchronize


class _DistributedOptimizer(torch.optim.Optimizer):
    def _horovodlike_setup(self, named_parameters, compression, backward_passes_per_step, op,
                           gradient_predivide_factor):
        if op == Adasum:
            raise ValueError("Adasum is not supported by horovodlike; use op=hvd.Average")
        if op not in (Average, Sum):
            raise ValueError(f"DistributedOptimizer: op must be hvd.Average or hvd.Sum, got {op!r}")
        if gradient_predivide_factor != 1.0 and op != Average:
            raise ValueError("gradient_predivide_factor is only defined for op=hvd.Average")
        if backward_passes_per_step < 1:
            raise ValueError("backward_passes_per_step must be at least 1")
        self._compression = compression
        self._op = op
        self._predivide = float(gradient_predivide_factor)
        self.backward_passes_per_step = backward_passes_per_step

        params = [p for group in self.param_groups for p in group["params"]]
        if named_parameters is not None:
            named = list(named_parameters)
            names = [n for n, _ in named]
            duplicates = sorted({n for n in names if names.count(n) > 1})
            if duplicates:
                raise ValueError("named_parameters contains duplicate names: "
                                 + ", ".join(duplicates))
            by_id = {id(p): n for n, p in named}
            unnamed = [i for i, p in enumerate(params) if id(p) not in by_id]
            if unnamed:
                raise ValueError(
                    f"named_parameters was given, but {len(unnamed)} of the optimizer's "
                    "parameters are not in it (positions " + ", ".join(map(str, unnamed[:10]))
                    + "); pass model.named_parameters() of the model being optimized")
        else:
            by_id = {id(p): f"noname.{i}" for i, p in enumerate(params)}
        self._names = {p: by_id[id(p)] for p in params}
        self._handles = {}  # param -> (handle, compressed tensor, ctx)
        self._passes_left = {}
        self._should_synchronize = True
        self._hooks = []
        if basics.size() > 1:
            for p in params:
                if p.requires_grad:
                    self._passes_left[p] = backward_passes_per_step
                    self._hooks.append(p.register_post_accumulate_grad_hook(self._grad_ready))

    def _scales(self):
        if self._op == Average:
            # The core divides by size for Average; split it around the sum as asked.
            return 1.0 / self._predivide, self._predivide
        return 1.0, 1.0

    def _start_allreduce(self, p):
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        compressed, ctx = self._compression.compress(p.grad)
        if not compressed.is_contiguous():
            compressed = compressed.contiguous()
        prescale, postscale = self._scales()
        handle = allreduce_async_(compressed, name=f"allreduce.{self._names[p]}", op=self._op,
                                  prescale_factor=prescale, postscale_factor=postscale)
        self._handles[p] = (handle, compressed, ctx)

    def _grad_ready(self, p):
        if p in self._handles:
            raise RuntimeError(
                f"the gradient of '{self._names[p]}' was computed more than "
                f"backward_passes_per_step={self.backward_passes_per_step} times before "
                "step(); raise backward_passes_per_step or call step() after each backward")
        self._passes_left[p] -= 1
        if self._passes_left[p] == 0:
            self._start_allreduce(p)

    def synchronize(self):
        """Waits for every gradient's allreduce; parameters whose gradient was not produced
        this step are reduced too (with a zero gradient) so that all ranks stay in step."""
        for p in self._passes_left:
            if p not in self._handles:
                self._start_allreduce(p)
        for p, (handle, compressed, ctx) in list(self._handles.items()):
            synchronize(handle)
            reduced = self._compression.decompress(compressed, ctx)
            if reduced.data_ptr() != p.grad.data_ptr():
                p.grad.copy_(reduced)
        self._handles.clear()
        for p in self._passes_left:
            self._passes_left[p] = self.backward_passes_per_step

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
        if self._should_synchronize and basics.size() > 1:
            self.synchronize()
        return super(self.__class__, self).step(closure)

    def zero_grad(self, set_to_none=True):
        if self._handles:
            raise RuntimeError("zero_grad() was called after backward() and before step(); "
                               "call step() first, or synchronize() to finish the allreduces")
        return super(self.__class__, self).zero_grad(set_to_none=set_to_none)


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         num_groups=0, groups=None, sparse_as_dense=False):
    """Wraps a torch optimizer so that step() applies gradients averaged over all ranks.

    The returned object is an instance of a subclass of the optimizer's own class and shares its
    parameter groups and state.
    """
    if num_groups or groups is not None:
        raise ValueError("grouped allreduce (num_groups/groups) is not supported by this version")
    if sparse_as_dense:
        raise ValueError("sparse_as_dense is not supported by this version")
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               {k: v for k, v in _DistributedOptimizer.__dict__.items()
                if k not in ("__dict__", "__weakref__")})
    wrapped = cls.__new__(cls)
    wrapped.__dict__.update(optimizer.__dict__)
    wrapped._horovodlike_setup(named_parameters, compression, backward_passes_per_step, op,
                               gradient_predivide_factor)
    return wrapped
