"""ShardedEmbeddingBag: nn.EmbeddingBag (modes sum and mean) over a sharded table."""

import torch

from horovodlike.torch.sharded_embedding.table import ShardedTable

MODES = ("sum", "mean")


class ShardedEmbeddingBag(ShardedTable):
    """``nn.EmbeddingBag`` whose rows are spread as ShardedEmbedding's (same sharding
    arguments and gradients): ``forward(input, offsets=None, per_sample_weights=None)`` with a
    1-D input and offsets, or a 2-D input of equal bags, sums or averages each bag's rows.
    Modes "sum" and "mean" ("max" is refused); ``per_sample_weights`` with "sum" only;
    ``padding_idx`` entries are left out of their bag (and of its count for "mean"); an empty
    bag gives zeros. ``scale_grad_by_freq`` divides each id's gradient by its count over every
    rank's input, as nn.Embedding's does (torch's own nn.EmbeddingBag 2.x divides some ids' by
    another id's count)."""

    def __init__(self, num_embeddings, embedding_dim, max_norm=None, norm_type=2.0,
                 scale_grad_by_freq=False, mode="mean", sparse=False, _weight=None,
                 include_last_offset=False, padding_idx=None, device=None, dtype=None,
                 **sharding_options):
        if mode == "max":
            raise NotImplementedError("ShardedEmbeddingBag: mode 'max' is not supported; use "
                                      "'sum' or 'mean'")
        if mode not in MODES:
            raise ValueError(f"ShardedEmbeddingBag: mode = {mode!r}: use 'sum' or 'mean'")
        super().__init__(num_embeddings, embedding_dim, padding_idx, max_norm, norm_type,
                         scale_grad_by_freq, sparse, _weight, False, device, dtype,
                         _extra={"mode": mode, "include_last_offset": include_last_offset},
                         **sharding_options)
        self.mode, self.include_last_offset = mode, include_last_offset

    def _bags(self, input, offsets):
        """(flat ids, the bag of each, number of bags), checked."""
        kind = type(self).__name__
        ids = self.check_ids(input)
        if ids.dim() == 2:
            if offsets is not None:
                raise ValueError(f"{kind}: offsets must be None with a 2-D input (each row is "
                                 "a bag)")
            bags, length = ids.shape
            return ids.reshape(-1), torch.arange(bags).repeat_interleave(length), bags
        if ids.dim() != 1 or offsets is None:
            raise ValueError(f"{kind}: give a 1-D input with 1-D offsets, or a 2-D input; got "
                             f"a {ids.dim()}-D input and offsets {offsets is not None}")
        if not isinstance(offsets, torch.Tensor) or offsets.dtype not in (torch.int64,
                                                                          torch.int32):
            raise TypeError(f"{kind}: offsets must be an int64 or int32 tensor")
        offsets = offsets.reshape(-1).long().cpu()
        n = ids.shape[0]
        ends = torch.cat([offsets[1:], torch.tensor([n])])
        if self.include_last_offset:
            offsets, ends = offsets[:-1], offsets[1:]
        if (int(offsets[0]) != 0 or bool((ends < offsets).any()) or int(ends[-1]) != n) \
                if offsets.numel() else n:
            raise ValueError(f"{kind}: offsets {offsets.tolist()[:8]} must start at 0 and not "
                             f"decrease, the bags covering the {n} ids")
        counts = ends - offsets
        return ids, torch.arange(len(offsets)).repeat_interleave(counts), len(offsets)

    def forward(self, input, offsets=None, per_sample_weights=None):
        ids, bag_of, bags = self._bags(input, offsets)
        if per_sample_weights is not None:
            if self.mode != "sum":
                raise ValueError("ShardedEmbeddingBag: per_sample_weights needs mode 'sum'")
            if tuple(per_sample_weights.shape) != tuple(input.shape):
                raise ValueError(f"ShardedEmbeddingBag: per_sample_weights has shape "
                                 f"{tuple(per_sample_weights.shape)}, the input "
                                 f"{tuple(input.shape)}")
            per_sample_weights = per_sample_weights.reshape(-1)
        if self.padding_idx is not None:
            keep = ids != self.padding_idx
            ids, bag_of = ids[keep], bag_of[keep.cpu()]
            if per_sample_weights is not None:
                per_sample_weights = per_sample_weights[keep]
        rows = self.lookup(ids)
        if per_sample_weights is not None:
            rows = rows * per_sample_weights.to(rows).unsqueeze(1)
        bag_of = bag_of.to(rows.device)
        out = rows.new_zeros(bags, self.embedding_dim).index_add(0, bag_of, rows)
        if self.mode == "mean":
            sizes = torch.bincount(bag_of, minlength=bags).clamp(min=1)
            out = out / sizes.unsqueeze(1).to(out.dtype)
        return out
