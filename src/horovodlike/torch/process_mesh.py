"""ProcessMesh: the job's ranks arranged as an n-dimensional grid, one process set per line.

    mesh = hvd.ProcessMesh((2, 2), ("pp", "dp"))          # dp innermost: dp peers share a host
    mesh = hvd.ProcessMesh((2, 2), ("pp", "dp"), innermost="pp")
    mesh.process_set("dp")      # this rank's set along dp (the ranks that differ only in dp)
    mesh.coordinate("pp")       # this rank's index along pp

Creating a mesh is collective: every rank calls it with the same arguments, in the same order
relative to other collectives. It registers its process sets itself (no
HOROVOD_DYNAMIC_PROCESS_SETS needed) and reuses a set already registered with the same ranks.
"""

import itertools
import math
import os
import socket

from horovodlike import _core
from horovodlike.common import basics
from horovodlike.common.objects import allgather_object
from horovodlike.common.process_sets import ProcessSet, _register, global_process_set


def _host_name():
    # The launcher names each rank's host (it can simulate several hosts on one machine).
    return os.environ.get("HOROVOD_HOSTNAME") or socket.gethostname()


def _existing_set(ranks):
    """The registered set with exactly these ranks, or None."""
    if ranks == list(range(basics.size())):
        return global_process_set
    for set_id in _core.process_set_ids():
        if set_id != 0 and sorted(_core.process_set_ranks(set_id)) == ranks:
            found = ProcessSet(ranks)
            found.process_set_id = set_id
            return found
    return None


class ProcessMesh:
    """The ranks of the job as a grid of ``shape`` with one name per dimension.

    ``innermost`` names the dimension whose neighbours get consecutive ranks of one host (the
    last dimension by default): put the dimension with the most traffic there (Whale keeps the
    data-parallel allreduce inside a host and pipelines across hosts). Ranks are taken host by
    host (hosts in the order of their first rank), so this holds whenever the innermost size
    divides the ranks per host; ``innermost_within_host`` says whether it does.
    """

    def __init__(self, shape, dim_names, innermost=None):
        shape, dim_names = self._check(shape, dim_names, innermost)
        self.shape, self.dim_names = shape, dim_names
        self.innermost = innermost or dim_names[-1]
        # One exchange checks that every rank asked for the same mesh and learns the hosts.
        mine = (shape, dim_names, self.innermost, _host_name())
        everyone = allgather_object(mine, name="process_mesh.layout")
        differing = [r for r, other in enumerate(everyone) if other[:3] != mine[:3]]
        if differing:
            raise ValueError(f"ProcessMesh: rank {basics.rank()} asked for shape {shape}, "
                             f"dims {dim_names}, innermost {self.innermost!r}, but ranks "
                             f"{differing} asked for "
                             f"{sorted({str(everyone[r][:3]) for r in differing})}; every rank "
                             "must create the same mesh")
        hosts = [entry[3] for entry in everyone]
        host_order = {h: i for i, h in enumerate(dict.fromkeys(hosts))}
        ranks_by_host = sorted(range(len(hosts)), key=lambda r: (host_order[hosts[r]], r))
        # Lay the ranks out with the innermost dimension varying fastest.
        layout = [d for d in range(len(shape)) if dim_names[d] != self.innermost]
        layout.append(dim_names.index(self.innermost))
        self._rank_at = {}
        sizes = [shape[d] for d in layout]
        for position, index in enumerate(itertools.product(*[range(s) for s in sizes])):
            coordinate = [0] * len(shape)
            for d, i in zip(layout, index):
                coordinate[d] = i
            self._rank_at[tuple(coordinate)] = ranks_by_host[position]
        self._coordinate_of = {r: c for c, r in self._rank_at.items()}
        inner_size = shape[dim_names.index(self.innermost)]
        self.innermost_within_host = all(
            len({hosts[r] for r in self._line(c, self.innermost)}) == 1
            for c in self._rank_at if c[dim_names.index(self.innermost)] == 0) \
            if inner_size > 1 else True
        self._sets = self._register_sets()

    @staticmethod
    def _check(shape, dim_names, innermost):
        if not basics.is_initialized():
            raise ValueError("ProcessMesh needs horovodlike.init() first")
        shape = tuple(shape)
        dim_names = tuple(dim_names)
        if not shape or any(not isinstance(s, int) or isinstance(s, bool) or s < 1
                            for s in shape):
            raise ValueError(f"ProcessMesh: shape {shape} must be positive integers")
        if len(dim_names) != len(shape):
            raise ValueError(f"ProcessMesh: {len(shape)} dimensions in shape {shape} but "
                             f"{len(dim_names)} names {dim_names}")
        if len(set(dim_names)) != len(dim_names) or \
                not all(isinstance(n, str) and n for n in dim_names):
            raise ValueError(f"ProcessMesh: dim_names {dim_names} must be distinct strings")
        if innermost is not None and innermost not in dim_names:
            raise ValueError(f"ProcessMesh: innermost={innermost!r} is not one of {dim_names}")
        if math.prod(shape) != basics.size():
            raise ValueError(f"ProcessMesh: shape {shape} holds {math.prod(shape)} ranks but "
                             f"the job has {basics.size()}; the product of the shape must "
                             "equal hvd.size()")
        return shape, dim_names

    def _dim(self, dim_name):
        if dim_name not in self.dim_names:
            raise ValueError(f"ProcessMesh has no dimension {dim_name!r}; its dimensions are "
                             f"{self.dim_names}")
        return self.dim_names.index(dim_name)

    def _line(self, coordinate, dim_name):
        """The ranks that differ from ``coordinate`` only along ``dim_name``, in mesh order."""
        d = self._dim(dim_name)
        return [self._rank_at[coordinate[:d] + (i,) + coordinate[d + 1:]]
                for i in range(self.shape[d])]

    def _register_sets(self):
        # Every rank registers every line of every dimension in the same order (registration
        # is collective over the whole job), then keeps the ones it belongs to.
        sets = {}
        for d, name in enumerate(self.dim_names):
            for coordinate in sorted(self._rank_at):
                if coordinate[d] != 0:
                    continue
                line = self._line(coordinate, name)
                ranks = sorted(line)
                process_set = _existing_set(ranks)
                if process_set is None:
                    process_set = _register(ProcessSet(ranks))
                for r in line:
                    if r == basics.rank():
                        sets[name] = process_set
        return sets

    # ----------------------------------------------------------------------------- queries

    def process_set(self, dim_name):
        """This rank's process set along ``dim_name``: the ranks whose coordinates differ
        from this rank's only in that dimension. Its set rank equals the coordinate when the
        mesh keeps ranks in order along that dimension (see ``ranks_along``)."""
        self._dim(dim_name)
        return self._sets[dim_name]

    def coordinate(self, dim_name=None):
        """This rank's index along ``dim_name`` (or the tuple of all indices)."""
        mine = self._coordinate_of[basics.rank()]
        return mine if dim_name is None else mine[self._dim(dim_name)]

    def size(self, dim_name=None):
        """The number of ranks along ``dim_name`` (or in the whole mesh)."""
        return math.prod(self.shape) if dim_name is None else self.shape[self._dim(dim_name)]

    def rank_at(self, coordinate=None, **by_name):
        """The global rank at a coordinate, given as a tuple or by name; names left out keep
        this rank's index: ``mesh.rank_at(pp=stage + 1)`` is the next stage's rank."""
        if coordinate is not None and by_name:
            raise ValueError("rank_at: give a coordinate tuple or names, not both")
        if coordinate is None:
            coordinate = list(self.coordinate())
            for name, index in by_name.items():
                coordinate[self._dim(name)] = index
        coordinate = tuple(coordinate)
        if coordinate not in self._rank_at:
            raise ValueError(f"rank_at: {coordinate} is outside the mesh of shape {self.shape}")
        return self._rank_at[coordinate]

    def coordinate_of(self, rank):
        """The coordinate tuple of a global rank."""
        if rank not in self._coordinate_of:
            raise ValueError(f"coordinate_of: rank {rank} is not in the mesh")
        return self._coordinate_of[rank]

    def ranks_along(self, dim_name):
        """The global ranks of this rank's line along ``dim_name``, in coordinate order."""
        return self._line(self.coordinate(), dim_name)

    # ------------------------------------------------------------ DeviceMesh's names

    def _name(self, mesh_dim):
        if isinstance(mesh_dim, int) and not isinstance(mesh_dim, bool):
            if not 0 <= mesh_dim < len(self.dim_names):
                raise ValueError(f"ProcessMesh has {len(self.dim_names)} dimensions; "
                                 f"mesh_dim {mesh_dim} is out of range")
            return self.dim_names[mesh_dim]
        return mesh_dim

    @property
    def mesh_dim_names(self):
        return self.dim_names

    def get_group(self, mesh_dim):
        """``process_set`` under DeviceMesh's name (a dimension's name or index)."""
        return self.process_set(self._name(mesh_dim))

    def get_local_rank(self, mesh_dim):
        """``coordinate`` under DeviceMesh's name (a dimension's name or index)."""
        return self.coordinate(self._name(mesh_dim))

    def get_coordinate(self):
        return list(self.coordinate())

    def __repr__(self):
        dims = ", ".join(f"{n}={s}" for n, s in zip(self.dim_names, self.shape))
        return f"ProcessMesh({dims}, innermost={self.innermost!r})"
