"""Splitting a model into pipeline stages."""

import torch


def split_sequential(model, num_stages, balance=None):
    """Cuts an ``nn.Sequential`` into ``num_stages`` consecutive ``nn.Sequential`` parts
    (sharing the model's modules, so its weights): ``balance[i]`` layers in part i, or as even
    as possible without it. Every rank can build the whole model from the same seed and keep
    ``split_sequential(model, n)[stage_index]``."""
    if not isinstance(model, torch.nn.Sequential):
        raise TypeError("split_sequential: expects a torch.nn.Sequential, got "
                        f"{type(model).__name__}")
    layers = list(model.children())
    if isinstance(num_stages, bool) or not isinstance(num_stages, int) or \
            not 1 <= num_stages <= len(layers):
        raise ValueError(f"split_sequential: num_stages must be from 1 to the number of layers "
                         f"({len(layers)}), got {num_stages!r}")
    if balance is None:
        per, extra = divmod(len(layers), num_stages)
        balance = [per + (1 if i < extra else 0) for i in range(num_stages)]
    balance = list(balance)
    if len(balance) != num_stages or any(b < 1 for b in balance) or sum(balance) != len(layers):
        raise ValueError(f"split_sequential: balance {balance} must give each of the "
                         f"{num_stages} stages at least one layer and add up to the model's "
                         f"{len(layers)} layers")
    parts, start = [], 0
    for count in balance:
        parts.append(torch.nn.Sequential(*layers[start:start + count]))
        start += count
    return parts
