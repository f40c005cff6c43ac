"""The sharding math of horovodlike.data, in one process: no launcher, no runtime."""

import sys
import types
from collections import Counter

import pytest
import torch
import torch.utils.data.distributed as torch_distributed
from torch.utils.data import DataLoader

from horovodlike.data import DistributedSampler, shard_indices

SIZES = [1, 2, 3, 4]


class OnlySized:
    """A dataset that has a length and nothing else."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n


def all_shards(n, size, **kwargs):
    return [list(DistributedSampler(range(n), num_replicas=size, rank=r, **kwargs)) for r in range(size)]


def permutation(n, seed, epoch):
    generator = torch.Generator()
    generator.manual_seed(seed + epoch)
    return torch.randperm(n, generator=generator).tolist()


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("drop_last", [True, False])
def test_divisible_length_covers_every_index_exactly_once(size, shuffle, drop_last):
    n = 12 * size
    shards = all_shards(n, size, shuffle=shuffle, seed=5, drop_last=drop_last)
    assert [len(s) for s in shards] == [12] * size
    assert sorted(i for s in shards for i in s) == list(range(n))


@pytest.mark.parametrize("size", [2, 3, 4])
@pytest.mark.parametrize("n", [1, 5, 13, 49])  # not divisible by 2, 3 or 4
def test_padding_repeats_from_the_start_of_the_permutation(size, n):
    per_rank = -(-n // size)
    shards = all_shards(n, size, seed=1)
    assert [len(s) for s in shards] == [per_rank] * size
    everything = [i for s in shards for i in s]
    assert set(everything) == set(range(n))
    extra = per_rank * size - n
    counts = Counter(everything)
    assert sum(c - 1 for c in counts.values()) == extra
    # The extra indices are the head of the permutation, taken cyclically.
    perm = permutation(n, 1, 0)
    padded = (perm * (extra // n + 2))[: per_rank * size]
    assert counts == Counter(padded)
    for r in range(size):
        assert shards[r] == padded[r::size]


@pytest.mark.parametrize("size", [2, 3, 4])
@pytest.mark.parametrize("n", [1, 5, 13, 49])  # not divisible by 2, 3 or 4
def test_drop_last_truncates_to_a_multiple_of_size(size, n):
    shards = all_shards(n, size, seed=1, drop_last=True)
    assert [len(s) for s in shards] == [n // size] * size
    everything = [i for s in shards for i in s]
    assert len(set(everything)) == len(everything) == n - n % size
    assert sorted(everything) == sorted(permutation(n, 1, 0)[: n - n % size])


@pytest.mark.parametrize("size", SIZES)
def test_ranks_share_one_permutation_per_epoch(size):
    n = 8 * size
    for epoch in range(3):
        sampler_shards = []
        for r in range(size):
            sampler = DistributedSampler(range(n), num_replicas=size, rank=r, seed=7)
            sampler.set_epoch(epoch)
            sampler_shards.append(list(sampler))
        merged = [sampler_shards[k % size][k // size] for k in range(n)]
        assert merged == permutation(n, 7, epoch)


def test_same_epoch_is_deterministic_and_epochs_differ():
    n, size = 100, 3
    first = shard_indices(n, 1, size, shuffle=True, seed=3, epoch=4, drop_last=False)
    again = shard_indices(n, 1, size, shuffle=True, seed=3, epoch=4, drop_last=False)
    other_epoch = shard_indices(n, 1, size, shuffle=True, seed=3, epoch=5, drop_last=False)
    other_seed = shard_indices(n, 1, size, shuffle=True, seed=4, epoch=4, drop_last=False)
    assert first == again
    assert first != other_epoch
    assert first != other_seed

    sampler = DistributedSampler(range(n), num_replicas=size, rank=1, seed=3)
    sampler.set_epoch(4)
    assert list(sampler) == first
    sampler.set_epoch(5)
    assert list(sampler) == other_epoch
    sampler.set_epoch(4)
    assert list(sampler) == first


def test_without_shuffle_ranks_interleave_the_natural_order():
    assert shard_indices(10, 0, 3, shuffle=False) == [0, 3, 6, 9]
    assert shard_indices(10, 1, 3, shuffle=False) == [1, 4, 7, 0]
    assert shard_indices(10, 2, 3, shuffle=False) == [2, 5, 8, 1]
    assert shard_indices(10, 2, 3, shuffle=False, drop_last=True) == [2, 5, 8]


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("n", [0, 1, 7, 24, 61])
@pytest.mark.parametrize("drop_last", [True, False])
@pytest.mark.parametrize("shuffle", [True, False])
def test_same_indices_as_torch_distributed_sampler(size, n, drop_last, shuffle):
    for r in range(size):
        ours = DistributedSampler(range(n), num_replicas=size, rank=r, shuffle=shuffle, seed=11, drop_last=drop_last)
        theirs = torch_distributed.DistributedSampler(
            range(n), num_replicas=size, rank=r, shuffle=shuffle, seed=11, drop_last=drop_last
        )
        for epoch in (0, 2):
            ours.set_epoch(epoch)
            theirs.set_epoch(epoch)
            assert list(ours) == list(theirs)
            assert len(ours) == len(theirs) == len(list(ours))


def batches(n, size, rank, batch_size, seed, epoch, drop_last):
    dataset = torch.arange(n)
    sampler = DistributedSampler(dataset, num_replicas=size, rank=rank, shuffle=True, seed=seed, drop_last=drop_last)
    sampler.set_epoch(epoch)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, drop_last=drop_last)
    return [b.tolist() for b in loader]


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("n", [96, 101, 250])
@pytest.mark.parametrize("batch_size", [1, 4, 7])
def test_union_of_rank_batches_is_the_single_process_global_batch(size, n, batch_size):
    global_batch = batch_size * size
    for epoch in (0, 1):
        single = batches(n, 1, 0, global_batch, seed=2, epoch=epoch, drop_last=True)
        per_rank = [batches(n, size, r, batch_size, seed=2, epoch=epoch, drop_last=True) for r in range(size)]
        assert len(single) == n // global_batch
        for rank_batches in per_rank:
            assert len(rank_batches) == len(single)
            assert all(len(b) == batch_size for b in rank_batches)
        for t, expected in enumerate(single):
            union = [i for rank_batches in per_rank for i in rank_batches[t]]
            assert sorted(union) == sorted(expected)
            assert expected == permutation(n, 2, epoch)[t * global_batch : (t + 1) * global_batch]


@pytest.mark.parametrize("size", SIZES)
def test_union_of_rank_batches_without_drop_last_when_global_batch_divides(size):
    batch_size = 5
    n = 3 * batch_size * size
    single = batches(n, 1, 0, batch_size * size, seed=0, epoch=1, drop_last=False)
    per_rank = [batches(n, size, r, batch_size, seed=0, epoch=1, drop_last=False) for r in range(size)]
    assert all(len(rank_batches) == len(single) == 3 for rank_batches in per_rank)
    for t, expected in enumerate(single):
        assert sorted(i for rank_batches in per_rank for i in rank_batches[t]) == sorted(expected)


def test_dataset_only_needs_a_length():
    dataset = OnlySized(10)
    shards = [list(DistributedSampler(dataset, num_replicas=3, rank=r, seed=0)) for r in range(3)]
    assert [len(DistributedSampler(dataset, num_replicas=3, rank=r)) for r in range(3)] == [4, 4, 4]
    assert set(i for s in shards for i in s) == set(range(10))


def test_is_a_torch_sampler():
    assert isinstance(DistributedSampler(range(4), num_replicas=2, rank=0), torch.utils.data.Sampler)


@pytest.mark.parametrize("rank, size", [(-1, 2), (2, 2), (0, 0)])
def test_invalid_rank_or_size_is_rejected(rank, size):
    with pytest.raises(ValueError, match="rank|num_replicas"):
        DistributedSampler(range(4), num_replicas=size, rank=rank)
    with pytest.raises(ValueError, match="rank|num_replicas"):
        shard_indices(4, rank, size)


def test_explicit_rank_and_size_do_not_need_the_runtime(monkeypatch):
    # A None entry in sys.modules makes any import of the runtime raise ImportError.
    monkeypatch.setitem(sys.modules, "horovodlike.common.basics", None)
    assert list(DistributedSampler(range(6), num_replicas=2, rank=1, shuffle=False)) == [1, 3, 5]
    with pytest.raises(ImportError):
        DistributedSampler(range(6))


def test_rank_and_size_default_to_the_runtime(monkeypatch):
    fake = types.ModuleType("horovodlike.common.basics")
    fake.size = lambda: 4
    fake.rank = lambda: 3
    monkeypatch.setitem(sys.modules, "horovodlike.common.basics", fake)
    import horovodlike.common

    monkeypatch.setattr(horovodlike.common, "basics", fake, raising=False)
    sampler = DistributedSampler(range(10), shuffle=False)
    assert (sampler.num_replicas, sampler.rank) == (4, 3)
    assert list(sampler) == [3, 7, 1]
    assert list(DistributedSampler(range(10), rank=0, shuffle=False)) == [0, 4, 8]
