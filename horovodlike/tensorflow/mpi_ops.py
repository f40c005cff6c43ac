"""TensorFlow collectives, eager and inside tf.function, each with its gradient.

Gradients are those of the sum of all ranks' losses:
- allreduce: the gradient is allreduced with the same op and scale factors;
- allgather: each rank gets its own rows of the sum of all ranks' gradients;
- broadcast: the root gets the sum of all ranks' gradients, the other ranks zero.
"""

import tensorflow as tf

from horovodlike.common import basics, numpy_ops
from horovodlike.common.numpy_ops import Adasum, Average, Max, Min, Product, Sum
from horovodlike.tensorflow import bridge
from horovodlike.tensorflow.compression import Compression

__all__ = ["Average", "Sum", "Min", "Max", "Product", "Adasum", "allreduce", "grouped_allreduce",
           "allgather", "grouped_allgather", "broadcast", "barrier", "size_op", "rank_op",
           "local_size_op", "local_rank_op", "handle_average_backwards_compatibility"]


def handle_average_backwards_compatibility(op, average):
    """The reduce op from Horovod's deprecated ``average`` argument and ``op``."""
    if op is not None:
        if average is not None:
            raise ValueError("the op and average arguments are mutually exclusive")
        return op
    if average is None or average:
        return Average
    return Sum


def _name(name, prefix, ignore_name_scope):
    """The collective's name: given ones are prefixed with the current name scope, as the
    TensorFlow node of a Horovod op would be; missing ones are made up (see bridge.auto_name)."""
    if name is None:
        return bridge.auto_name(prefix)
    numpy_ops.check_name(name, prefix)
    if not ignore_name_scope:
        scope = tf.get_current_name_scope()
        if scope:
            return f"{scope}/{name}"
    return name


def _check_process_set(process_set):
    if process_set is not None and process_set != 0:
        raise ValueError("process sets are not supported by this version; use the default "
                         "(all ranks)")


# ---------------------------------------------------------------------------------- allreduce

def _allreduce_dense(tensors, names, op, prescale, postscale):
    """Grouped allreduce of dense tensors, differentiable: the gradient is the same grouped
    allreduce of the incoming gradients."""

    @tf.custom_gradient
    def reduce(*xs):
        specs = [bridge.allreduce_spec(n, op, prescale, postscale) for n in names]
        outputs = bridge.run(specs, xs)

        def grad(*dys):
            dys = [tf.zeros_like(x) if dy is None else dy for x, dy in zip(xs, dys)]
            grad_names = [bridge.auto_name("allreduce.grad") for _ in dys]
            return _allreduce_dense(dys, grad_names, op, prescale, postscale)

        return outputs, grad

    return list(reduce(*tensors))


def _allreduce_sparse(slices, names, op, prescale, postscale):
    """tf.IndexedSlices are reduced by gathering every rank's rows: the values and the indices
    are allgathered, and the represented dense tensor is the sum (or average) of the ranks'."""
    if op not in (Average, Sum):
        raise ValueError("allreduce of tf.IndexedSlices supports only op=Average or op=Sum; "
                         "pass sparse_as_dense=True or convert with tf.convert_to_tensor")
    values = [bridge.to_tensor(s.values, "allreduce", n) for s, n in zip(slices, names)]
    indices = [bridge.to_tensor(s.indices, "allreduce", n) for s, n in zip(slices, names)]
    gathered = _allgather(values + indices, [f"{n}.values" for n in names]
                          + [f"{n}.indices" for n in names])
    scale = prescale * postscale / (basics.size() if op == Average else 1)
    out = []
    for i, s in enumerate(slices):
        new_values = gathered[i]
        if scale != 1.0:
            new_values = new_values * tf.cast(scale, new_values.dtype)
        out.append(tf.IndexedSlices(new_values, gathered[len(slices) + i], s.dense_shape))
    return out


def grouped_allreduce(tensors, average=None, device_dense="", device_sparse="",
                      compression=Compression.none, op=None, prescale_factor=1.0,
                      postscale_factor=1.0, process_set=None, ignore_name_scope=False,
                      name=None):
    """Reduces every tensor of ``tensors`` over all ranks, as one group the core fuses.

    Entries may be tf.Tensor, tf.Variable or tf.IndexedSlices (reduced by allgather of their
    values and indices). Returns a list in the same order.
    """
    _check_process_set(process_set)
    tensors = list(tensors)
    if not tensors:
        return tensors
    op = handle_average_backwards_compatibility(op, average)
    numpy_ops.check_reduce_op(op, "allreduce")
    prescale = numpy_ops.check_scale(prescale_factor, "allreduce", "prescale_factor")
    postscale = numpy_ops.check_scale(postscale_factor, "allreduce", "postscale_factor")
    base = _name(name, "allreduce", ignore_name_scope)
    names = [base if len(tensors) == 1 else f"{base}.{i}" for i in range(len(tensors))]

    dense = [(i, t) for i, t in enumerate(tensors) if not isinstance(t, tf.IndexedSlices)]
    sparse = [(i, t) for i, t in enumerate(tensors) if isinstance(t, tf.IndexedSlices)]
    results = [None] * len(tensors)
    if dense:
        with tf.device(device_dense):
            compressed, contexts = [], []
            for i, t in dense:
                c, ctx = compression.compress(bridge.to_tensor(t, "allreduce", names[i]))
                compressed.append(c)
                contexts.append(ctx)
            reduced = _allreduce_dense(compressed, [names[i] for i, _ in dense], op, prescale,
                                       postscale)
            for (i, _), r, ctx in zip(dense, reduced, contexts):
                results[i] = compression.decompress(r, ctx)
    if sparse:
        with tf.device(device_sparse):
            reduced = _allreduce_sparse([t for _, t in sparse], [names[i] for i, _ in sparse], op,
                                        prescale, postscale)
            for (i, _), r in zip(sparse, reduced):
                results[i] = r
    return results


def allreduce(tensor, average=None, device_dense="", device_sparse="",
              compression=Compression.none, op=None, prescale_factor=1.0, postscale_factor=1.0,
              name=None, process_set=None, ignore_name_scope=False):
    """Reduces ``tensor`` over all ranks (Average by default); differentiable.

    A tf.IndexedSlices is reduced by allgathering its values and indices (op Average or Sum).
    """
    return grouped_allreduce([tensor], average, device_dense, device_sparse, compression, op,
                             prescale_factor, postscale_factor, process_set, ignore_name_scope,
                             name)[0]


# ---------------------------------------------------------------------------------- allgather

def _allgather(tensors, names):
    """Grouped allgather, differentiable: each rank's gradient is its own rows of the sum of
    every rank's gradient."""

    @tf.custom_gradient
    def gather(*xs):
        results = bridge.run([bridge.allgather_spec(n) for n in names], xs)
        outputs = [gathered for gathered, _ in results]
        first_dims = [dims for _, dims in results]

        def grad(*dys):
            dys = [tf.zeros_like(out) if dy is None else dy for out, dy in zip(outputs, dys)]
            summed = _allreduce_dense(dys, [bridge.auto_name("allgather.grad") for _ in dys],
                                      Sum, 1.0, 1.0)
            rank = basics.rank()
            grads = []
            for total, dims in zip(summed, first_dims):
                start = tf.reduce_sum(dims[:rank])
                grads.append(total[start:start + dims[rank]])
            return grads

        return outputs, grad

    return list(gather(*tensors))


def grouped_allgather(tensors, process_set=None, ignore_name_scope=False, name=None):
    """Concatenates every rank's tensors along their first dimension, as one group."""
    _check_process_set(process_set)
    tensors = list(tensors)
    if not tensors:
        return tensors
    base = _name(name, "allgather", ignore_name_scope)
    names = [base if len(tensors) == 1 else f"{base}.{i}" for i in range(len(tensors))]
    return _allgather([bridge.to_tensor(t, "allgather", n) for t, n in zip(tensors, names)], names)


def allgather(tensor, name=None, ignore_name_scope=False, process_set=None):
    """Concatenates every rank's ``tensor`` along the first dimension, which may differ between
    ranks (the others must match); differentiable."""
    return grouped_allgather([tensor], process_set, ignore_name_scope, name)[0]


# ---------------------------------------------------------------------------------- broadcast

def _broadcast(tensors, names, root_rank):
    @tf.custom_gradient
    def send(*xs):
        outputs = bridge.run([bridge.broadcast_spec(n, root_rank) for n in names], xs)

        def grad(*dys):
            dys = [tf.zeros_like(x) if dy is None else dy for x, dy in zip(xs, dys)]
            summed = _allreduce_dense(dys, [bridge.auto_name("broadcast.grad") for _ in dys],
                                      Sum, 1.0, 1.0)
            if basics.rank() != root_rank:
                return [tf.zeros_like(s) for s in summed]
            return summed

        return outputs, grad

    return list(send(*tensors))


def grouped_broadcast(tensors, root_rank, name=None, ignore_name_scope=False, process_set=None):
    """Sends root_rank's tensors to every rank, as one group; differentiable."""
    _check_process_set(process_set)
    tensors = list(tensors)
    if not tensors:
        return tensors
    base = _name(name, "broadcast", ignore_name_scope)
    names = [base if len(tensors) == 1 else f"{base}.{i}" for i in range(len(tensors))]
    numpy_ops.check_root(root_rank, f"broadcast '{base}'")
    return _broadcast([bridge.to_tensor(t, "broadcast", n) for t, n in zip(tensors, names)],
                      names, root_rank)


def broadcast(tensor, root_rank, name=None, ignore_name_scope=False, process_set=None):
    """Returns root_rank's ``tensor`` on every rank; differentiable."""
    return grouped_broadcast([tensor], root_rank, name, ignore_name_scope, process_set)[0]


# ---------------------------------------------------------------------------------- others

def barrier(process_set=None):
    """Blocks until every rank has called barrier() (eagerly)."""
    _check_process_set(process_set)
    if not tf.executing_eagerly():
        raise ValueError("barrier() runs eagerly; call it outside tf.function")
    numpy_ops.barrier()


def size_op(process_set_id=0, name=None):
    """The number of ranks, as an int32 tensor."""
    return tf.constant(basics.size(), dtype=tf.int32, name=name)


def local_size_op(name=None):
    return tf.constant(basics.local_size(), dtype=tf.int32, name=name)


def rank_op(name=None):
    return tf.constant(basics.rank(), dtype=tf.int32, name=name)


def local_rank_op(name=None):
    return tf.constant(basics.local_rank(), dtype=tf.int32, name=name)
