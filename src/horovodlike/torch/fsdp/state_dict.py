"""Full (unsharded) state dicts of a model wrapped by fully_shard.

``model.state_dict()`` of a wrapped model is its sharded state dict: each rank's ``_flat_shard``
entries (its shards) plus the buffers and the parameters fully_shard did not take; saving it per
rank and loading it back into the same layout with ``load_state_dict`` needs nothing more.
``full_state_dict`` gathers the parameters under their original names, as the model would have
them without fully_shard; ``load_full_state_dict`` keeps each rank's shard of such a state dict.
"""

from horovodlike.common import basics
from horovodlike.torch.fsdp.fully_shard import FLAT_SHARD, FSDPModule


def _groups_with_names(module):
    """(group, [names of each parameter, one per place it is set]) of every wrapped module
    under ``module``, the names relative to ``module``."""
    paths = {id(sub): name for name, sub in module.named_modules(remove_duplicate=False)}
    result = []
    for sub in module.modules():
        if isinstance(sub, FSDPModule) and sub._fsdp_group is not None:
            group = sub._fsdp_group
            names = [[_join(paths[id(place)], attribute) for place, attribute in places]
                     for places in group.locations]
            result.append((group, names))
    return result


def _join(path, name):
    return f"{path}.{name}" if path else name


def _other_entries(module):
    """The state dict entries fully_shard did not take (buffers, ignored parameters)."""
    return {k: v for k, v in module.state_dict().items() if k.split(".")[-1] != FLAT_SHARD}


def full_state_dict(module, *, rank0_only=False):
    """The state dict ``module`` would have without fully_shard: parameters gathered to full
    size (copies). Collective over every mesh under it: all its ranks call it. With
    ``rank0_only`` the ranks other than 0 get an empty dict."""
    state = {}
    for group, names in _groups_with_names(module):
        for tensor, places in zip(group.full_params(), names):
            for name in places:
                state[name] = tensor
    for name, value in _other_entries(module).items():
        state[name] = value.detach().clone()
    return {} if rank0_only and basics.rank() != 0 else state


def local_shards(module):
    """{name: this rank's part of that parameter}, views of the shards (no communication): a
    parameter placed with ``Shard(dim)`` as its chunk along ``dim`` (``ceil(size / n)`` entries,
    the last rank's padded with zeros), any other as the 1-D run of its elements this rank
    holds in the flat shard (possibly empty). Parameters fully_shard did not take are left out."""
    shards = {}
    for group, names in _groups_with_names(module):
        for tensor, places in zip(group.local_shards(), names):
            shards[places[0]] = tensor
    return shards


def load_full_state_dict(module, state_dict, strict=True):
    """Loads a full (unsharded) state dict, such as ``full_state_dict`` or a plain model's
    ``state_dict()`` gives, into a wrapped ``module``: each rank keeps its shard (no
    communication; every rank passes the whole state dict). With ``strict``, missing or
    unexpected keys raise before anything is changed."""
    groups = _groups_with_names(module)
    others = _other_entries(module)
    wanted = [n for _, names in groups for places in names for n in places] + list(others)
    missing = [n for n in wanted if n not in state_dict]
    unexpected = [n for n in state_dict if n not in set(wanted)]
    if strict and (missing or unexpected):
        raise ValueError(f"load_full_state_dict: missing keys {missing}, unexpected keys "
                         f"{unexpected}")
    for group, names in groups:
        shapes_seen = [tuple(state_dict[p[0]].shape) for p in names if p[0] in state_dict]
        if len(shapes_seen) != len(names):
            continue        # not strict and the group is incomplete: leave it
        if shapes_seen != [tuple(s) for s in group.shapes]:
            raise ValueError(f"load_full_state_dict: parameters {[p[0] for p in names]} have "
                             f"shapes {shapes_seen}, the model {[tuple(s) for s in group.shapes]}")
    for sub in module.modules():
        if isinstance(sub, FSDPModule):
            sub.reshard()
    for group, names in groups:
        if all(p[0] in state_dict for p in names):
            group.load_full_params([state_dict[p[0]] for p in names])
    module.load_state_dict({k: state_dict[k] for k in others if k in state_dict}, strict=False)
