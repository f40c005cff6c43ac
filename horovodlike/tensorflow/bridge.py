"""Runs collectives on TensorFlow tensors through the NumPy layer, eagerly or inside graphs.

Eagerly, tensors become NumPy arrays with ``.numpy()`` and the results become tensors again.
Inside a ``tf.function``, one ``tf.numpy_function`` node runs a whole group of collectives: it
enqueues them all, then waits for them all, so the core sees them together and fuses them.

Two things keep graphs from hanging or mismatching across ranks:
- Order. TensorFlow may run independent nodes in any order and on a bounded thread pool, and a
  node that waits for a collective holds its thread; two ranks that started different
  collectives first would wait for each other forever. So every collective node of a graph gets
  a control dependency on the previous one: all ranks run them in the order they were traced.
- Names. An unnamed collective is named when its graph is traced, after the outermost function
  being traced and a counter of that trace, so every rank that traces the same function gets the
  same names, and the names stay fixed from step to step (which the core's response cache uses).
"""

import collections
import threading
import weakref

import numpy as np
import tensorflow as tf

from horovodlike.common import basics, numpy_ops
from horovodlike.common.exceptions import HorovodInternalError, TensorMismatchError
from horovodlike.common.numpy_ops import ALLGATHER, ALLREDUCE, BROADCAST

Spec = collections.namedtuple("Spec", "kind name op prescale postscale root_rank")


def allreduce_spec(name, op, prescale=1.0, postscale=1.0):
    return Spec(ALLREDUCE, name, op, float(prescale), float(postscale), 0)


def allgather_spec(name):
    return Spec(ALLGATHER, name, numpy_ops.Sum, 1.0, 1.0, 0)


def broadcast_spec(name, root_rank):
    return Spec(BROADCAST, name, numpy_ops.Sum, 1.0, 1.0, int(root_rank))


TF_DTYPES = (tf.uint8, tf.int8, tf.int16, tf.int32, tf.int64, tf.float16, tf.bfloat16,
             tf.float32, tf.float64, tf.bool)
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
    what = f"{('allreduce', 'allgather', 'broadcast')[spec.kind]} '{spec.name}'"
    if spec.kind == ALLREDUCE:
        numpy_ops.check_reduce_op(spec.op, what, tensor.dtype.as_numpy_dtype)
    elif spec.kind == ALLGATHER:
        if tensor.shape.rank == 0:
            raise ValueError(f"{what}: a scalar cannot be gathered; reshape it to one dimension "
                             "first")
    elif spec.kind == BROADCAST:
        numpy_ops.check_root(spec.root_rank, what)


# ---------------------------------------------------------------------------------- graphs

class _GraphState:
    def __init__(self):
        self.last = None    # the previous collective node traced into this graph
        self.counter = 0    # unnamed collectives traced so far (kept on the outermost graph)


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
        return numpy_ops.auto_name(prefix)
    root = _outermost(tf.compat.v1.get_default_graph())
    state = _state(root)
    with _lock:
        number = state.counter
        state.counter += 1
    return f"{prefix}.{root.name or 'graph'}.{number}"


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
    """Enqueues every collective, then waits for them all; returns the outputs in order, each
    allgather followed by its ranks' first dimensions (int64)."""
    # Scalars arrive as NumPy scalars, not arrays.
    arrays = [np.asarray(a) for a in arrays]
    handles = []
    try:
        for spec, array in zip(specs, arrays):
            if spec.kind == ALLREDUCE:
                handles.append(numpy_ops.allreduce_async(array, spec.name, spec.op,
                                                         spec.prescale, spec.postscale))
            elif spec.kind == ALLGATHER:
                handles.append(numpy_ops.allgather_async(array, spec.name))
            else:
                handles.append(numpy_ops.broadcast_async(array, spec.root_rank, spec.name))
    finally:
        outputs = numpy_ops.wait_all(handles)
    flat = []
    for spec, handle, output in zip(specs, handles, outputs):
        flat.append(output)
        if spec.kind == ALLGATHER:
            flat.append(np.asarray(handle.first_dims, dtype=np.int64))
    return flat


def _execute_in_graph(specs, arrays):
    """_execute for a graph node. TensorFlow turns an exception raised here into an error of its
    own (ValueError and TypeError become InvalidArgumentError); keep the kind of failure in its
    code and its name in the message."""
    try:
        return _execute(specs, arrays)
    except TensorMismatchError as e:
        raise tf.errors.FailedPreconditionError(None, None, f"TensorMismatchError: {e}") from None
    except HorovodInternalError as e:
        raise tf.errors.InternalError(None, None, f"HorovodInternalError: {e}") from None


def _regroup(specs, flat):
    results, i = [], 0
    for spec in specs:
        if spec.kind == ALLGATHER:
            results.append((flat[i], flat[i + 1]))
            i += 2
        else:
            results.append(flat[i])
            i += 1
    return results


def run(specs, tensors):
    """Runs ``specs[i]`` on ``tensors[i]`` as one group. Returns a result per spec: the output
    tensor, or for an allgather the pair (output, int64 first dimension of every rank)."""
    specs, tensors = list(specs), list(tensors)
    if not specs:
        return []
    for spec, tensor in zip(specs, tensors):
        check_spec(spec, tensor)
    if tf.executing_eagerly():
        flat = _execute(specs, [t.numpy() for t in tensors])
        return _regroup(specs, [tf.convert_to_tensor(a) for a in flat])

    graph = tf.compat.v1.get_default_graph()
    _check_not_xla(graph)
    out_types = []
    for spec, tensor in zip(specs, tensors):
        out_types.append(tensor.dtype)
        if spec.kind == ALLGATHER:
            out_types.append(tf.int64)
    state = _state(graph)
    previous = [state.last] if state.last is not None else []
    with tf.control_dependencies(previous):
        flat = tf.numpy_function(lambda *arrays: _execute_in_graph(specs, arrays), tensors, out_types,
                                 stateful=True, name="HorovodlikeCollectives")
    if not isinstance(flat, (list, tuple)):
        flat = [flat]
    state.last = flat[0].op
    results = _regroup(specs, list(flat))
    for spec, tensor, result in zip(specs, tensors, results):
        if spec.kind == ALLGATHER:
            result[0].set_shape(tf.TensorShape([None]).concatenate(tensor.shape[1:]))
            result[1].set_shape([basics.size()])
        else:
            result.set_shape(tensor.shape)
    return results
