"""Per-rank sharding of a sized dataset, with the semantics of torch's DistributedSampler.

Every rank draws the same permutation (seeded with ``seed + epoch``), makes its length a multiple
of the number of ranks (repeating its head, or cutting its tail with ``drop_last``), and takes
every ``num_replicas``-th index starting at its rank. Interleaving rather than contiguous blocks
is what makes an N-rank run with per-rank batch B see, at step t, exactly the global batch
``perm[t*N*B:(t+1)*N*B]`` that a single process with batch N*B sees: the union of the ranks'
t-th batches is that slice.

The shard is a pure function of (dataset length, rank, size, shuffle, seed, epoch, drop_last),
so whatever restores a run (a checkpoint, an elastic reset with a new size) only has to restore
``seed`` and ``epoch`` to reproduce it.
"""

import math
from typing import Iterator, List, Optional, Sized

import torch
from torch.utils.data import Sampler


def samples_per_rank(n: int, size: int, drop_last: bool = False) -> int:
    """How many indices each of ``size`` ranks gets from a dataset of ``n`` items."""
    if drop_last:
        return n // size
    return math.ceil(n / size)


def shard_indices(
    n: int,
    rank: int,
    size: int,
    shuffle: bool = True,
    seed: int = 0,
    epoch: int = 0,
    drop_last: bool = False,
) -> List[int]:
    """The indices of ``range(n)`` that ``rank`` of ``size`` ranks reads in ``epoch``, in order."""
    _check_shard(n, rank, size)
    if shuffle:
        generator = torch.Generator()
        generator.manual_seed(seed + epoch)
        order = torch.randperm(n, generator=generator).tolist()
    else:
        order = list(range(n))

    total = samples_per_rank(n, size, drop_last) * size
    if total > n:
        # Pad by repeating from the start; n < size may need the whole order more than once.
        repeats = math.ceil(total / n)
        order = (order * repeats)[:total]
    else:
        order = order[:total]
    return order[rank:total:size]


def _check_shard(n: int, rank: int, size: int) -> None:
    if n < 0:
        raise ValueError(f"dataset length must be >= 0, got {n}")
    if size < 1:
        raise ValueError(f"num_replicas must be >= 1, got {size}")
    if not 0 <= rank < size:
        raise ValueError(f"rank must be in [0, {size - 1}] for num_replicas={size}, got {rank}")


class DistributedSampler(Sampler[int]):
    """Restricts a DataLoader to this rank's share of ``dataset``.

    A drop-in for ``torch.utils.data.distributed.DistributedSampler`` (same arguments, same
    indices), whose defaults for ``num_replicas`` and ``rank`` come from horovodlike's runtime
    (``hvd.size()``, ``hvd.rank()``) instead of ``torch.distributed``. ``dataset`` only needs ``__len__``. Call ``set_epoch``
    before each epoch, on every rank, to get a new permutation.
    """

    def __init__(
        self,
        dataset: Sized,
        num_replicas: Optional[int] = None,
        rank: Optional[int] = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        if num_replicas is None or rank is None:
            # Deferred: a sampler given both works without the runtime (the core need not load).
            import horovodlike.common.basics as basics

            if num_replicas is None:
                num_replicas = basics.size()
            if rank is None:
                rank = basics.rank()
        _check_shard(len(dataset), rank, num_replicas)
        self.dataset = dataset
        self.num_replicas = num_replicas
        self.rank = rank
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.epoch = 0

    @property
    def num_samples(self) -> int:
        return samples_per_rank(len(self.dataset), self.num_replicas, self.drop_last)

    @property
    def total_size(self) -> int:
        return self.num_samples * self.num_replicas

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        return iter(
            shard_indices(
                len(self.dataset),
                self.rank,
                self.num_replicas,
                shuffle=self.shuffle,
                seed=self.seed,
                epoch=self.epoch,
                drop_last=self.drop_last,
            )
        )

    def __len__(self) -> int:
        return self.num_samples
