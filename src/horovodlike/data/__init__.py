"""Per-rank sharding of datasets for data-parallel training."""

from horovodlike.data.elastic_sampler import ElasticSampler
from horovodlike.data.sampler import DistributedSampler, samples_per_rank, shard_indices

__all__ = ["DistributedSampler", "ElasticSampler", "samples_per_rank", "shard_indices"]
