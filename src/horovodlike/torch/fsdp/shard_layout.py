"""ShardLayout: where each parameter of a wrapped module lies in the flat vectors.

Two orders of the same ``size * shard_numel`` elements:

- rank-major, what the collectives see: rank r's shard is elements
  ``[r * shard_numel, (r + 1) * shard_numel)``. It starts with the rows of each parameter placed
  with ``Shard(dim)`` that rank r holds (that dimension moved to the front, cut into ``size``
  chunks of ``ceil(dim_size / size)`` rows, the last ones padded with zeros), then rank r's
  contiguous part of the other parameters laid end to end (padded to a multiple of ``size``).
- parameter-major, what the computation sees: the other parameters end to end (with their
  padding), then each placed parameter whole in its own shape, then zeros.

Without placed parameters the two orders are the same vector and nothing is reordered (the
parameters are views of the gathered buffer as it arrives).
"""

import math

import torch

try:        # torch's own placement type when torch.distributed is built (no init needed)
    from torch.distributed.tensor import Shard
except ImportError:     # pragma: no cover - torch without distributed
    class Shard:
        """Shard along dimension ``dim`` (torch.distributed.tensor.Shard's name and field)."""

        def __init__(self, dim):
            self.dim = dim

        def __repr__(self):
            return f"Shard(dim={self.dim})"


def placement_dim(placement, name, shape):
    """The dimension ``shard_placement_fn`` chose for parameter ``name`` (None: the default
    flat sharding), checked and made non-negative."""
    if placement is None:
        return None
    dim = getattr(placement, "dim", None)
    if type(placement).__name__ != "Shard" or not isinstance(dim, int):
        raise TypeError(f"fully_shard: shard_placement_fn returned {placement!r} for parameter "
                        f"'{name}'; return Shard(dim) (horovodlike.torch.fsdp.Shard or "
                        "torch.distributed.tensor.Shard) or None for the default")
    if not -len(shape) <= dim < len(shape):
        raise ValueError(f"fully_shard: shard_placement_fn gave Shard({dim}) for parameter "
                         f"'{name}' of shape {tuple(shape)}: the dimension is out of range")
    return dim % len(shape)


class ShardLayout:
    """Offsets of ``shapes`` (one per parameter; ``dims[i]`` its Shard dimension or None) in
    the flat vectors of a set of ``size`` ranks."""

    def __init__(self, shapes, dims, size):
        self.shapes, self.size = [torch.Size(s) for s in shapes], size
        self.numels = [s.numel() for s in self.shapes]
        self.dims = list(dims)
        self.placed = [i for i, d in enumerate(self.dims) if d is not None]
        flat = [i for i, d in enumerate(self.dims) if d is None]
        self.flat_numel = sum(self.numels[i] for i in flat)
        self.flat_shard = math.ceil(self.flat_numel / size)
        self.chunk_rows, self.chunk_numel, shard_offsets = {}, {}, {}
        offset = 0
        for i in self.placed:
            shape, d = self.shapes[i], self.dims[i]
            rows = math.ceil(shape[d] / size)
            self.chunk_rows[i] = rows
            self.chunk_numel[i] = rows * (self.numels[i] // shape[d] if shape[d] else 0)
            shard_offsets[i] = offset
            offset += self.chunk_numel[i]
        self.shard_offsets = shard_offsets           # of placed chunks inside a shard
        self.flat_offset_in_shard = offset
        self.shard_numel = offset + self.flat_shard
        self.padded_numel = self.shard_numel * size
        # Parameter-major offsets: the flat ones first, then each placed one whole.
        self.offsets, position = [0] * len(self.shapes), 0
        for i in flat:
            self.offsets[i], position = position, position + self.numels[i]
        position = self.flat_shard * size
        for i in self.placed:
            self.offsets[i], position = position, position + self.numels[i]
        self.reordered = bool(self.placed)

    # ---------------------------------------------------------------------- conversions

    def _moved(self, i, tensor):
        """Parameter i (full shape) with its Shard dim first, padded to size * chunk rows."""
        moved = tensor.movedim(self.dims[i], 0)
        missing = self.chunk_rows[i] * self.size - moved.shape[0]
        return torch.cat([moved, moved.new_zeros((missing,) + moved.shape[1:])])

    def _unmoved(self, i, rows):
        """The inverse of ``_moved`` from its (size * chunk rows, ...) rows."""
        shape, d = self.shapes[i], self.dims[i]
        moved_shape = (shape[d],) + shape[:d] + shape[d + 1:]
        return rows.reshape((-1,) + moved_shape[1:])[:shape[d]].movedim(0, d)

    def to_param_major(self, rank_major):
        """The parameter-major vector of a gathered rank-major one (a copy when reordered)."""
        if not self.reordered:
            return rank_major
        by_rank = rank_major.view(self.size, self.shard_numel)
        pieces = [by_rank[:, self.flat_offset_in_shard:].reshape(-1)]
        for i in self.placed:
            start = self.shard_offsets[i]
            rows = by_rank[:, start:start + self.chunk_numel[i]]
            pieces.append(self._unmoved(i, rows).reshape(-1))
        return self._padded(torch.cat(pieces))

    def to_rank_major(self, param_major):
        """The rank-major vector of a parameter-major one (such as the gradient of the
        gathered buffer), ready to be reduce-scattered."""
        if not self.reordered:
            return param_major
        columns = []
        for i in self.placed:
            full = param_major[self.offsets[i]:self.offsets[i] + self.numels[i]]
            columns.append(self._moved(i, full.view(self.shapes[i])).reshape(self.size, -1))
        columns.append(param_major[:self.flat_shard * self.size].view(self.size, -1))
        return torch.cat(columns, dim=1).reshape(-1)

    def _padded(self, flat):
        return torch.cat([flat, flat.new_zeros(self.padded_numel - flat.numel())])

    def param_major(self, tensors):
        """The parameter-major vector of the parameters given at full shape."""
        flat = [t.reshape(-1) for i, t in enumerate(tensors) if self.dims[i] is None]
        flat = torch.cat(flat) if flat else tensors[0].new_zeros(0).reshape(-1)
        flat = torch.cat([flat, flat.new_zeros(self.flat_shard * self.size - flat.numel())])
        placed = [tensors[i].reshape(-1) for i in self.placed]
        return self._padded(torch.cat([flat] + placed))

    def shard_of(self, tensors, rank):
        """Rank ``rank``'s shard of the parameters given at full shape (a new tensor)."""
        rank_major = self.to_rank_major(self.param_major(tensors))
        return rank_major[rank * self.shard_numel:(rank + 1) * self.shard_numel].clone()

    def views(self, param_major):
        """Each parameter at its shape, a view of a parameter-major vector."""
        return [param_major[o:o + n].view(s)
                for o, n, s in zip(self.offsets, self.numels, self.shapes)]

    def local_views(self, shard, rank):
        """Each parameter's part of ``shard`` (rank ``rank``'s): a placed one as its chunk
        (the Shard dim cut to ``ceil(dim_size / size)``, padding included), any other as the
        1-D run of its elements this rank holds (possibly empty)."""
        result = []
        begin = rank * self.flat_shard
        for i, shape in enumerate(self.shapes):
            if self.dims[i] is not None:
                d, start = self.dims[i], self.shard_offsets[i]
                chunk = shard[start:start + self.chunk_numel[i]]
                moved = (self.chunk_rows[i],) + shape[:d] + shape[d + 1:]
                result.append(chunk.view(moved).movedim(0, d))
                continue
            low = min(max(self.offsets[i] - begin, 0), self.flat_shard)
            high = min(max(self.offsets[i] + self.numels[i] - begin, 0), self.flat_shard)
            flat = shard[self.flat_offset_in_shard:]
            result.append(flat[low:high])
        return result
