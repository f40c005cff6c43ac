"""DeviceMesh: torch's ``init_device_mesh`` / ``DeviceMesh`` names over a ProcessMesh.

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    fully_shard(block, mesh=mesh)                 # HSDP: shard over "shard", replicate over the other
    fully_shard(block, mesh=mesh["shard"])        # FSDP over this rank's "shard" line only

The ranks are laid out as torch lays them (row-major: the last dimension varies fastest, inside a
host when it divides the ranks per host), each dimension's lines are horovodlike process sets,
and ``get_group`` gives this rank's set along a dimension, for horovodlike's collectives.
"""

import itertools
import math

import torch

from horovodlike.common import basics
from horovodlike.torch.process_mesh import ProcessMesh


class DeviceMesh:
    """A view of ``process_mesh`` on the dimensions ``dims`` (all of them from
    ``init_device_mesh``; fewer after ``mesh["name"]``)."""

    def __init__(self, process_mesh, dims, device_type):
        self.process_mesh, self._dims, self.device_type = process_mesh, tuple(dims), device_type

    @property
    def mesh_dim_names(self):
        return self._dims

    @property
    def ndim(self):
        return len(self._dims)

    @property
    def shape(self):
        return tuple(self.process_mesh.size(name) for name in self._dims)

    def _name(self, mesh_dim):
        if mesh_dim is None:
            if self.ndim != 1:
                raise ValueError(f"DeviceMesh {self._dims} has {self.ndim} dimensions: name "
                                 "the one meant (mesh_dim=...)")
            return self._dims[0]
        if isinstance(mesh_dim, int) and not isinstance(mesh_dim, bool):
            if not -self.ndim <= mesh_dim < self.ndim:
                raise ValueError(f"DeviceMesh {self._dims}: mesh_dim {mesh_dim} out of range")
            return self._dims[mesh_dim]
        if mesh_dim not in self._dims:
            raise ValueError(f"DeviceMesh has no dimension {mesh_dim!r}; its dimensions are "
                             f"{self._dims}")
        return mesh_dim

    def __getitem__(self, names):
        names = (names,) if isinstance(names, str) else tuple(names)
        if not names or len(set(names)) != len(names):
            raise ValueError(f"DeviceMesh[{names}]: give distinct dimension names")
        return DeviceMesh(self.process_mesh, [self._name(n) for n in names], self.device_type)

    def size(self, mesh_dim=None):
        """The ranks along ``mesh_dim`` (a name or index), or in the whole view."""
        if mesh_dim is None:
            return math.prod(self.shape)
        return self.process_mesh.size(self._name(mesh_dim))

    def get_local_rank(self, mesh_dim=None):
        """This rank's index along ``mesh_dim`` (may be left out on a 1-D mesh)."""
        return self.process_mesh.coordinate(self._name(mesh_dim))

    def get_group(self, mesh_dim=None):
        """This rank's horovodlike ProcessSet along ``mesh_dim``: pass it as ``process_set=``
        to horovodlike's collectives (not a torch ProcessGroup)."""
        return self.process_mesh.process_set(self._name(mesh_dim))

    def get_coordinate(self):
        return [self.process_mesh.coordinate(name) for name in self._dims]

    def get_rank(self):
        return basics.rank()

    @property
    def mesh(self):
        """The global ranks of this rank's part of the mesh, as a tensor of ``shape``."""
        ranks = [self.process_mesh.rank_at(**dict(zip(self._dims, index)))
                 for index in itertools.product(*map(range, self.shape))]
        return torch.tensor(ranks, dtype=torch.int64).reshape(self.shape)

    def __repr__(self):
        dims = ", ".join(f"{n}={self.size(n)}" for n in self._dims)
        return f"DeviceMesh({self.device_type!r}, {dims})"


def init_device_mesh(device_type, mesh_shape, *, mesh_dim_names=None):
    """torch's ``init_device_mesh`` on horovodlike's ranks: collective, every rank calls it with
    the same arguments after ``hvd.init()``. ``device_type`` ("cpu", "cuda") is recorded;
    the tensors' own device decides where collectives run."""
    if not isinstance(device_type, str) or not device_type:
        raise TypeError(f"init_device_mesh: device_type must be a string such as 'cpu' or "
                        f"'cuda', got {device_type!r}")
    mesh_shape = tuple(mesh_shape)
    if mesh_dim_names is None:
        mesh_dim_names = tuple(f"dim_{i}" for i in range(len(mesh_shape)))
    process_mesh = ProcessMesh(mesh_shape, tuple(mesh_dim_names))
    return DeviceMesh(process_mesh, process_mesh.dim_names, device_type)
