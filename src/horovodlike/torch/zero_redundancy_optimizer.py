"""ZeroRedundancyOptimizer: the optimizer state sharded over the ranks of a process set.

    optimizer = hvd.ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, lr=1e-3)
    loss.backward()
    optimizer.step()     # reduce-scatter gradients, update this rank's shard, allgather params

Each parameter group's parameters (per dtype) are viewed as one flat vector, cut into as many
contiguous shards as the set has ranks (the first ``numel % size`` ranks hold one more element,
the split ``reducescatter`` makes). Rank i keeps a flat parameter for its shard and a local
``optimizer_class`` over those shards (``.optim``), so an element-wise optimizer (SGD, momentum,
Adam, AdamW, RMSprop, Adagrad...) holds 1/N of the state and takes exactly the steps the
unsharded optimizer would take on the set's averaged gradients. An optimizer that looks across
elements of one parameter (LAMB's norms, L-BFGS) would see shards instead and is not supported.
"""

import itertools

import torch

from horovodlike.common import basics
from horovodlike.common.process_sets import global_process_set, set_ranks
from horovodlike.torch.mpi_ops import (Average, grouped_allgather_async,
                                       grouped_reducescatter_async, synchronize)


def _shard_bounds(numel, size):
    """(start, length) of every rank's shard, as reducescatter splits ``numel`` rows."""
    bounds, start = [], 0
    for r in range(size):
        length = numel // size + (1 if r < numel % size else 0)
        bounds.append((start, length))
        start += length
    return bounds


class _Bucket:
    """The parameters of one group with one dtype and device, as one flat vector, and this
    rank's shard of it (the parameter the local optimizer updates)."""

    def __init__(self, params, set_rank, set_size):
        self.params = params
        self.numels = [p.numel() for p in params]
        self.bounds = _shard_bounds(sum(self.numels), set_size)
        start, length = self.bounds[set_rank]
        flat = torch.cat([p.detach().reshape(-1) for p in params])
        self.shard = torch.nn.Parameter(flat[start:start + length].clone())

    def flat_grad(self):
        # A parameter without a gradient on this rank counts as zero, as in DistributedOptimizer,
        # so every rank sends the same sizes.
        return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                          for p in self.params])

    def write_back(self, flat):
        with torch.no_grad():
            for p, piece in zip(self.params, flat.split(self.numels)):
                p.copy_(piece.view_as(p))


# Collective names must agree across ranks: instances are numbered in creation order, which is
# the same on every rank of a set because creating one is part of the same program.
_instances = itertools.count()


class ZeroRedundancyOptimizer(torch.optim.Optimizer):
    """Wraps ``optimizer_class`` so that each rank of ``process_set`` keeps 1/N of its state.

    As ``torch.distributed.optim.ZeroRedundancyOptimizer``: ``params`` are the parameters (or
    parameter groups) of the whole model, identical on every rank of the set (broadcast them
    first); ``**defaults`` go to ``optimizer_class``; ``.optim`` is this rank's local optimizer.
    ``step()`` averages the gradients over the set itself (do not wrap it in
    DistributedOptimizer). ``consolidate_state_dict(to)`` then ``state_dict()`` on rank ``to``
    gives the state dict the unsharded optimizer would have; ``load_state_dict`` takes one.
    """

    def __init__(self, params, optimizer_class, process_set=global_process_set, **defaults):
        if not basics.is_initialized():
            raise ValueError("ZeroRedundancyOptimizer needs horovodlike.init() first")
        if not (isinstance(optimizer_class, type) and
                issubclass(optimizer_class, torch.optim.Optimizer)):
            raise TypeError("ZeroRedundancyOptimizer: optimizer_class must be a "
                            f"torch.optim.Optimizer subclass, got {optimizer_class!r}")
        self.process_set = process_set
        ranks = set_ranks(process_set)
        if basics.rank() not in ranks:
            raise ValueError(f"ZeroRedundancyOptimizer: rank {basics.rank()} is not in "
                             f"{process_set}")
        self._set_rank, self._set_size = ranks.index(basics.rank()), len(ranks)
        self._optimizer_class = optimizer_class
        self._buckets = []          # per parameter group: its buckets
        self._consolidated = None   # (to, state dict) after consolidate_state_dict
        self._steps = 0
        self._name = f"zero.{next(_instances)}"
        self.optim = None
        # The base class calls add_param_group for each group; the local optimizer is made
        # once the first group's shards exist so that it sees optimizer_class's defaults.
        super().__init__(params, defaults)

    # ------------------------------------------------------------------------- parameters

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        by_kind = {}
        for p in group["params"]:
            by_kind.setdefault((p.dtype, p.device), []).append(p)
        buckets = [_Bucket(ps, self._set_rank, self._set_size) for ps in by_kind.values()]
        self._buckets.append(buckets)
        local = {k: v for k, v in group.items() if k != "params"}
        local["params"] = [b.shard for b in buckets]
        if self.optim is None:
            self.optim = self._optimizer_class([local], **self.defaults)
            self.defaults = self.optim.defaults
        else:
            self.optim.add_param_group(local)
        # The group shows the hyperparameters the local optimizer filled in (betas, eps...).
        for key, value in self.optim.param_groups[-1].items():
            if key != "params":
                group.setdefault(key, value)

    def _sync_hyperparameters(self):
        # Schedulers change self.param_groups; the local optimizer must follow.
        for group, local in zip(self.param_groups, self.optim.param_groups):
            for key, value in group.items():
                if key != "params":
                    local[key] = value

    # ------------------------------------------------------------------------------- step

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        buckets = [b for group in self._buckets for b in group]
        self._steps += 1
        name = f"{self._name}.{self._steps}"
        grads = synchronize(grouped_reducescatter_async([b.flat_grad() for b in buckets],
                                                        name=name + ".grads", op=Average,
                                                        process_set=self.process_set))
        for bucket, grad in zip(buckets, grads):
            bucket.shard.grad = grad.view_as(bucket.shard)
        self._sync_hyperparameters()
        self.optim.step()
        for bucket in buckets:
            bucket.shard.grad = None
        params = synchronize(grouped_allgather_async([b.shard.detach() for b in buckets],
                                                     name=name + ".params",
                                                     process_set=self.process_set))
        for bucket, flat in zip(buckets, params):
            bucket.write_back(flat)
        return loss

    # ------------------------------------------------------------------------ state dicts

    def _local_entries(self):
        """(group, bucket, key, value, sharded) of the local state in a fixed order, the same
        on every rank; per-element tensors (shaped like the shard) are the sharded ones."""
        entries = []
        for g, group in enumerate(self._buckets):
            for b, bucket in enumerate(group):
                state = self.optim.state.get(bucket.shard, {})
                for key in sorted(state):
                    value = state[key]
                    sharded = torch.is_tensor(value) and value.shape == bucket.shard.shape
                    entries.append((g, b, key, value, sharded))
        return entries

    def consolidate_state_dict(self, to=0):
        """Collects the whole optimizer state on global rank ``to`` (collective over the set:
        every rank calls it). ``state_dict()`` on that rank then returns it."""
        ranks = set_ranks(self.process_set)
        if to not in ranks:
            raise ValueError(f"consolidate_state_dict: rank {to} is not in {self.process_set} "
                             f"(ranks {ranks}); give the global rank that should get the state")
        entries = self._local_entries()
        to_gather = [value.detach() for *_, value, sharded in entries if sharded]
        gathered = iter(synchronize(grouped_allgather_async(
            to_gather, name=f"{self._name}.consolidate.{self._steps}",
            process_set=self.process_set)) if to_gather else [])
        whole = {}  # (group, bucket) -> {key: (value over the whole bucket, sharded)}
        for g, b, key, value, sharded in entries:
            whole.setdefault((g, b), {})[key] = (next(gathered) if sharded else value, sharded)
        if basics.rank() != to:
            self._consolidated = (to, None)
            return
        state, param_groups, first_index = {}, [], 0
        for g, group in enumerate(self.param_groups):
            index = {id(p): first_index + i for i, p in enumerate(group["params"])}
            for b, bucket in enumerate(self._buckets[g]):
                values, offset = whole.get((g, b)), 0
                for p, numel in zip(bucket.params, bucket.numels):
                    if values:
                        state[index[id(p)]] = {
                            key: (v[offset:offset + numel].view_as(p).clone() if sharded
                                  else (v.clone() if torch.is_tensor(v) else v))
                            for key, (v, sharded) in values.items()}
                    offset += numel
            param_groups.append({**{k: v for k, v in group.items() if k != "params"},
                                 "params": [index[id(p)] for p in group["params"]]})
            first_index += len(group["params"])
        self._consolidated = (to, {"state": state, "param_groups": param_groups})

    def state_dict(self):
        """The consolidated state dict, in the unsharded optimizer's format; only on the rank
        given to ``consolidate_state_dict`` after it ran."""
        if self._consolidated is None or self._consolidated[0] != basics.rank():
            raise RuntimeError(
                f"ZeroRedundancyOptimizer.state_dict() on rank {basics.rank()}: call "
                "consolidate_state_dict(to=this rank) on every rank of the set first; only "
                "that rank gets the state")
        return self._consolidated[1]

    def load_state_dict(self, state_dict):
        """Loads a state dict in the unsharded optimizer's format (from ``state_dict()`` or
        from a plain ``optimizer_class``) on every rank; each rank keeps its shard."""
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups) or any(
                len(saved["params"]) != len(group["params"])
                for saved, group in zip(groups, self.param_groups)):
            raise ValueError(
                "load_state_dict: the state dict has groups of "
                f"{[len(s['params']) for s in groups]} parameters but this optimizer has "
                f"{[len(g['params']) for g in self.param_groups]}")
        saved_state = state_dict["state"]
        local_state, local_groups = {}, []
        shard_index = 0
        for g, (saved, group) in enumerate(zip(groups, self.param_groups)):
            for key, value in saved.items():
                if key != "params":
                    group[key] = value
            position = {id(p): i for i, p in enumerate(group["params"])}
            shard_indices = []
            for bucket in self._buckets[g]:
                ids = [saved["params"][position[id(p)]] for p in bucket.params]
                per_param = [saved_state.get(i) for i in ids]
                if all(s is not None for s in per_param):
                    local_state[shard_index] = self._shard_of(bucket, per_param)
                shard_indices.append(shard_index)
                shard_index += 1
            local_groups.append({**{k: v for k, v in saved.items() if k != "params"},
                                 "params": shard_indices})
        self.optim.load_state_dict({"state": local_state, "param_groups": local_groups})

    def _shard_of(self, bucket, per_param):
        start, length = bucket.bounds[self._set_rank]
        result = {}
        for key, first in per_param[0].items():
            # Per-element state is shaped like its parameter (a bucket of scalars only is
            # ambiguous with a step count and is taken as shared).
            if all(torch.is_tensor(s.get(key)) and s[key].shape == p.shape
                   for p, s in zip(bucket.params, per_param)) and \
                    any(p.dim() > 0 for p in bucket.params):
                flat = torch.cat([s[key].reshape(-1) for s in per_param])
                result[key] = flat[start:start + length].clone()
            else:
                result[key] = first.clone() if torch.is_tensor(first) else first
        return result
