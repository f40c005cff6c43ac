"""Which wrapped module's gather to start ahead, when the user named none (FSDP2's implicit
prefetching).

A forward of a wrapped module that no other wrapped module's forward encloses is a root forward:
the order in which the wrapped modules (those with parameters) start their forwards inside it
is recorded, and so is the order in which they end. The next root forward of the same module
starts, at each module's forward, the gather of the module that followed it last time (the
first time: of the next one in module order under the root); the backward that follows,
at each module's turn, the gather of the module whose forward ended before it (the reverse of
the order the forwards ended in). Recording the order is cheap (a list append per module) and
the same on every rank of a program that runs the same modules, so every rank starts the same
gathers in the same order.
"""

import torch


class _Iteration:
    root = None             # the module whose forward encloses the others, while it runs
    started = []            # modules with parameters, in the order their forwards started
    ended = []              # ... and ended


_now = _Iteration()


def _in_backward():
    # A forward run inside the backward (activation checkpointing recomputes) is no iteration.
    return torch._C._current_graph_task_id() != -1


def forward_started(module, has_params):
    """Called first thing in a wrapped module's forward: starts an iteration at a root."""
    if _in_backward():
        return
    if _now.root is None or _now.root is module:
        _now.root, _now.started, _now.ended = module, [], []
        if module._fsdp_next_forward is None:       # the first time: module order
            _link(_with_params(module.modules()), "_fsdp_next_forward")
    if has_params:
        _now.started.append(module)


def reset():
    """Forgets an iteration left unfinished (its root's forward raised)."""
    _now.root = None


def forward_ended(module, has_params):
    """Called last thing in a wrapped module's forward: at the root, keeps the orders."""
    if _in_backward() or _now.root is None:
        return
    if has_params:
        _now.ended.append(module)
    if module is _now.root:
        _link(_now.started, "_fsdp_next_forward")
        _link(list(reversed(_now.ended)), "_fsdp_next_backward")
        _now.root = None


def _with_params(modules):
    return [m for m in modules if getattr(m, "_fsdp_group", None) is not None]


def _link(order, attribute):
    for before, after in zip(order, order[1:]):
        setattr(before, attribute, [after])
    if order:
        setattr(order[-1], attribute, [])


def forward_targets(module):
    """The modules whose gather ``module``'s forward starts: those set by hand, if any."""
    if module._fsdp_forward_prefetch is not None:
        return module._fsdp_forward_prefetch
    return [] if _in_backward() else module._fsdp_next_forward or []


def backward_targets(module):
    """The modules whose gather ``module``'s turn in the backward starts (not those that need
    no parameters in the backward)."""
    chosen = module._fsdp_backward_prefetch
    if chosen is None:
        chosen = module._fsdp_next_backward or []
    return [m for m in chosen if m._fsdp_group is not None
            and m._fsdp_group.sync.unshard_in_backward]
