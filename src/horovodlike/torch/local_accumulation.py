"""Accumulating gradients locally before exchanging them: DistributedDataParallel's no_sync for
DistributedOptimizer.

    with no_sync(model.parameters()):     # or optimizer.no_sync()
        loss_a.backward()                 # gradients add up in .grad, nothing is sent
    loss_b.backward()                     # the exchange of the sum starts here, as usual
    optimizer.step()

A DistributedOptimizer counts every backward pass toward backward_passes_per_step, but inside
no_sync a pass never starts the exchange of a parameter's gradient; the first pass outside it
starts the exchange once the count is reached, however far past it the passes inside went. So
the default backward_passes_per_step=1 accumulates any number of passes inside no_sync, and an
explicit backward_passes_per_step equal to the number of passes gives the same result.
Pipeline schedules wrap every micro-batch's backward but each stage's last in it.

step() exchanges whatever was not exchanged yet, also inside no_sync: every rank of the
process set must take part in it.
"""

import contextlib

# id(parameter) -> (parameter, how many no_sync blocks hold it); the parameter is kept so
# that its id cannot be reused while the block lasts.
_deferred = {}


@contextlib.contextmanager
def no_sync(parameters):
    """Context manager: backward passes inside it accumulate the gradients of `parameters` in
    their .grad without a DistributedOptimizer exchanging them."""
    held = list(parameters)
    for p in held:
        _, count = _deferred.get(id(p), (p, 0))
        _deferred[id(p)] = (p, count + 1)
    try:
        yield
    finally:
        for p in held:
            _, count = _deferred[id(p)]
            if count == 1:
                del _deferred[id(p)]
            else:
                _deferred[id(p)] = (p, count - 1)


def exchange_deferred(p):
    """True while a no_sync block holds p."""
    return id(p) in _deferred
