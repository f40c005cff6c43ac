"""Runs collectives on TensorFlow tensors through the NumPy layer, eagerly or inside graphs.

Eagerly, tensors become NumPy arrays with ``.numpy()`` and the results become tensors again.
Tensors on a GPU therefore go through host memory (``.numpy()`` copies them there; in a graph
the collective node is placed on the host and TensorFlow copies its inputs and outputs): the
core's CUDA and NCCL path serves PyTorch's tensors only (docs/gpu.md).
Inside a ``tf.function``, one ``tf.numpy_function`` node runs a whole group of collectives: it
enqueues them all, then waits for them all, so the core sees them together and fuses them.

Two things keep graphs from hanging or mismatching across ranks:
- Order. TensorFlow may run independent nodes in any order and on a bounded thread pool, and a
  node that waits for a collective holds its thread; two ranks that started different
  collectives first would wait for each other forever. So every collective node of a graph gets
  a control dependency on the previous one: all ranks run them in the order they were traced.
  In a TensorFlow 1 graph, which grows between session runs, the chain starts anew with the
  first node built after one of its nodes ran: those belong to later runs, and depending on
  earlier nodes would run those again each time.
- Names. An unnamed collective is named when its graph is traced, after the outermost function
  being traced and a counter of that trace, so every rank that traces the same function gets the
  same names, and the names stay fixed from step to step (which the core's response cache uses).

In a TensorFlow 1 graph, a session run may fetch collectives of several such chains, which
nothing orders: each rank runs as many at once as its inter-op thread pool has threads, and if
the ranks picked different ones, all wait. TensorFlow sizes that pool by the number of cores
(two on a small machine), so unless TF_NUM_INTEROP_THREADS says otherwise it is set to
``SESSION_THREADS`` here, before a session creates the pool: up to twice that many unordered
collectives per run are safe.

Checks that need no other rank run before anything is enqueued, at trace time in a graph. What
fails while a graph runs (a mismatch between ranks, a failed peer) reaches the caller as the
error TensorFlow makes of any exception raised in a ``tf.numpy_function``, with our message.
"""

import collections
import os
import threading
import weakref

import numpy as np
import tensorflow as tf

from horovodlike.common import numpy_ops, requests
from horovodlike.common.constants import DTYPES
from horovodlike.common.exceptions import TensorMismatchError
from horovodlike.common.numpy_ops import (ALLGATHER, ALLREDUCE, ALLTOALL, BROADCAST, KIND_NAMES,
                                          REDUCESCATTER)
from horovodlike.common.process_sets import global_process_set
from horovodlike.tensorflow import errors

SESSION_THREADS = 64
os.environ.setdefault("TF_NUM_INTEROP_THREADS", str(SESSION_THREADS))

# One collective of a group. ``splits`` (alltoall) is None for equal parts, or the position of
# the splits tensor among run()'s extra inputs, so that splits computed in the graph work.
Spec = collections.namedtuple(
    "Spec", "kind name op prescale postscale root_rank process_set group splits")


def make_spec(kind, name, op=numpy_ops.Sum, prescale=1.0, postscale=1.0, root_rank=0,
              process_set=global_process_set, group=(0, 0), splits=None):
    return Spec(kind, name, op, float(prescale), float(postscale), root_rank, process_set, group,
                splits)


# TensorFlow's dtype of each name the core numbers.
TF_DTYPES = tuple(getattr(tf, name) for name in DTYPES)
_SUPPORTED = ", ".join(d.name for d in TF_DTYPES)


def to_tensor(value, what, name):
    """``value`` as a dense tf.Tensor of a dtype the core supports, or TypeError."""
    if isinstance(value, tf.IndexedSlices):
        raise TypeError(f"{what} '{name}': tf.IndexedSlices is only accepted by allreduce; "
                        "convert it with tf.convert_to_tensor first")
    if isinstance(value, tf.SparseTensor):
        raise TypeError(f"{what} '{name}': tf.SparseTensor is not supported; use "
                        "tf.sparse.to_dense first")
    try:
        tensor = tf.convert_to_tensor(value)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{what} '{name}': expected a tensor, got {type(value).__name__} ({e})") \
            from None
    if tensor.dtype not in TF_DTYPES:
        raise TypeError(f"{what} '{name}': dtype {tensor.dtype.name} is not supported; use one "
                        f"of {_SUPPORTED}")
    return tensor


def check_spec(spec, tensor):
    """The checks that need no other rank, made before anything is enqueued (at trace time in a
    graph), so that a bad call raises on this rank instead of leaving the others waiting."""
    numpy_ops.check_name_length(spec.name, KIND_NAMES[spec.kind])
    what = f"{KIND_NAMES[spec.kind]} '{spec.name}'"
    numpy_ops.members(spec.process_set, what)
    if spec.kind in (ALLREDUCE, REDUCESCATTER):
        numpy_ops.check_reduce_op(spec.op, what, tensor.dtype.as_numpy_dtype)
    if spec.kind in (ALLGATHER, ALLTOALL, REDUCESCATTER) and tensor.shape.rank == 0:
        verb = "gathered" if spec.kind == ALLGATHER else "split"
        raise ValueError(f"{what}: a scalar cannot be {verb}; reshape it to one dimension first")
    if spec.kind == BROADCAST:
        numpy_ops.relative_root(spec.root_rank, spec.process_set, what)


# ---------------------------------------------------------------------------------- graphs

class _GraphState:
    def __init__(self):
        self.last = None    # the previous collective node traced into this graph
        self.counter = 0    # unnamed collectives traced so far (kept on the outermost graph)
        self.ran = False    # a collective node of this graph has run (TensorFlow 1 sessions)


_lock = threading.Lock()
_graphs = weakref.WeakKeyDictionary()


def _state(graph):
    with _lock:
        state = _graphs.get(graph)
        if state is None:
            state = _graphs[graph] = _GraphState()
        return state


def _outermost(graph):
    """The function being traced at the top: control-flow bodies and nested functions are traced
    inside it, and their names (which carry global counters) may differ between ranks."""
    outer = getattr(graph, "outer_graph", None)
    while outer is not None and hasattr(outer, "outer_graph"):
        graph, outer = outer, outer.outer_graph
    return graph


def auto_name(prefix):
    """A name for an unnamed collective, equal on every rank that makes the same calls."""
    if tf.executing_eagerly():
        return requests.auto_name(prefix)
    root = _outermost(tf.compat.v1.get_default_graph())
    state = _state(root)
    with _lock:
        number = state.counter
        state.counter += 1
    # A TensorFlow 1 graph (tf.Graph, run by a session) has no name; a traced function has.
    return f"{prefix}.{getattr(root, 'name', None) or 'graph'}.{number}"


def _check_not_xla(graph):
    try:
        from tensorflow.python.ops import control_flow_util
        in_xla = control_flow_util.GraphOrParentsInXlaContext(graph)
    except (ImportError, AttributeError):
        return
    if in_xla:
        raise ValueError("horovodlike collectives cannot run inside an XLA-compiled function: "
                         "use tf.function(jit_compile=False), or model.compile(..., "
                         "jit_compile=False) with Keras")


# ---------------------------------------------------------------------------------- running

def _execute(specs, arrays):
    """Enqueues every collective, then waits for them all. ``arrays`` holds one input per spec,
    then the extra inputs (alltoall splits). Returns the outputs in order, each allgather followed
    by its ranks' first dimensions (int64) and each alltoall by its received splits (int32)."""
    # Scalars arrive as NumPy scalars, not arrays.
    arrays = [np.asarray(a) for a in arrays]
    inputs, extras = arrays[:len(specs)], arrays[len(specs):]
    # Every check before the first enqueue: a rank that fails halfway would leave the others
    # waiting for the rest of the group.
    splits = [numpy_ops.check_splits(None if s.splits is None else extras[s.splits],
                                     a.shape[0] if a.ndim else 0, s.process_set,
                                     f"alltoall '{s.name}'") if s.kind == ALLTOALL else None
              for s, a in zip(specs, inputs)]
    handles = []
    try:
        for spec, array, split in zip(specs, inputs, splits):
            common = dict(process_set=spec.process_set, group=spec.group)
            if spec.kind == ALLREDUCE:
                handle = numpy_ops.allreduce_async(array, spec.name, spec.op, spec.prescale,
                                                   spec.postscale, **common)
            elif spec.kind == ALLGATHER:
                handle = numpy_ops.allgather_async(array, spec.name, **common)
            elif spec.kind == BROADCAST:
                handle = numpy_ops.broadcast_async(array, spec.root_rank, spec.name, **common)
            elif spec.kind == ALLTOALL:
                handle = numpy_ops.alltoall_async(array, split, spec.name, **common)
            else:
                handle = numpy_ops.reducescatter_async(array, spec.name, spec.op, spec.prescale,
                                                       spec.postscale, **common)
            handles.append(handle)
    finally:
        outputs = numpy_ops.wait_all(handles)
    flat = []
    for spec, handle, output in zip(specs, handles, outputs):
        flat.append(output)
        if spec.kind == ALLGATHER:
            flat.append(np.asarray(handle.extra, dtype=np.int64))
        elif spec.kind == ALLTOALL:
            flat.append(np.asarray(handle.extra, dtype=np.int32))
    return flat


def _regroup(specs, flat):
    results, i = [], 0
    for spec in specs:
        if spec.kind in (ALLGATHER, ALLTOALL):
            results.append((flat[i], flat[i + 1]))
            i += 2
        else:
            results.append(flat[i])
            i += 1
    return results


def _graph_node(function, inputs, out_types, name):
    """A tf.numpy_function node that runs after the graph's previous collective node. A mismatch
    between ranks comes out of it as tf.errors.FailedPreconditionError (see errors.py)."""
    graph = tf.compat.v1.get_default_graph()
    _check_not_xla(graph)
    state = _state(graph)
    if state.ran and not getattr(graph, "building_function", False):
        state.last, state.ran = None, False
    previous = [state.last] if state.last is not None else []

    def call(*arrays):
        state.ran = True
        try:
            return list(function(*arrays)) + [np.bytes_(b"")]
        except TensorMismatchError as e:
            # Returned rather than raised, for errors.checked to raise with the class Horovod's ops
            # raise; the placeholders are never read.
            placeholders = [np.zeros(0, dtype=t.as_numpy_dtype) for t in out_types]
            return placeholders + [np.bytes_(errors.status_path(str(e).encode()))]

    # On the host whatever device scope the caller is in: a py_func and the string ops of
    # errors.checked have no GPU kernel, so under tf.device("/GPU:0") without soft placement
    # they could not be placed; TensorFlow copies GPU inputs and outputs across.
    with tf.device("/CPU:0"):
        with tf.control_dependencies(previous):
            flat = tf.numpy_function(call, inputs, list(out_types) + [tf.string], stateful=True,
                                     name=name)
        state.last = flat[0].op
        return errors.checked(flat[:-1], flat[-1])


def run(specs, tensors, extra_inputs=()):
    """Runs ``specs[i]`` on ``tensors[i]`` as one group. Returns a result per spec: the output
    tensor, or for an allgather the pair (output, int64 first dimension of every rank), for an
    alltoall (output, int32 rows received from every rank)."""
    specs, tensors, extra_inputs = list(specs), list(tensors), list(extra_inputs)
    if not specs:
        return []
    for spec, tensor in zip(specs, tensors):
        check_spec(spec, tensor)
    if tf.executing_eagerly():
        try:
            flat = _execute(specs, [t.numpy() for t in tensors + extra_inputs])
        except (ValueError, TypeError, TensorMismatchError) as e:
            raise errors.as_tf_error(e) from e
        return _regroup(specs, [tf.convert_to_tensor(a) for a in flat])

    out_types = []
    for spec, tensor in zip(specs, tensors):
        out_types.append(tensor.dtype)
        if spec.kind == ALLGATHER:
            out_types.append(tf.int64)
        elif spec.kind == ALLTOALL:
            out_types.append(tf.int32)
    flat = _graph_node(lambda *arrays: _execute(specs, arrays), tensors + extra_inputs,
                       out_types, "HorovodlikeCollectives")
    results = _regroup(specs, flat)
    for spec, tensor, result in zip(specs, tensors, results):
        if spec.kind in (ALLGATHER, ALLTOALL):
            result[0].set_shape(tf.TensorShape([None]).concatenate(tensor.shape[1:]))
            result[1].set_shape([len(numpy_ops.members(spec.process_set, spec.name))])
        elif spec.kind == REDUCESCATTER:
            rows = tensor.shape[0]
            if rows is not None:
                rows = numpy_ops.scattered_rows(rows, spec.process_set)
            result.set_shape(tf.TensorShape([rows]).concatenate(tensor.shape[1:]))
        else:
            result.set_shape(tensor.shape)
    return results


def run_function(function, out_type, name):
    """Runs ``function()`` (a collective without inputs, such as join or a barrier) eagerly, or
    as a graph node ordered after the graph's previous collective; returns its int result."""
    if tf.executing_eagerly():
        return tf.constant(function(), dtype=out_type)

    def call():
        return [np.asarray(function(), dtype=out_type.as_numpy_dtype)]

    result = _graph_node(call, [], [out_type], name)[0]
    result.set_shape([])
    return result
