"""What the two DistributedOptimizers (horovodlike.torch.optimizer and adasum_optimizer) share:
naming the parameters and letting go of handles."""

from horovodlike.torch.mpi_ops import synchronize


def discard(handle):
    """Waits out a handle whose result is no longer wanted (its error included)."""
    try:
        synchronize(handle)
    except (RuntimeError, ValueError):
        pass


def parameter_names(params, named_parameters):
    """{parameter: name} for the optimizer's parameters: from named_parameters when given
    (every parameter must be in it, each name once), else "noname.<position>"."""
    if named_parameters is None:
        return {p: f"noname.{i}" for i, p in enumerate(params)}
    named = list(named_parameters)
    names = [n for n, _ in named]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError("named_parameters contains duplicate names: " + ", ".join(duplicates))
    by_id = {id(p): n for n, p in named}
    unnamed = [i for i, p in enumerate(params) if id(p) not in by_id]
    if unnamed:
        raise ValueError(
            f"named_parameters was given, but {len(unnamed)} of the optimizer's "
            "parameters are not in it (positions " + ", ".join(map(str, unnamed[:10]))
            + "); pass model.named_parameters() of the model being optimized")
    return {p: by_id[id(p)] for p in params}


def too_many_passes(name, backward_passes_per_step):
    """The error for a gradient computed again before step() took the last one."""
    return RuntimeError(
        f"the gradient of '{name}' was computed more than "
        f"backward_passes_per_step={backward_passes_per_step} times before "
        "step(); raise backward_passes_per_step or call step() after each backward")


def set_backward_passes_per_step(optimizer, passes):
    """A DistributedOptimizer's method (both kinds): from now on, between two steps (nothing
    pending), its gradients are exchanged once per `passes` backward passes."""
    optimizer.backward_passes_per_step = passes
    for p in optimizer._passes_left:
        optimizer._passes_left[p] = passes


def remove_hooks(optimizer):
    """A DistributedOptimizer's method (both kinds): takes its gradient hooks off the
    parameters (a later loop of the user's own, or another framework's, would otherwise reduce
    through them); the optimizer no longer exchanges anything."""
    for hook in optimizer._hooks:
        hook.remove()
    optimizer._hooks.clear()
    optimizer._passes_left.clear()

