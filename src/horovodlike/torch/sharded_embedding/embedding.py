"""ShardedEmbedding: nn.Embedding with its rows spread over the ranks of a process set."""

from horovodlike.torch.sharded_embedding.table import ShardedTable


class ShardedEmbedding(ShardedTable):
    """``nn.Embedding(num_embeddings, embedding_dim, ...)`` whose rows are split over the ranks
    of ``process_set``: each rank's ``weight`` holds only its own rows (``shard_ids`` says
    which), and a lookup fetches the rows of the ids it is given from wherever they live.

    Arguments as nn.Embedding's (``padding_idx``, ``max_norm``/``norm_type``,
    ``scale_grad_by_freq``: frequencies counted over every rank's batch, ``sparse``,
    ``_weight``: the whole table, of which each rank keeps its rows, ``_freeze``, ``device``,
    ``dtype``), and:

    - ``process_set``: the ranks sharing the table (the global set by default);
    - ``sharding``: ``"block"`` (contiguous blocks of rows, the first ``num_embeddings % n``
      one row longer) or ``"cyclic"`` (row i on the (i mod n)-th holder);
    - ``servers``: ranks of the set that alone hold the rows and only serve (they call
      ``serve()`` for each lookup the others make); the others hold none (a parameter-server
      layout). By default every rank of the set holds rows and looks up;
    - ``op``: ``hvd.Average`` (default) divides each row's gradient by the number of ranks that
      look up, as DistributedOptimizer averages data-parallel gradients; ``hvd.Sum`` keeps the
      sum of every rank's gradients.

    A lookup is collective: every rank of the set calls the module (or ``serve()``) and then
    backpropagates through the result in the same order, each with its own ids (any number,
    none included). Its backward pass leaves in ``weight.grad`` the gradient of this rank's
    rows from every rank's loss (sparse with ``sparse=True``): step it with a local torch
    optimizer (SGD, Adagrad, SparseAdam; Adam etc. when dense), not with DistributedOptimizer,
    and leave it out of broadcast_parameters (each rank's weight is different).
    """

    def __init__(self, num_embeddings, embedding_dim, padding_idx=None, max_norm=None,
                 norm_type=2.0, scale_grad_by_freq=False, sparse=False, _weight=None,
                 _freeze=False, device=None, dtype=None, **sharding_options):
        super().__init__(num_embeddings, embedding_dim, padding_idx, max_norm, norm_type,
                         scale_grad_by_freq, sparse, _weight, _freeze, device, dtype,
                         **sharding_options)

    @classmethod
    def from_pretrained(cls, embeddings, freeze=True, padding_idx=None, max_norm=None,
                        norm_type=2.0, scale_grad_by_freq=False, sparse=False,
                        **sharding_options):
        """As nn.Embedding.from_pretrained: ``embeddings`` is the whole table (on every rank),
        of which each rank keeps its rows."""
        if embeddings.dim() != 2:
            raise ValueError(f"ShardedEmbedding.from_pretrained: embeddings must be 2-D, got "
                             f"shape {tuple(embeddings.shape)}")
        rows, dim = embeddings.shape
        return cls(rows, dim, padding_idx, max_norm, norm_type, scale_grad_by_freq, sparse,
                   _weight=embeddings, _freeze=freeze, **sharding_options)

    def forward(self, input):
        ids = self.check_ids(input)
        rows = self.lookup(ids.reshape(-1))
        return rows.reshape(*input.shape, self.embedding_dim)
