"""Where a wrapped module's parameters live: the set they are sharded over, the set they are
replicated over (HSDP), and the smaller sets that reshard_after_forward=<int> keeps them in.

A 1-D mesh (or a ProcessSet, or the whole job) shards over all its ranks. A 2-D ProcessMesh or
DeviceMesh (horovodlike's, or torch's once torch.distributed numbers the ranks as horovodlike
does) shards over its last dimension and replicates over the first, as FSDP2 does with a
("replicate", "shard") DeviceMesh: each gradient is reduce-scattered inside the shard set, then
averaged across the replicate set.
"""

import itertools
from dataclasses import dataclass

from horovodlike.common import basics
from horovodlike.common.objects import allgather_object
from horovodlike.common.process_sets import ProcessSet, _register, global_process_set, set_ranks
from horovodlike.torch.fsdp.device_mesh import DeviceMesh
from horovodlike.torch.process_mesh import ProcessMesh, _existing_set


@dataclass
class Layout:
    process_set: object         # the shard set
    set_rank: int
    set_size: int
    replicate_set: object       # None without replication
    lines: list                 # every shard set of the job (sorted ranks); None: not known


def resolve_mesh(mesh):
    """The Layout of ``mesh``, checked to hold this rank."""
    replicate_set, lines = None, None
    if isinstance(mesh, ProcessMesh):
        mesh = DeviceMesh(mesh, mesh.dim_names, None)
    if _is_torch_device_mesh(mesh):
        return _torch_mesh_layout(mesh)
    if mesh is None:
        process_set = global_process_set
    elif isinstance(mesh, DeviceMesh):
        dims, grid = mesh.mesh_dim_names, mesh.process_mesh
        _check_dims(mesh, len(dims))
        process_set = grid.process_set(dims[-1])
        if len(dims) == 2 and grid.size(dims[0]) > 1:
            replicate_set = grid.process_set(dims[0])
        lines = _mesh_lines(grid, dims[-1])
    elif isinstance(mesh, ProcessSet):
        process_set = mesh
    else:
        raise TypeError(f"fully_shard: mesh must be a ProcessSet, a ProcessMesh or a DeviceMesh "
                        f"(1-D, or 2-D for HSDP), got {type(mesh).__name__}")
    return _layout(process_set, replicate_set, lines)


def _check_dims(mesh, ndim):
    if ndim > 2:
        raise NotImplementedError(
            f"fully_shard: mesh {mesh} has {ndim} dimensions; give a 1-D mesh (shard) or a 2-D "
            "one (replicate, shard), e.g. mesh['replicate', 'shard']")


def _layout(process_set, replicate_set, lines):
    ranks = set_ranks(process_set)
    if basics.rank() not in ranks:
        raise ValueError(f"fully_shard: rank {basics.rank()} is not in {process_set} (ranks "
                         f"{ranks}); call fully_shard only on the ranks of the mesh")
    if lines is None and len(ranks) == basics.size():
        lines = [sorted(ranks)]
    return Layout(process_set, ranks.index(basics.rank()), len(ranks), replicate_set, lines)


def _is_torch_device_mesh(mesh):
    return type(mesh).__name__ == "DeviceMesh" and type(mesh).__module__.startswith("torch.")


_torch_meshes = itertools.count()


def _torch_mesh_layout(mesh):
    """A DeviceMesh of torch.distributed, its ranks taken as horovodlike's (the same numbering):
    each rank's lines along the mesh's dimensions are exchanged (collective over the job, as
    every rank wraps the same modules) and registered as process sets."""
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError("fully_shard: got a torch.distributed DeviceMesh while "
                         "torch.distributed is not initialized; build the mesh with "
                         "horovodlike.torch.fsdp.init_device_mesh(device_type, mesh_shape, "
                         "mesh_dim_names=...) instead")
    if (dist.get_rank(), dist.get_world_size()) != (basics.rank(), basics.size()):
        raise ValueError(f"fully_shard: torch.distributed's rank {dist.get_rank()} of "
                         f"{dist.get_world_size()} differs from horovodlike's {basics.rank()} of "
                         f"{basics.size()}; use horovodlike.torch.fsdp.init_device_mesh")
    _check_dims(mesh, mesh.ndim)
    grid, coordinate = mesh.mesh, mesh.get_coordinate()
    mine = [sorted(grid[tuple(coordinate[:-1])].tolist())]
    if mesh.ndim == 2:
        mine.append(sorted(grid[:, coordinate[1]].tolist()))
    everyone = allgather_object(mine, name=f"fsdp.torch_mesh.{next(_torch_meshes)}")
    found = []
    for d in range(len(mine)):
        lines = sorted({tuple(lines[d]) for lines in everyone})
        sets = {line: _existing_set(list(line)) or _register(ProcessSet(list(line)))
                for line in lines}
        found.append((sets[tuple(mine[d])], [list(line) for line in lines]))
    replicate_set = found[1][0] if len(found) == 2 and len(mine[1]) > 1 else None
    return _layout(found[0][0], replicate_set, found[0][1])


def _mesh_lines(mesh, dim_name):
    d = mesh.dim_names.index(dim_name)
    lines = set()
    for rank in range(basics.size()):
        coordinate = list(mesh.coordinate_of(rank))
        line = []
        for i in range(mesh.shape[d]):
            coordinate[d] = i
            line.append(mesh.rank_at(tuple(coordinate)))
        lines.add(tuple(sorted(line)))
    return [list(line) for line in sorted(lines)]


def check_reshard(value, layout):
    """reshard_after_forward as stored: True, False, or the size of the smaller set to keep
    the parameters gathered in (strictly between 1 and the shard set's size)."""
    if isinstance(value, bool):
        return value
    if not isinstance(value, int):
        raise TypeError(f"fully_shard: reshard_after_forward must be True, False or an int, "
                        f"got {value!r}")
    size = layout.set_size
    if value < 1 or size % value:
        raise ValueError(f"fully_shard: reshard_after_forward={value} must divide the shard "
                         f"set's size {size} (the ranks that regather in the backward)")
    if value in (1, size):
        return value == size    # 1 keeps the gathered parameters; the set's size frees them
    if layout.lines is None:
        raise NotImplementedError(
            f"fully_shard: reshard_after_forward={value} needs the shard set to be the whole "
            "job or a dimension of a ProcessMesh (the ranks outside a ProcessSet cannot "
            "register the smaller sets); use True or False")
    return value


def reshard_set(layout, size):
    """This rank's set of ``size`` consecutive ranks of its shard set (registering every such
    set of the job, the same on every rank: registration is collective)."""
    mine = None
    for line in layout.lines:
        for start in range(0, len(line), size):
            ranks = line[start:start + size]
            found = _existing_set(ranks) or _register(ProcessSet(ranks))
            if basics.rank() in ranks:
                mine = found
    return mine
