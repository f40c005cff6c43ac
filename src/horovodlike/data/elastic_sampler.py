"""ElasticSampler: a per-rank sampler that survives changes of the number of ranks.

It remembers which samples of the epoch have been processed (recorded by every rank, combined
across ranks at each commit by the elastic state); after a reset it splits only the remaining
samples among the new ranks, so an epoch neither repeats nor skips a sample.
"""

from __future__ import annotations

import math
from typing import Iterator, Sized

import torch
from torch.utils.data import Sampler


class ElasticSampler(Sampler[int]):
    def __init__(self, dataset: Sized, shuffle: bool = True, seed: int = 0):
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_indices: set[int] = set()
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        """Starts epoch `epoch`: a new permutation, nothing processed yet."""
        self.epoch = epoch
        self.processed_indices = set()
        self.reset()

    def _permutation(self) -> list[int]:
        n = len(self.dataset)
        if not self.shuffle:
            return list(range(n))
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        return torch.randperm(n, generator=generator).tolist()

    def reset(self) -> None:
        """Splits the samples not yet processed this epoch among the current ranks: rank r
        takes every size-th, so the t-th batches of all ranks together are consecutive."""
        # Deferred, as in sampler.py: the data package imports without the core.
        import horovodlike.common.basics as basics
        initialized = basics.is_initialized()
        self.num_replicas = basics.size() if initialized else 1
        self.rank = basics.rank() if initialized else 0
        self.remaining_indices = [i for i in self._permutation()
                                  if i not in self.processed_indices]
        self.indices = self.remaining_indices[self.rank::self.num_replicas]

    def get_indices(self, batch_idx: int, batch_size: int) -> list[int]:
        """This rank's samples of batch `batch_idx` (possibly fewer, or none, in the last)."""
        start = batch_idx * batch_size
        return self.indices[start:start + batch_size]

    def batches_per_epoch(self, batch_size: int) -> int:
        """Batches left in this epoch; the same on every rank."""
        return math.ceil(len(self.remaining_indices) / (batch_size * self.num_replicas))

    def global_batch_size(self, batch_idx: int, batch_size: int) -> int:
        """Samples in batch `batch_idx` over all ranks together."""
        start = batch_idx * batch_size * self.num_replicas
        return max(0, min(batch_size * self.num_replicas, len(self.remaining_indices) - start))

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        self.record_indices(self.get_indices(batch_idx, batch_size))

    def record_indices(self, indices) -> None:
        self.processed_indices.update(int(i) for i in indices)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "processed_indices": sorted(self.processed_indices)}

    def load_state_dict(self, state: dict) -> None:
        self.epoch = state["epoch"]
        self.processed_indices = set(state["processed_indices"])
        self.reset()

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)
