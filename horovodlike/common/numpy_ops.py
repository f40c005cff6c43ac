"""Collectives on NumPy arrays: the framework-neutral bridge to the core.

Frameworks that can hand over host memory as NumPy arrays (TensorFlow and Keras, through
``.numpy()`` eagerly and ``tf.numpy_function`` in graphs) go through here. Each array is checked,
made C-contiguous and handed to the core as a raw pointer; the ``Handle`` keeps the input and the
output alive until the core is done with them, and ``Handle.wait()`` returns the output array.
"""

import itertools
import threading

import numpy as np

from horovodlike import _core
from horovodlike.common import basics
from horovodlike.common.exceptions import HorovodInternalError, TensorMismatchError

# Reduce ops, numbered as in the core.
Average = 0
Sum = 1
Min = 2
Max = 3
Product = 4
Adasum = -1  # named for compatibility; rejected when used

OP_NAMES = {Average: "Average", Sum: "Sum", Min: "Min", Max: "Max", Product: "Product"}

ALLREDUCE, ALLGATHER, BROADCAST, BARRIER = 0, 1, 2, 3


def _dtype_codes():
    codes = {np.dtype(np.uint8): 0, np.dtype(np.int8): 1, np.dtype(np.int16): 2,
             np.dtype(np.int32): 3, np.dtype(np.int64): 4, np.dtype(np.float16): 5,
             np.dtype(np.float32): 7, np.dtype(np.float64): 8, np.dtype(np.bool_): 9}
    try:  # NumPy has no bfloat16; ml_dtypes (a TensorFlow and JAX dependency) provides it.
        import ml_dtypes
        codes[np.dtype(ml_dtypes.bfloat16)] = 6
    except ImportError:
        pass
    return codes


DTYPE_CODES = _dtype_codes()
SUPPORTED_DTYPES = ", ".join(str(d) for d in DTYPE_CODES)

_lock = threading.Lock()
_name_counters = {}


def auto_name(prefix):
    """A name for an unnamed collective: the same on every rank that makes the same calls in the
    same order."""
    with _lock:
        counter = _name_counters.setdefault(prefix, itertools.count())
        return f"{prefix}.noname.{next(counter)}"


# ---------------------------------------------------------------------------------- checks

def check_name(name, what):
    if not isinstance(name, str) or not name:
        raise ValueError(f"{what}: the name must be a non-empty string, got {name!r}")


def check_array(array, what, name):
    if not isinstance(array, np.ndarray):
        raise TypeError(f"{what} '{name}': expected a NumPy array, got {type(array).__name__}")
    if array.dtype not in DTYPE_CODES:
        raise TypeError(f"{what} '{name}': dtype {array.dtype} is not supported; use one of "
                        f"{SUPPORTED_DTYPES}")


def check_reduce_op(op, what, dtype=None):
    if op == Adasum:
        raise ValueError(f"{what}: Adasum is not supported by horovodlike; use Average or Sum")
    if isinstance(op, bool) or op not in OP_NAMES:
        raise ValueError(f"{what}: unknown reduce op {op!r}; use hvd.Average, hvd.Sum, hvd.Min, "
                         "hvd.Max or hvd.Product")
    if op == Average and dtype is not None and np.dtype(dtype) == np.bool_:
        raise ValueError(f"{what}: Average of bool tensors is not defined; use Sum (logical or) "
                         "or Min (logical and)")


def check_root(root_rank, what):
    if not isinstance(root_rank, (int, np.integer)) or isinstance(root_rank, bool):
        raise TypeError(f"{what}: root_rank must be an int, got {root_rank!r}")
    if not 0 <= root_rank < basics.size():
        raise ValueError(f"{what}: root_rank {root_rank} is not a rank of this job "
                         f"(ranks 0 to {basics.size() - 1})")


def check_scale(value, what, which):
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{what}: {which} must be a number, got {value!r}")
    return float(value)


def raise_for(code, message):
    if code == _core.STATUS_MISMATCH:
        raise TensorMismatchError(message)
    if code == _core.STATUS_INVALID_ARGUMENT:
        raise ValueError(message)
    raise HorovodInternalError(message)


# ---------------------------------------------------------------------------------- handles

class Handle:
    """One collective in flight. ``wait()`` returns its output (once); for an allgather,
    ``first_dims`` then holds every rank's first dimension."""

    def __init__(self, core_handle, kind, source, output, name):
        self._core_handle = core_handle
        self._kind = kind
        self._keep = (source, output)  # the core reads and writes these until it is done
        self.name = name
        self.first_dims = None
        self._done = False

    def poll(self):
        """True when wait() will not block."""
        return self._done or _core.poll(self._core_handle)

    def wait(self):
        if self._done:
            raise ValueError(f"the collective '{self.name}' was already waited for")
        code, message = _core.wait(self._core_handle)
        self._done = True
        source, output = self._keep
        self._keep = None
        try:
            if code != _core.STATUS_OK:
                raise_for(code, message)
            if self._kind == ALLGATHER:
                raw, shape, first_dims = _core.allgather_output(self._core_handle)
                output = raw.view(source.dtype).reshape(shape)
                self.first_dims = list(first_dims)
        finally:
            _core.release(self._core_handle)
        return output


def wait_all(handles):
    """Waits for every handle, even after one failed, so that no buffer is freed while the core
    may still use it; then raises the first failure or returns the outputs in order."""
    outputs, error = [], None
    for handle in handles:
        try:
            outputs.append(handle.wait())
        except Exception as e:  # noqa: BLE001 - re-raised below, after the others finished
            outputs.append(None)
            error = error or e
    if error is not None:
        raise error
    return outputs


def _contiguous(array):
    # np.ascontiguousarray would turn a 0-d array into a 1-d one.
    return array if array.flags.c_contiguous else np.ascontiguousarray(array).reshape(array.shape)


def _enqueue(kind, name, source, output, **kwargs):
    handle = _core.enqueue(kind, name, source.ctypes.data,
                           0 if output is None else output.ctypes.data,
                           DTYPE_CODES[source.dtype], list(source.shape), **kwargs)
    return Handle(handle, kind, source, output, name)


# ---------------------------------------------------------------------------------- collectives

def allreduce_async(array, name, op=Average, prescale_factor=1.0, postscale_factor=1.0):
    """Starts reducing ``array`` over all ranks into a new array."""
    what = f"allreduce '{name}'"
    check_name(name, "allreduce")
    check_array(array, "allreduce", name)
    check_reduce_op(op, what, array.dtype)
    prescale = check_scale(prescale_factor, what, "prescale_factor")
    postscale = check_scale(postscale_factor, what, "postscale_factor")
    source = _contiguous(array)
    output = np.empty_like(source)
    return _enqueue(ALLREDUCE, name, source, output, reduce_op=op, prescale=prescale,
                    postscale=postscale)


def allgather_async(array, name):
    """Starts concatenating every rank's ``array`` along the first dimension (which may differ
    between ranks)."""
    check_name(name, "allgather")
    check_array(array, "allgather", name)
    if array.ndim == 0:
        raise ValueError(f"allgather '{name}': a scalar cannot be gathered; reshape it to one "
                         "dimension first")
    return _enqueue(ALLGATHER, name, _contiguous(array), None)


def broadcast_async(array, root_rank, name):
    """Starts sending root_rank's ``array`` to every rank, into a new array."""
    check_name(name, "broadcast")
    check_array(array, "broadcast", name)
    check_root(root_rank, f"broadcast '{name}'")
    source = _contiguous(array)
    output = np.empty_like(source)
    return _enqueue(BROADCAST, name, source, output, root_rank=int(root_rank))


def allreduce(array, name, op=Average, prescale_factor=1.0, postscale_factor=1.0):
    return allreduce_async(array, name, op, prescale_factor, postscale_factor).wait()


def allgather(array, name):
    return allgather_async(array, name).wait()


def broadcast(array, root_rank, name):
    return broadcast_async(array, root_rank, name).wait()


def barrier():
    """Blocks until every rank has called barrier()."""
    empty = np.empty(0, dtype=np.uint8)
    Handle(_core.enqueue(BARRIER, "barrier", 0, 0, DTYPE_CODES[empty.dtype], [0]), BARRIER,
           empty, None, "barrier").wait()
