"""The request path that every framework layer shares (horovodlike.torch directly; TensorFlow
and Keras through numpy_ops.py): automatic names, names in flight, the reduce op from Horovod's
arguments, the ids of grouped calls, and the table of handles whose buffers the core uses until
they are waited for. Each layer checks its own tensors and turns outputs into its own type."""

import itertools
import threading

from horovodlike import _core
from horovodlike.common import basics
from horovodlike.common.constants import (ALLGATHER, ALLTOALL, BARRIER, DTYPES, JOIN,
                                          REDUCESCATTER, Adasum, Average, Max, Min, Product, Sum)
from horovodlike.common.exceptions import raise_for_status
from horovodlike.common.process_sets import set_id

# The collectives whose output the core allocates, and which report integers with it.
CORE_OUTPUT = frozenset((ALLGATHER, ALLTOALL, REDUCESCATTER, JOIN))
# The reduce ops as given by the caller: an int (not a bool) among these needs no resolving.
REDUCE_OPS = frozenset((Average, Sum, Min, Max, Product, Adasum))

_lock = threading.Lock()
_name_counters = {}
_group_ids = itertools.count(1)
# (process set id, name) -> handle: as in Horovod, a second collective under a name still in
# flight is an error, raised at once on the rank that made it (the core's own check misses it
# when the first one has already run but not been waited on). A name is held until its handle
# is waited for, or until its operation is done and this rank has waited for another handle
# since (a barrier, say): Horovod frees a name once its operation has run, and code written for
# it drops handles it never waits for and reuses their names later; the wait in between keeps
# "submit twice in a row" an error however fast the first one ran.
in_flight = {}
# handle -> (kind, buffers the core uses until done, result, its key in in_flight or None,
# _core.waits() when it was queued: see free_name).
# A wait that a signal interrupts (Ctrl-C) leaves its entry, and so its buffers, in place.
_pending = {}
# Buffers of synchronous calls interrupted while the core may still use them: kept alive, as
# a pending handle's are, until the next init().
_interrupted = []


def _restart():
    with _lock:
        _name_counters.clear()
        in_flight.clear()
        _interrupted.clear()


basics.register_init_hook(_restart)


def auto_name(prefix, process_set=None):
    """A name for an unnamed collective: the same on every rank that makes the same calls in the
    same order. Counted per process set: the ranks of one set agree on the names of its
    collectives whatever other sets this rank also takes part in (a pipeline stage's
    tensor-parallel group, say, which its other stages never see)."""
    set_id = getattr(process_set, "process_set_id", None) or 0
    with _lock:
        counter = _name_counters.setdefault((prefix, set_id), itertools.count())
        number = next(counter)
    return f"{prefix}.noname.{number}" if not set_id else f"{prefix}.set{set_id}.noname.{number}"


def new_group(count):
    """(group id, size) for ``count`` collectives the core must run together, fused."""
    return next(_group_ids), int(count)


def resolve_reduce_op(average, op, what=None):
    """The reduce op from Horovod's ``op`` and its deprecated ``average`` (Average unless
    average=False asks for Sum); ``what`` prefixes the error."""
    if op is not None and average is not None:
        prefix = "" if what is None else f"{what}: "
        raise ValueError(f"{prefix}the op and average arguments are mutually exclusive")
    if op is None:
        op = Average if average is None or average else Sum
    return op


def check_reduce_op(op, what):
    if isinstance(op, bool) or op not in REDUCE_OPS:
        raise ValueError(f"{what}: unknown reduce op {op!r}; use hvd.Average, hvd.Sum, hvd.Min, "
                         "hvd.Max, hvd.Product or hvd.Adasum")
    return op


def raise_in_flight(name):
    raise ValueError(f"a collective named '{name}' is already in flight (its handle has not "
                     "been synchronized); synchronize it first or give each concurrent "
                     "operation a unique name")


def free_name(set_, name):
    """Raises when a collective named ``name`` is in flight in process set ``set_`` on this rank;
    releases the name of one that is done when this rank has waited for another handle since it
    was queued (its handle stays valid: synchronize() still returns its result)."""
    with _lock:
        handle = in_flight.get((set_, name))
        if handle is None:
            return
        if _pending[handle][4] < _core.waits() and _core.poll(handle):
            del in_flight[(set_, name)]
            return
    raise_in_flight(name)


def enqueue(kind, name, process_set, pointer, output_pointer, dtype_code, shape, keep,
            result=None, **kwargs):
    """Queues a collective with the core; returns its handle, for wait(). ``keep`` holds the
    buffers the core reads and writes until it is done; wait() returns ``result`` for the
    collectives whose output the caller allocated."""
    set_ = set_id(process_set)
    key = (set_, name)
    if key in in_flight:
        free_name(set_, name)
    handle = _core.enqueue(kind, name, pointer, output_pointer, dtype_code, list(shape),
                           process_set=set_, **kwargs)
    with _lock:
        _pending[handle] = (kind, keep, result, key, _core.waits())
        in_flight[key] = handle
    return handle


def record(handle, kind):
    """A handle queued without buffers or a name of its own (join, barrier), waited like any."""
    with _lock:
        _pending[handle] = (kind, (), None, None, 0)
    return handle


def keep_interrupted(buffers):
    """Keeps the buffers of a synchronous call interrupted while the core may still use them."""
    _interrupted.append(buffers)


def wait(handle, read_output=None):
    """Waits for ``handle``, raises what it failed with, and releases it. Returns (result,
    extra): for the collectives whose output the core allocates, ``read_output(kind, handle,
    raw, shape, extra, keep)`` and the integers the core reports with it (each rank's first
    dimension, the rows received from each rank, the last rank to join); otherwise enqueue's
    ``result`` and None."""
    with _lock:
        if handle not in _pending:
            raise ValueError(f"unknown handle {handle}: it was already synchronized")
    code, message = _core.wait(handle)
    with _lock:
        kind, keep, result, key, _ = _pending.pop(handle)
        if key is not None and in_flight.get(key) == handle:
            del in_flight[key]
    extra = None
    try:
        if code != _core.STATUS_OK:
            raise_for_status(code, message)
        if kind in CORE_OUTPUT:
            raw, shape, extra = _core.output(handle)
            extra = list(extra)
            if kind != JOIN:
                result = read_output(kind, handle, raw, shape, extra, keep)
    finally:
        _core.release(handle)
    return result, extra


def is_pending(handle):
    with _lock:
        return handle in _pending


def poll(handle):
    """True when wait() will not block."""
    return _core.poll(handle)


def barrier(process_set):
    """Blocks until every rank of the set has called barrier()."""
    handle = _core.enqueue(BARRIER, "barrier", 0, 0, DTYPES["uint8"], [0],
                           process_set=set_id(process_set))
    wait(record(handle, BARRIER))


def join():
    """Declares that this rank has no more data. Until every rank has joined, the others'
    allreduces go on with this rank contributing zeros. Returns the last rank to join."""
    _, extra = wait(record(_core.enqueue_control(JOIN, "join"), JOIN))
    return int(extra[0])
