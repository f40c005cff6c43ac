"""Which rank of a process set holds each row of a sharded table, and where in its shard.

Rows are split over the holders (every rank of the set, or the server ranks alone) one of two
ways: "block", holder k takes the k-th of contiguous blocks of near-equal size (the first
num_rows % holders blocks one row longer, as numpy.array_split cuts); "cyclic", holder k takes
rows k, k + holders, k + 2 * holders, ...
"""

import torch

SCHEMES = ("block", "cyclic")


class RowSharding:
    """The rows of a ``num_rows``-row table over ``holders``, the positions (in the process
    set) of the ranks holding rows, ascending; the other positions of the set hold none."""

    def __init__(self, num_rows, set_size, holders, scheme):
        if scheme not in SCHEMES:
            raise ValueError(f"sharding = {scheme!r}: use one of {', '.join(map(repr, SCHEMES))}")
        self.num_rows, self.set_size, self.scheme = num_rows, set_size, scheme
        self.holders = list(holders)
        self._holder_positions = torch.tensor(self.holders, dtype=torch.int64)
        count = len(self.holders)
        base, extra = divmod(num_rows, count)
        self.counts = [base + (k < extra) for k in range(count)]
        self._starts = torch.tensor([0] + self.counts, dtype=torch.int64).cumsum(0)

    def rows_held(self, position):
        """How many rows the rank at ``position`` of the set holds."""
        if position not in self.holders:
            return 0
        return self.counts[self.holders.index(position)]

    def shard_ids(self, position):
        """The global ids of the rows held at ``position``, in shard order."""
        if position not in self.holders:
            return torch.empty(0, dtype=torch.int64)
        k = self.holders.index(position)
        if self.scheme == "block":
            return torch.arange(int(self._starts[k]), int(self._starts[k + 1]))
        return torch.arange(k, self.num_rows, len(self.holders))

    def _holder_index(self, ids):
        if self.scheme == "block":
            return torch.bucketize(ids.contiguous(), self._starts[1:-1], right=True)
        return ids % len(self.holders)

    def owner(self, ids):
        """The set position holding each of ``ids`` (int64)."""
        return self._holder_positions[self._holder_index(ids)]

    def local_index(self, ids):
        """Each of ``ids``' row in its holder's shard."""
        if self.scheme == "block":
            return ids - self._starts[self._holder_index(ids)]
        return ids // len(self.holders)
