"""Collectives on NumPy arrays: the framework-neutral bridge to the core.

Frameworks that can hand over host memory as NumPy arrays (TensorFlow and Keras, through
``.numpy()`` eagerly and ``tf.numpy_function`` in graphs) go through here. Each array is checked,
made C-contiguous and handed to the core as a raw pointer through the request path every
framework shares (requests.py), which keeps the input and the output alive until the core is done
with them; ``Handle.wait()`` returns the output array.

``process_set`` arguments are ProcessSet objects (horovodlike.common.process_sets); root ranks
are global ranks, as in Horovod.
"""

import numpy as np

from horovodlike.common import basics, requests
from horovodlike.common.constants import (  # noqa: F401  (re-exported)
    ADD_PROCESS_SET, ALLGATHER, ALLREDUCE, ALLTOALL, BARRIER, BROADCAST, DTYPES, FLOATING_DTYPES,
    JOIN, REDUCESCATTER, REMOVE_PROCESS_SET, Adasum, Average, Max, Min, Product, Sum)
from horovodlike.common.constants import MAX_NAME_BYTES
from horovodlike.common.constants import OP_NAMES as KIND_NAMES
from horovodlike.common.constants import REDUCE_OP_NAMES as OP_NAMES  # noqa: F401 (re-exported)
from horovodlike.common.process_sets import global_process_set, set_id, set_ranks


def _dtype_codes():
    codes = {}
    for name, code in DTYPES.items():
        if name == "bfloat16":
            try:  # NumPy has no bfloat16; ml_dtypes (a TensorFlow and JAX dependency) has it.
                import ml_dtypes
                codes[np.dtype(ml_dtypes.bfloat16)] = code
            except ImportError:
                pass
        else:
            codes[np.dtype(name)] = code
    return codes


DTYPE_CODES = _dtype_codes()
_FLOATING = tuple(DTYPES[name] for name in FLOATING_DTYPES)
SUPPORTED_DTYPES = ", ".join(str(d) for d in DTYPE_CODES)


# ---------------------------------------------------------------------------------- checks

def check_name(name, what):
    if not isinstance(name, str) or not name:
        raise ValueError(f"{what}: the name must be a non-empty string, got {name!r}")
    check_name_length(name, what)
    if any(c.isspace() for c in name):
        raise ValueError(f"{what}: the name {name!r} must not contain spaces or newlines")


def check_name_length(name, what):
    """A name longer than a message carries (the core refuses it too, but only as it enqueues:
    checked here, a grouped call raises before its first member is queued)."""
    if len(name) * 4 > MAX_NAME_BYTES:  # up to 4 bytes a character: only a long name is encoded
        nbytes = len(name.encode("utf-8", "surrogatepass"))
        if nbytes > MAX_NAME_BYTES:
            raise ValueError(f"{what}: the name '{name[:40]}...' is {nbytes} bytes long; names "
                             f"travel in messages that carry at most {MAX_NAME_BYTES} bytes "
                             "(1 MiB) per string: use a shorter name")


def check_dtype(dtype, what):
    if np.dtype(dtype) not in DTYPE_CODES:
        raise TypeError(f"{what}: dtype {np.dtype(dtype)} is not supported; use one of "
                        f"{SUPPORTED_DTYPES}")


def check_array(array, what):
    if not isinstance(array, np.ndarray):
        raise TypeError(f"{what}: expected a NumPy array, got {type(array).__name__}")
    check_dtype(array.dtype, what)


def check_reduce_op(op, what, dtype=None):
    requests.check_reduce_op(op, what)
    if op == Adasum and dtype is not None and DTYPE_CODES.get(np.dtype(dtype)) not in _FLOATING:
        raise ValueError(f"{what}: op=Adasum is defined for float16, bfloat16, float32 and "
                         f"float64 tensors, not {np.dtype(dtype)}; cast the tensor or use Sum")
    if op == Average and dtype is not None and np.dtype(dtype) == np.bool_:
        raise ValueError(f"{what}: Average of bool tensors is not defined; use Sum (logical or) "
                         "or Min (logical and)")


def check_scale(value, what, which):
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{what}: {which} must be a number, got {value!r}")
    return float(value)


def members(process_set, what):
    """The global ranks of ``process_set``; ValueError if this rank is not one of them."""
    ranks = list(set_ranks(process_set))
    if basics.rank() not in ranks:
        raise ValueError(f"{what}: rank {basics.rank()} is not in the process set {ranks}")
    return ranks


def relative_root(root_rank, process_set, what):
    """The root's position in the set (what the core wants) from its global rank."""
    if not isinstance(root_rank, (int, np.integer)) or isinstance(root_rank, bool):
        raise TypeError(f"{what}: root_rank must be an int, got {root_rank!r}")
    ranks = members(process_set, what)
    if root_rank not in ranks:
        if set_id(process_set) == 0:
            raise ValueError(f"{what}: root_rank {root_rank} is not a rank of this job "
                             f"(ranks 0 to {len(ranks) - 1})")
        raise ValueError(f"{what}: root_rank {root_rank} is not in the process set {ranks}")
    return ranks.index(int(root_rank))


def check_splits(splits, first_dim, process_set, what):
    """alltoall's splits as a list of ints (equal parts when None)."""
    n = len(members(process_set, what))
    if splits is None:
        if first_dim % n:
            raise ValueError(f"{what}: the first dimension {first_dim} does not divide evenly "
                             f"among {n} ranks; pass splits")
        return [first_dim // n] * n
    splits = [int(s) for s in np.asarray(splits).reshape(-1)]
    if len(splits) != n or any(s < 0 for s in splits) or sum(splits) != first_dim:
        raise ValueError(f"{what}: splits {splits} must be {n} non-negative counts (one per "
                         f"rank) that add up to the first dimension {first_dim}")
    return splits


# ---------------------------------------------------------------------------------- handles

class Handle:
    """One collective in flight. ``wait()`` returns its output (once). For an allgather,
    ``extra`` then holds every rank's first dimension; for an alltoall, the rows received from
    each rank."""

    def __init__(self, core_handle, name):
        self._core_handle = core_handle
        self.name = name
        self.extra = None
        self._done = False

    def poll(self):
        """True when wait() will not block."""
        return self._done or requests.poll(self._core_handle)

    def wait(self):
        if self._done:
            raise ValueError(f"the collective '{self.name}' was already waited for")
        try:
            output, self.extra = requests.wait(self._core_handle, _core_output)
        except BaseException:
            # A signal handler raised (Ctrl-C, a test timeout) while the core still works: the
            # handle stays pending, its buffers alive (requests.py), and may be waited again.
            self._done = not requests.is_pending(self._core_handle)
            raise
        self._done = True
        return output


def _core_output(kind, handle, raw, shape, extra, keep):
    """The output the core allocated, as an array of the input's dtype."""
    source = keep[0]
    return raw.view(source.dtype).reshape(shape) if raw.size else \
        np.empty(shape, dtype=source.dtype)


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


def _enqueue(kind, name, source, output, process_set, group, **kwargs):
    handle = requests.enqueue(kind, name, process_set, source.ctypes.data,
                              0 if output is None else output.ctypes.data,
                              DTYPE_CODES[source.dtype], source.shape, (source, output), output,
                              group_id=group[0], group_size=group[1], **kwargs)
    return Handle(handle, name)


# ---------------------------------------------------------------------------------- collectives

def _prepare(array, kind, name, process_set):
    what = f"{KIND_NAMES[kind]} '{name}'"
    check_name(name, KIND_NAMES[kind])
    check_array(array, what)
    members(process_set, what)
    return what


def allreduce_async(array, name, op=Average, prescale_factor=1.0, postscale_factor=1.0,
                    process_set=global_process_set, group=(0, 0)):
    """Starts reducing ``array`` over the ranks of the set into a new array."""
    what = _prepare(array, ALLREDUCE, name, process_set)
    check_reduce_op(op, what, array.dtype)
    prescale = check_scale(prescale_factor, what, "prescale_factor")
    postscale = check_scale(postscale_factor, what, "postscale_factor")
    source = _contiguous(array)
    output = np.empty_like(source)
    return _enqueue(ALLREDUCE, name, source, output, process_set, group, reduce_op=op,
                    prescale=prescale, postscale=postscale)


def allgather_async(array, name, process_set=global_process_set, group=(0, 0)):
    """Starts concatenating every rank's ``array`` along the first dimension (which may differ
    between ranks)."""
    what = _prepare(array, ALLGATHER, name, process_set)
    if array.ndim == 0:
        raise ValueError(f"{what}: a scalar cannot be gathered; reshape it to one dimension first")
    return _enqueue(ALLGATHER, name, _contiguous(array), None, process_set, group)


def broadcast_async(array, root_rank, name, process_set=global_process_set, group=(0, 0)):
    """Starts sending root_rank's ``array`` to every rank of the set, into a new array."""
    what = _prepare(array, BROADCAST, name, process_set)
    root = relative_root(root_rank, process_set, what)
    source = _contiguous(array)
    output = np.empty_like(source)
    return _enqueue(BROADCAST, name, source, output, process_set, group, root_rank=root)


def alltoall_async(array, splits, name, process_set=global_process_set, group=(0, 0)):
    """Starts an alltoall: rows ``splits[j]`` of ``array`` go to the j-th rank of the set (equal
    parts when splits is None). ``extra`` holds the rows received from each rank."""
    what = _prepare(array, ALLTOALL, name, process_set)
    if array.ndim == 0:
        raise ValueError(f"{what}: a scalar cannot be split; reshape it to one dimension first")
    splits = check_splits(splits, array.shape[0], process_set, what)
    return _enqueue(ALLTOALL, name, _contiguous(array), None, process_set, group, splits=splits)


def reducescatter_async(array, name, op=Average, prescale_factor=1.0, postscale_factor=1.0,
                        process_set=global_process_set, group=(0, 0)):
    """Starts a reduce-scatter: the reduction over the set, split along the first dimension (the
    first ranks get one more row when it does not divide evenly)."""
    what = _prepare(array, REDUCESCATTER, name, process_set)
    if array.ndim == 0:
        raise ValueError(f"{what}: a scalar cannot be scattered; reshape it to one dimension "
                         "first")
    check_reduce_op(op, what, array.dtype)
    prescale = check_scale(prescale_factor, what, "prescale_factor")
    postscale = check_scale(postscale_factor, what, "postscale_factor")
    return _enqueue(REDUCESCATTER, name, _contiguous(array), None, process_set, group,
                    reduce_op=op, prescale=prescale, postscale=postscale)


def scattered_rows(first_dim, process_set, rank=None):
    """How many rows of a reduce-scatter of ``first_dim`` rows ``rank`` (this one by default)
    receives."""
    ranks = list(set_ranks(process_set))
    position = ranks.index(basics.rank() if rank is None else rank)
    n = len(ranks)
    return first_dim // n + (1 if position < first_dim % n else 0)


def allreduce(array, name, op=Average, prescale_factor=1.0, postscale_factor=1.0,
              process_set=global_process_set):
    return allreduce_async(array, name, op, prescale_factor, postscale_factor,
                           process_set).wait()


def allgather(array, name, process_set=global_process_set):
    return allgather_async(array, name, process_set).wait()


def broadcast(array, root_rank, name, process_set=global_process_set):
    return broadcast_async(array, root_rank, name, process_set).wait()


def barrier(process_set=global_process_set):
    """Blocks until every rank of the set has called barrier()."""
    members(process_set, "barrier")
    requests.barrier(process_set)


join = requests.join
