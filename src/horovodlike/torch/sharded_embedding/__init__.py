"""Embedding tables too large for one rank: rows sharded over a process set (or held by server
ranks alone), looked up by an alltoall of ids and rows, trained by an alltoall of gradient rows
to where the rows live, where a local torch optimizer steps them.

    emb = hvd.ShardedEmbedding(1_000_000, 64, sparse=True)     # each rank: its rows only
    optimizer = torch.optim.SparseAdam(emb.parameters(), lr=1e-3)
    emb(ids).sum().backward(); optimizer.step()
"""

from horovodlike.torch.sharded_embedding.embedding import ShardedEmbedding
from horovodlike.torch.sharded_embedding.bag import ShardedEmbeddingBag
from horovodlike.torch.sharded_embedding.layout import RowSharding
