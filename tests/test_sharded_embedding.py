"""horovodlike.torch.ShardedEmbedding / ShardedEmbeddingBag on 2 and 4 ranks against one process
training nn.Embedding / nn.EmbeddingBag on the concatenated global batch: SGD, Adagrad,
SparseAdam, dense Adam; skewed ids, absent ids, empty batches; block and cyclic sharding,
server ranks; each rank's shard; bad input."""

import pytest

from conftest import assert_all_ranks, launch


@pytest.mark.parametrize("np", [2, 4])
def test_sharded_embedding_matches_single_process(np):
    result = launch(np, "sharded_embedding_worker.py", timeout=300)
    assert_all_ranks(result, np, "sharded embedding OK")
