"""parallelize_module: tensor parallelism by configuration, PyTorch's
``torch.distributed.tensor.parallel.parallelize_module`` on horovodlike's process sets.

    plan = {"layers.*.attn.q_proj": ColwiseParallel(), "layers.*.attn.o_proj": RowwiseParallel()}
    model = parallelize_module(model, mesh, plan, mesh_dim="tp")

A model written for one device is split in place: every module the plan names gets its style
(see styles.py), a named ``nn.Linear``/``nn.Embedding`` being replaced by its parallel layer
holding this rank's part of the existing weights. The whole plan is checked first (names,
module types, sizes against the set), so a bad plan raises before any module changes and
before anything is sent; then one exchange over the set makes sure every rank applies the same
plan to the same model, since one that differs would leave the others waiting in a collective.
"""

import difflib
import fnmatch

import torch

from horovodlike.common import basics
from horovodlike.common.objects import allgather_object
from horovodlike.common.process_sets import ProcessSet, set_ranks
from horovodlike.torch.parallel import copies, layers
from horovodlike.torch.parallel.layouts import Shard
from horovodlike.torch.parallel.styles import ColwiseParallel, ParallelStyle, RowwiseParallel
from horovodlike.torch.process_mesh import ProcessMesh


def _tensor_parallel_set(mesh_or_process_set, mesh_dim):
    """The process set to split over: a ProcessSet as given, or a ProcessMesh's set along
    ``mesh_dim`` (which may be left out for a one-dimensional mesh)."""
    if isinstance(mesh_or_process_set, ProcessSet):
        if mesh_dim is not None:
            raise ValueError("parallelize_module: mesh_dim is for a ProcessMesh; a process set "
                             "is used whole")
        process_set = mesh_or_process_set
    elif isinstance(mesh_or_process_set, ProcessMesh):
        names = mesh_or_process_set.dim_names
        if mesh_dim is None and len(names) != 1:
            raise ValueError(f"parallelize_module: the mesh has dimensions {names}; name the "
                             "tensor-parallel one with mesh_dim= (for example "
                             f"mesh_dim={names[-1]!r})")
        process_set = mesh_or_process_set.process_set(mesh_dim or names[0])
    else:
        raise ValueError("parallelize_module: expected a ProcessMesh or a ProcessSet to split "
                         f"over, got {type(mesh_or_process_set).__name__}")
    ranks = list(set_ranks(process_set))
    if basics.rank() not in ranks:
        raise ValueError(f"parallelize_module: rank {basics.rank()} is not in the process set "
                         f"{ranks} it was asked to split over; pass this rank's own set (for "
                         "a ProcessMesh, mesh.process_set(\"tp\"))")
    return process_set, ranks


def _matches(pattern, name):
    """Whether a plan key (dotted, ``*`` etc. matching within one level) names ``name``."""
    wanted, parts = pattern.split("."), name.split(".")
    return len(wanted) == len(parts) and all(
        fnmatch.fnmatchcase(part, want) for part, want in zip(parts, wanted))


def _resolve(module, plan):
    """[(name, module, style)] for every module the plan names, each exactly once."""
    if isinstance(plan, ParallelStyle):
        return [("", module, plan)]
    if not isinstance(plan, dict):
        raise ValueError("parallelize_module: the plan must be a style or a dict from module "
                         f"names to styles, got {type(plan).__name__}")
    modules = dict(module.named_modules())
    chosen, by = [], {}
    for key, style in plan.items():
        if not isinstance(style, ParallelStyle):
            raise ValueError(f"parallelize_module: the plan maps {key!r} to {style!r}; use "
                             "ColwiseParallel, RowwiseParallel, SequenceParallel, "
                             "PrepareModuleInput or PrepareModuleOutput")
        names = [n for n in modules if n and _matches(key, n)]
        if not names:
            near = difflib.get_close_matches(key, [n for n in modules if n], n=5, cutoff=0.5)
            raise ValueError(f"parallelize_module: the plan names {key!r}, which matches no "
                             f"module of the {type(module).__name__}" +
                             (f"; did you mean {', '.join(map(repr, near))}?" if near else
                              "; names are relative to the module passed in, '*' matches "
                              "one level"))
        for name in names:
            if name in by:
                raise ValueError(f"parallelize_module: {name!r} is matched by both "
                                 f"{by[name]!r} and {key!r}; give each module one style")
            by[name] = key
            chosen.append((name, modules[name], style))
    return chosen


def _check_untied(module, entries):
    """A layer that is replaced must not share a parameter with another module (a tied
    embedding and head): the copy would split one of them and silently untie the other."""
    owners = {}
    for name, owner in module.named_modules(remove_duplicate=False):
        for parameter in owner.parameters(recurse=False):
            owners.setdefault(id(parameter), set()).add(name)
    for name, target, style in entries:
        if not style.replaces_module:
            continue
        for parameter in target.parameters(recurse=False):
            others = sorted(owners.get(id(parameter), set()) - {name})
            if others:
                raise ValueError(f"parallelize_module: {name!r} shares a parameter with "
                                 f"{', '.join(map(repr, others))} (tied weights), which "
                                 "splitting it would untie; untie them or leave it out of "
                                 "the plan")


def _agree(entries, ranks, process_set, num_copies):
    """Every rank of the set must apply the same plan to the same layers, with the same
    number of copies (each copy is a collective of its own)."""
    mine = [(name, type(m).__name__, repr(style),
             [tuple(p.shape) for p in m.parameters(recurse=False)]) for name, m, style in entries]
    everyone = allgather_object((ranks, mine, num_copies), name="parallelize_module.plan",
                                process_set=process_set)
    differing = [ranks[i] for i, other in enumerate(everyone)
                 if other != (ranks, mine, num_copies)]
    if differing:
        raise ValueError(f"parallelize_module: ranks {differing} of the tensor-parallel set "
                         f"{ranks} have another plan or model than rank {basics.rank()}; "
                         "every rank of the set must build the same model and pass the same "
                         "plan and num_copies")


def _replace(root, name, new):
    parent_name, _, child = name.rpartition(".")
    setattr(root.get_submodule(parent_name), child, new)


def _check_copies(name, target, style, num_copies):
    """num_copies > 1 overlaps the allreduces of Colwise/Rowwise linear layers; their
    sequence-parallel form (a sharded input or output) has none to overlap."""
    if num_copies == 1 or not isinstance(target, torch.nn.Linear):
        return
    if isinstance(style, ColwiseParallel) and isinstance(style.input_layouts, Shard) or \
            isinstance(style, RowwiseParallel) and isinstance(style.output_layouts, Shard):
        raise ValueError(f"parallelize_module: {name!r}: num_copies={num_copies} splits the "
                         "batch to overlap a linear layer's allreduce, but its style shards "
                         f"the sequence ({style!r}); use num_copies=1 with sequence "
                         "parallelism")


def _set_copies(layer, num_copies):
    if isinstance(layer, (layers.ColumnParallelLinear, layers.RowParallelLinear)) and \
            not layer.sequence_parallel:
        layer.num_copies = num_copies


def parallelize_module(module, device_mesh, parallelize_plan, *, mesh_dim=None, num_copies=1):
    """Splits ``module`` over a tensor-parallel set as ``parallelize_plan`` says and returns
    it (the returned module replaces ``module`` itself only when the plan is one style for a
    layer: a module cannot replace itself in place).

    ``device_mesh``: a ProcessMesh (``mesh_dim`` names its tensor-parallel dimension unless it
    has only one) or a ProcessSet. ``parallelize_plan``: a style, applied to ``module``, or a
    dict from module names relative to ``module`` (``*`` matching within one level, as in
    ``"layers.*.attn.q_proj"``) to styles. Every rank of the set calls it with the same model
    and plan; the weights each rank keeps are its part of the ones the model holds.
    ``num_copies=k`` (multi-copy parallel, see copies.py) splits the batch (the first dimension
    of the inputs) of every ColwiseParallel/RowwiseParallel linear layer into k copies whose
    allreduces overlap the next copy's compute; the batch must then be a multiple of k.
    """
    copies.check_num_copies(num_copies, "parallelize_module")
    process_set, ranks = _tensor_parallel_set(device_mesh, mesh_dim)
    entries = _resolve(module, parallelize_plan)
    for name, target, style in entries:
        style.check(name or type(module).__name__, target, len(ranks))
        _check_copies(name or type(module).__name__, target, style, num_copies)
    _check_untied(module, entries)
    _agree(entries, ranks, process_set, num_copies)
    # The parallel layers draw their whole weights before copying the model's; leave the
    # random generator where the caller had it, so the data drawn next is the same.
    with torch.random.fork_rng(devices=[]):
        for name, target, style in entries:
            new = style.apply(target, process_set)
            _set_copies(new, num_copies)
            if new is not target and name:
                _replace(module, name, new)
            elif new is not target:
                module = new
    return module
