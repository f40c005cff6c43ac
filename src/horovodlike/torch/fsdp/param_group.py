"""ShardedParamGroup: one wrapped module's own parameters as one flat, padded shard per rank.

The parameters (in module order, a tied parameter once) are laid end to end in a flat vector of
``size * shard_numel`` elements (zeros after the last one), and rank i of the set keeps elements
``[i * shard_numel, (i + 1) * shard_numel)`` as ``flat_shard``, the parameter the optimizer sees
(parameters placed with ``Shard(dim)`` are cut along that dimension instead: ShardLayout).
Every rank holds the same number of elements, so the gather and the reduce-scatter need no
per-rank sizes. For the computation the shards are gathered into ``full``, whose storage is
allocated while the module is unsharded and resized to nothing when it is resharded: tensors that
autograd saved during the forward are views of that storage, and regathering into the same
storage before the backward makes them valid again without keeping them alive in between.
"""

from dataclasses import dataclass

import torch

from horovodlike.torch.fsdp.policy import CPUOffloadPolicy
from horovodlike.torch.fsdp.shard_layout import ShardLayout
from horovodlike.torch.mpi_ops import (Average, Sum, allgather_async, allreduce_async,
                                       reducescatter_async, synchronize)


@dataclass
class GradientSync:
    """FSDPModule's switches for one group (FSDP2's setters of the same names)."""

    requires_gradient_sync: bool = True     # reduce-scatter (and all-reduce) at all
    requires_all_reduce: bool = True        # HSDP: all-reduce over the replicate set
    divide_factor: float = None             # None: average over every data-parallel rank
    reshard_after_backward: bool = True
    unshard_in_backward: bool = True
    is_last_backward: bool = True           # wait for the reductions when backward ends


class ShardedParamGroup:
    """The flat shard of ``params`` (unique parameters, all of one dtype and device) on set rank
    ``set_rank`` of ``set_size``; ``locations[i]`` lists (submodule, attribute name) of params[i]."""

    def __init__(self, params, locations, layout, name, mp_policy, offload_policy, dims=None):
        self.locations = locations
        self.shapes = [p.shape for p in params]
        self.set_rank, self.set_size = layout.set_rank, layout.set_size
        self.process_set, self.replicate_set = layout.process_set, layout.replicate_set
        self.name = name
        self.layout = ShardLayout(self.shapes, dims or [None] * len(params), self.set_size)
        self.shard_numel = self.layout.shard_numel
        self.padded_numel = self.layout.padded_numel
        self.device = params[0].device              # where the computation runs
        self.param_dtype = mp_policy.param_dtype or params[0].dtype
        self.reduce_dtype = mp_policy.reduce_dtype or self.param_dtype
        with torch.no_grad():
            shard = self.layout.shard_of([p.detach() for p in params], self.set_rank)
        if isinstance(offload_policy, CPUOffloadPolicy):
            shard = shard.cpu()
            if offload_policy.pin_memory and torch.cuda.is_available():
                shard = shard.pin_memory()
        self.flat_shard = torch.nn.Parameter(shard, requires_grad=params[0].requires_grad)
        self.full = torch.empty(self.padded_numel, dtype=self.param_dtype, device=self.device)
        self.full.untyped_storage().resize_(0)
        self.leaf = None                # what autograd sees: ``full`` as a leaf needing grad
        self.gathered = False           # ``full`` holds the gathered values
        self._gathered_version = None   # of flat_shard when they were gathered
        self._prefetched = None         # (allgather handle, flat_shard version, reorder) started
        self.piece = None               # (piece of full, its set, flat_shard version)
        self.sync = GradientSync()
        self.unsynced_grad = None       # gradients summed while sync was off (full size)
        self.partial_shard = None       # reduce-scattered, not yet all-reduced (HSDP)
        self.pending = []               # reduce-scatters started, not yet added to the grad
        self._gathers = self._scatters = self._exports = self._replicas = 0

    # -------------------------------------------------------------------- unshard / reshard

    def _current(self):
        return self.gathered and self.flat_shard._version == self._gathered_version

    def prefetch(self):
        """Starts the allgather that ``gather`` will wait for (a no-op when gathered or
        started): the gather runs while the module before it computes. From the piece kept
        after the forward when it is still current: inside its smaller set."""
        if self._current() or self._prefetched is not None:
            return
        self._gathers += 1
        version = self.flat_shard._version
        if self.piece is not None and self.piece[2] == version:
            # The pieces are parts of the parameter-major buffer: no reordering.
            source, process_set, reorder = self.piece[0], self.piece[1], False
        else:
            source, process_set = self.flat_shard.detach(), self.process_set
            source = source.to(device=self.device, dtype=self.param_dtype)
            reorder = True
        self.piece = None
        handle = allgather_async(source, name=f"{self.name}.gather.{self._gathers}",
                                 process_set=process_set)
        self._prefetched = (handle, version, reorder)

    def keep_piece(self, process_set, size):
        """Keeps this rank's 1/``size`` of the gathered parameters (its place in
        ``process_set``, the ``size`` consecutive ranks around it) before they are freed."""
        if not self.gathered:
            return
        length = self.padded_numel // size
        start = (self.set_rank % size) * length
        self.piece = (self.full[start:start + length].detach().clone(), process_set,
                      self._gathered_version)

    def gather(self):
        """Allgathers the shards into ``full``'s storage (allocating it again if freed); again
        too when the shard changed since (an optimizer step, a loaded state dict)."""
        if self._current():
            return
        if self._prefetched is None or self._prefetched[1] != self.flat_shard._version:
            if self._prefetched is not None:    # started before the shard changed: stale
                synchronize(self._prefetched[0])
            self._prefetched = None
            self.prefetch()
        handle, version, reorder = self._prefetched
        self._prefetched = None
        gathered = synchronize(handle)
        if reorder:
            gathered = self.layout.to_param_major(gathered)
        storage = self.full.untyped_storage()
        storage.resize_(gathered.numel() * gathered.element_size())
        # A storage copy leaves the version counters alone: the views autograd saved stay valid.
        storage.copy_(gathered.untyped_storage())
        self.gathered, self._gathered_version = True, version

    def expose(self, on_grad_ready):
        """Sets views of the gathered parameters on the submodules (a new autograd leaf when
        none is alive, whose accumulated gradient goes to ``on_grad_ready``)."""
        if self.leaf is None:
            self.leaf = self.full.detach().requires_grad_(self.flat_shard.requires_grad)
            if self.leaf.requires_grad:
                self.leaf.register_post_accumulate_grad_hook(on_grad_ready)
        for view, places in zip(self.layout.views(self.leaf), self.locations):
            for module, attribute in places:
                setattr(module, attribute, view)

    def hide(self):
        """Removes the views from the submodules (module.weight is absent while resharded)."""
        for places in self.locations:
            for module, attribute in places:
                module.__dict__.pop(attribute, None)

    def free(self):
        """Frees the gathered storage; saved views see an empty storage until ``gather``."""
        self.full.untyped_storage().resize_(0)
        self.gathered = False

    def reset(self):
        """Waits for the collectives under way and drops them with every gradient not yet in
        ``flat_shard.grad`` (accumulated without sync, or kept from the all-reduce)."""
        for handle in self.pending + ([self._prefetched[0]] if self._prefetched else []):
            synchronize(handle)
        self._prefetched, self.piece, self.pending = None, None, []
        self.unsynced_grad = self.partial_shard = None

    # --------------------------------------------------------------------------- state dicts

    def full_params(self):
        """Every parameter at its full shape (copies), gathered from the shards."""
        self._exports += 1
        flat = synchronize(allgather_async(self.flat_shard.detach(),
                                           name=f"{self.name}.export.{self._exports}",
                                           process_set=self.process_set))
        return [view.clone() for view in self.layout.views(self.layout.to_param_major(flat))]

    @torch.no_grad()
    def load_full_params(self, tensors):
        """Keeps this rank's shard of full parameters (no communication)."""
        tensors = [t.detach().to(self.flat_shard) for t in tensors]
        self.flat_shard.copy_(self.layout.shard_of(tensors, self.set_rank))

    def local_shards(self):
        """This rank's part of each parameter, views of ``flat_shard``: see ShardLayout."""
        return self.layout.local_views(self.flat_shard, self.set_rank)

    # ---------------------------------------------------------------------------- gradients

    def reduce_gradient(self, full_grad):
        """Sums ``full_grad`` (the padded gradient of every parameter, cast to reduce_dtype)
        into the unsynced gradient, or, when sync is on, starts its reduce-scatter (averaged
        over the data-parallel ranks, or summed and divided by the divide factor); the rest
        of the backward runs while it is sent, and ``finish_gradient`` waits for it."""
        full_grad = full_grad.to(self.reduce_dtype)
        if self.unsynced_grad is not None:
            full_grad = full_grad + self.unsynced_grad
        if not self.sync.requires_gradient_sync:
            self.unsynced_grad = full_grad
            return False
        self.unsynced_grad = None
        self._scatters += 1
        factor = self.sync.divide_factor
        scaling = ({"op": Average} if factor is None
                   else {"op": Sum, "prescale_factor": 1.0 / factor})
        self.pending.append(reducescatter_async(
            self.layout.to_rank_major(full_grad).contiguous(),
            name=f"{self.name}.grad.{self._scatters}", process_set=self.process_set, **scaling))
        return True

    def finish_gradient(self):
        """Adds the reduce-scattered gradients started so far to ``flat_shard.grad`` (with
        HSDP, all-reduced over the replicate set first, or kept apart while the all-reduce is
        off; in the shard's dtype and memory)."""
        while self.pending:
            shard = synchronize(self.pending.pop(0))
            if self.replicate_set is not None:
                if self.partial_shard is not None:
                    shard = shard + self.partial_shard
                self.partial_shard = None
                if not self.sync.requires_all_reduce:
                    self.partial_shard = shard
                    continue
                self._replicas += 1
                op = Average if self.sync.divide_factor is None else Sum
                shard = synchronize(allreduce_async(
                    shard, name=f"{self.name}.replicate.{self._replicas}", op=op,
                    process_set=self.replicate_set))
            shard = shard.to(device=self.flat_shard.device, dtype=self.flat_shard.dtype)
            if self.flat_shard.grad is None:
                self.flat_shard.grad = shard
            else:
                self.flat_shard.grad += shard
