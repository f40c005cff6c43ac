"""The part ShardedEmbedding and ShardedEmbeddingBag share: a table whose rows are spread over
the ranks of a process set, each rank keeping only its own rows as its ``weight``, looked up
and trained through the exchanges of exchange.py."""

import collections
import itertools

import torch

from horovodlike.common import basics
from horovodlike.common.objects import allgather_object
from horovodlike.common.process_sets import global_process_set, set_id, set_ranks
from horovodlike.torch.mpi_ops import Average, Sum
from horovodlike.torch.sharded_embedding.exchange import PullRows
from horovodlike.torch.sharded_embedding.layout import RowSharding

# Tables are numbered per process set (their collectives' names): the ranks of a set create
# its tables in the same order, whatever other sets' ranks do meanwhile.
_table_numbers = collections.defaultdict(itertools.count)
_ID_DTYPES = (torch.int64, torch.int32)


def _check_servers(servers, ranks, kind):
    if servers is None:
        return list(range(len(ranks)))
    servers = sorted(set(int(r) for r in servers))
    outside = [r for r in servers if r not in ranks]
    if not servers or outside:
        raise ValueError(f"{kind}: servers = {servers} must be a non-empty list of ranks of the "
                         f"process set {ranks}" + (f"; {outside} are not" if outside else ""))
    if len(servers) == len(ranks):
        raise ValueError(f"{kind}: servers = {servers} leaves no rank of the process set "
                         f"{ranks} to look up; leave servers out to shard over every rank")
    return [ranks.index(r) for r in servers]


class ShardedTable(torch.nn.Module):
    """The rows of a (num_embeddings, embedding_dim) table over a process set; see
    ShardedEmbedding for the arguments."""

    def __init__(self, num_embeddings, embedding_dim, padding_idx=None, max_norm=None,
                 norm_type=2.0, scale_grad_by_freq=False, sparse=False, _weight=None,
                 _freeze=False, device=None, dtype=None, *, process_set=global_process_set,
                 sharding="block", servers=None, op=Average, _extra=None):
        super().__init__()
        kind = type(self).__name__
        ranks = set_ranks(process_set)
        if basics.rank() not in ranks:
            raise ValueError(f"{kind}: rank {basics.rank()} is not in the process set {ranks}")
        for label, value in (("num_embeddings", num_embeddings), ("embedding_dim", embedding_dim)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{kind}: {label} = {value!r} must be a positive int")
        if padding_idx is not None:
            if not -num_embeddings <= padding_idx < num_embeddings:
                raise ValueError(f"{kind}: padding_idx = {padding_idx} must be within "
                                 f"[-{num_embeddings}, {num_embeddings})")
            padding_idx %= num_embeddings
        if op not in (Average, Sum):
            raise ValueError(f"{kind}: op must be hvd.Average or hvd.Sum")
        holders = _check_servers(servers, ranks, kind)
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.padding_idx, self.max_norm, self.norm_type = padding_idx, max_norm, norm_type
        self.scale_grad_by_freq, self.sparse, self.op = scale_grad_by_freq, sparse, op
        self.process_set, self.sharding = process_set, sharding
        self.servers = None if servers is None else [ranks[p] for p in holders]
        self.position = ranks.index(basics.rank())
        self.is_server = servers is not None and self.position in holders
        # Average divides by the ranks that look up: the servers only serve.
        self.lookup_ranks = len(ranks) - (len(holders) if servers is not None else 0)
        self.layout = RowSharding(num_embeddings, len(ranks), holders, sharding)
        number = next(_table_numbers[set_id(process_set)])
        self.name = f"sharded_embedding.{set_id(process_set)}.{number}"
        shard = self._initial_shard(_weight, device, dtype)
        self._check_same_everywhere(kind, ranks, shard.dtype, _extra)
        self.weight = torch.nn.Parameter(shard, requires_grad=not _freeze)

    def _check_same_everywhere(self, kind, ranks, dtype, extra):
        """One exchange at construction: every rank must describe the same table."""
        mine = {"num_embeddings": self.num_embeddings, "embedding_dim": self.embedding_dim,
                "padding_idx": self.padding_idx, "max_norm": self.max_norm,
                "norm_type": self.norm_type, "scale_grad_by_freq": self.scale_grad_by_freq,
                "sparse": self.sparse, "sharding": self.sharding,
                "servers": self.servers, "op": str(self.op),
                "dtype": str(dtype), **(extra or {})}
        everyone = allgather_object(mine, name=f"{self.name}.arguments",
                                    process_set=self.process_set)
        differing = [k for k in mine if any(theirs.get(k) != mine[k] for theirs in everyone)]
        if differing:
            details = []
            for key in differing:
                by_value = {}
                for position, theirs in enumerate(everyone):
                    by_value.setdefault(repr(theirs.get(key)), []).append(ranks[position])
                details.append(f"{key} = " + ", ".join(f"{value} on ranks {on}"
                                                       for value, on in by_value.items()))
            raise ValueError(f"{kind}: every rank of the process set must create the same "
                             f"table: {'; '.join(details)}")

    def _initial_shard(self, weight, device, dtype):
        ids = self.shard_ids
        shape = (len(ids), self.embedding_dim)
        if weight is not None:
            full = (self.num_embeddings, self.embedding_dim)
            if tuple(weight.shape) != full:
                raise ValueError(f"{type(self).__name__}: _weight has shape "
                                 f"{tuple(weight.shape)}, expected the whole table {full}")
            return weight.detach()[ids.to(weight.device)].clone().to(device=device, dtype=dtype)
        # One draw from the default generator (the same on ranks seeded alike, and each rank's
        # stream advances alike), then a generator of this rank's own for its rows.
        seed = int(torch.randint(0, 2 ** 62, (1,)))
        generator = torch.Generator().manual_seed(seed + self.position)
        shard = torch.empty(shape, dtype=dtype or torch.get_default_dtype())
        shard.normal_(generator=generator)
        if self.padding_idx is not None:
            shard[ids == self.padding_idx] = 0
        return shard.to(device)

    @property
    def shard_ids(self):
        """The global ids of this rank's rows: ``weight[i]`` is row ``shard_ids[i]``."""
        return self.layout.shard_ids(self.position)

    def check_ids(self, ids, what="input"):
        """``ids`` as int64, after checking them here (before anything is sent)."""
        kind = type(self).__name__
        if not isinstance(ids, torch.Tensor):
            raise TypeError(f"{kind}: {what} must be a torch.Tensor of ids, got "
                            f"{type(ids).__name__}")
        if ids.dtype not in _ID_DTYPES:
            raise TypeError(f"{kind}: {what} has dtype {ids.dtype}; ids must be torch.int64 or "
                            "torch.int32")
        if ids.numel():
            bad = (ids < 0) | (ids >= self.num_embeddings)
            if bool(bad.any()):
                shown = ids[bad].unique()[:8].tolist()
                raise IndexError(f"{kind}: rank {basics.rank()}: {what} holds ids {shown} out of "
                                 f"range for a table of {self.num_embeddings} rows (0 to "
                                 f"{self.num_embeddings - 1})")
        return ids.long()

    def lookup(self, ids):
        """The rows of ``ids`` (flat int64, checked), in order; collective."""
        if self.is_server:
            raise ValueError(f"{type(self).__name__}: rank {basics.rank()} is a server of this "
                             f"table (servers = {self.servers}): call serve() there, not the "
                             "module")
        unique, inverse, counts = torch.unique(ids, return_inverse=True, return_counts=True)
        device = self.weight.device
        counts = counts.to(device) if self.scale_grad_by_freq else None
        pulled = PullRows.apply(self.weight, self, unique.to(device), counts)
        return pulled[inverse.to(device)]

    def serve(self, backward=True):
        """Takes part in one lookup without ids of its own (a server's turn; any rank with
        nothing to look up may call it), and in its gradient push when ``backward``: every rank
        of the set makes the same sequence of lookups and backward passes."""
        nothing = torch.empty(0, dtype=torch.int64, device=self.weight.device)
        pulled = PullRows.apply(self.weight, self, nothing,
                                nothing if self.scale_grad_by_freq else None)
        if backward and pulled.requires_grad:
            pulled.sum().backward()

    def rows_for(self, shard, local):
        """The rows at ``local`` of this rank's shard, renormalised first under max_norm."""
        with torch.no_grad():
            if self.max_norm is not None and local.numel():
                torch.embedding_renorm_(shard, local, self.max_norm, self.norm_type)
            return shard.detach()[local]

    def shard_gradient(self, asked, local, received, shape, counts=None):
        """The gradient of this rank's shard from every rank's gradient rows (``received``, for
        the global ids ``asked``, held at ``local``), each divided by its id's count over every
        rank's batch when ``counts`` (each rank's count of each id) are given."""
        grads = received / self.lookup_ranks if self.op == Average else received
        if counts is not None:
            totals = grads.new_zeros(shape[0]).index_add_(0, local, counts.to(grads.dtype))
            grads = grads / totals[local].unsqueeze(1)
        if self.padding_idx is not None:
            keep = asked != self.padding_idx
            local, grads = local[keep], grads[keep]
        if self.sparse:
            return torch.sparse_coo_tensor(local.unsqueeze(0), grads, shape,
                                           check_invariants=False)
        return grads.new_zeros(shape).index_add_(0, local, grads)

    def extra_repr(self):
        where = f"servers={self.servers}" if self.servers else "every rank"
        text = (f"{self.num_embeddings}, {self.embedding_dim}, {self.sharding} over {where}, "
                f"{len(self.shard_ids)} rows here")
        for label in ("padding_idx", "max_norm"):
            if getattr(self, label) is not None:
                text += f", {label}={getattr(self, label)}"
        return text + (", sparse=True" if self.sparse else "")
