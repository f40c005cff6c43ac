"""TensorFlow collectives, eager and inside tf.function, each with its gradient.

The gradients are Horovod's, rule for rule, so that a model migrated from Horovod trains the same:
- allreduce: the gradient is allreduced with the same op and scale factors;
- allgather: the gradient is averaged over the ranks (allreduce op=Average) and each rank takes
  its own rows;
- broadcast: the gradient is averaged over the ranks; the root keeps it, the others get zero;
- alltoall: the gradient goes back where its rows came from (an alltoall with the received
  splits);
- reducescatter: the gradient is allgathered, times the set's size for op=Sum (the scale factors
  are not applied to it).
"""

import tensorflow as tf

from horovodlike import _core
from horovodlike.common import basics, numpy_ops, requests
from horovodlike.common import basics as _basics  # Horovod's name; its tests call hvd.mpi_ops._basics
from horovodlike.common.numpy_ops import (ALLGATHER, ALLREDUCE, ALLTOALL, BROADCAST,
                                          REDUCESCATTER, Adasum, Average, Max, Min, Product, Sum)
from horovodlike.common.process_sets import (ProcessSet, add_process_set, global_process_set,
                                             remove_process_set, set_id, set_ranks)
from horovodlike.tensorflow import bridge
from horovodlike.tensorflow.compression import Compression
from horovodlike.tensorflow.errors import raises_tf_errors

# AutoGraph would otherwise rewrite these functions (and everything they call) each time a
# tf.function that uses them is traced; they are plain Python that builds the graph directly.
_plain = tf.autograph.experimental.do_not_convert

__all__ = ["Average", "Sum", "Min", "Max", "Product", "Adasum", "allreduce", "grouped_allreduce",
           "allgather", "grouped_allgather", "broadcast", "grouped_broadcast", "alltoall",
           "reducescatter", "grouped_reducescatter", "join", "barrier", "size_op", "rank_op",
           "local_size_op", "local_rank_op", "process_set_included_op",
           "handle_average_backwards_compatibility", "ProcessSet", "global_process_set",
           "add_process_set", "remove_process_set"]


def handle_average_backwards_compatibility(op, average):
    """The reduce op from Horovod's deprecated ``average`` argument and ``op``."""
    return requests.resolve_reduce_op(average, op)


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


def _names(base, count):
    return [base] if count == 1 else [f"{base}.{i}" for i in range(count)]


def _group(count, atomic):
    """Grouped calls run as one fused unit in the core; Horovod's grouped_* functions promise
    that, and single tensors need no group."""
    return requests.new_group(count) if atomic and count > 1 else (0, 0)


def _set_size(process_set):
    return len(set_ranks(process_set))


# ---------------------------------------------------------------------------------- allreduce

@_plain
def _allreduce_dense(tensors, names, op, prescale, postscale, process_set, atomic):
    """Allreduce of dense tensors as one graph node, differentiable: the gradient is the same
    reduction of the incoming gradients."""
    group = _group(len(tensors), atomic)

    @tf.custom_gradient
    def reduce(*xs):
        specs = [bridge.make_spec(ALLREDUCE, n, op, prescale, postscale,
                                  process_set=process_set, group=group) for n in names]
        outputs = bridge.run(specs, xs)

        def grad(*dys):
            dys = [tf.zeros_like(x) if dy is None else dy for x, dy in zip(xs, dys)]
            return _allreduce_dense(dys, [bridge.auto_name("allreduce.grad") for _ in dys], op,
                                    prescale, postscale, process_set, atomic)

        return outputs, grad

    return list(reduce(*tensors))


def _allreduce_sparse(slices, names, op, prescale, postscale, process_set, atomic):
    """tf.IndexedSlices are reduced by gathering every rank's rows: the values and the indices
    are allgathered, and the represented dense tensor is the sum (or average) of the ranks'.
    As in Horovod, Average divides the values by the set's size with TensorFlow's true
    division, so integer values become floating point."""
    values = [bridge.to_tensor(s.values, "allreduce", n) for s, n in zip(slices, names)]
    indices = [bridge.to_tensor(s.indices, "allreduce", n) for s, n in zip(slices, names)]
    gathered = _allgather(values + indices, [f"{n}.values" for n in names]
                          + [f"{n}.indices" for n in names], process_set, atomic)
    out = []
    for i, s in enumerate(slices):
        new_values = gathered[i]
        if op == Average:
            new_values = new_values / tf.cast(_set_size(process_set), new_values.dtype)
        if prescale * postscale != 1.0:
            new_values = new_values * tf.cast(prescale * postscale, new_values.dtype)
        out.append(tf.IndexedSlices(new_values, gathered[len(slices) + i], s.dense_shape))
    return out


def _check_sparse_scaling(tensors, prescale_factor, postscale_factor):
    # Horovod's allreduce refuses scale factors for tf.IndexedSlices; DistributedGradientTape
    # and DistributedOptimizer (gradient_predivide_factor) still scale them, through _reduce.
    if (prescale_factor != 1.0 or postscale_factor != 1.0) and \
            any(isinstance(t, tf.IndexedSlices) for t in tensors):
        raise NotImplementedError("allreduce of tf.IndexedSlices does not take prescale_factor "
                                  "or postscale_factor; scale the values, or convert with "
                                  "tf.convert_to_tensor")


@_plain
def _reduce(tensors, average, device_dense, device_sparse, compression, op, prescale_factor,
            postscale_factor, process_set, ignore_name_scope, name, atomic):
    tensors = list(tensors)
    if not tensors:
        return tensors
    op = handle_average_backwards_compatibility(op, average)
    numpy_ops.check_reduce_op(op, "allreduce")
    prescale = numpy_ops.check_scale(prescale_factor, "allreduce", "prescale_factor")
    postscale = numpy_ops.check_scale(postscale_factor, "allreduce", "postscale_factor")
    set_id(process_set)
    names = _names(_name(name, "allreduce", ignore_name_scope), len(tensors))

    dense = [(i, t) for i, t in enumerate(tensors) if not isinstance(t, tf.IndexedSlices)]
    sparse = [(i, t) for i, t in enumerate(tensors) if isinstance(t, tf.IndexedSlices)]
    if sparse and op not in (Average, Sum):
        # NotImplementedError and before the dense tensors are looked at, as in Horovod.
        raise NotImplementedError("allreduce of tf.IndexedSlices supports only op=Average or "
                                  "op=Sum; pass sparse_as_dense=True or convert with "
                                  "tf.convert_to_tensor")
    results = [None] * len(tensors)
    if dense:
        with tf.device(device_dense):
            compressed, contexts = [], []
            for i, t in dense:
                c, ctx = compression.compress(bridge.to_tensor(t, "allreduce", names[i]))
                compressed.append(c)
                contexts.append(ctx)
            reduced = _allreduce_dense(compressed, [names[i] for i, _ in dense], op, prescale,
                                       postscale, process_set, atomic)
            for (i, _), r, ctx in zip(dense, reduced, contexts):
                results[i] = compression.decompress(r, ctx)
    if sparse:
        with tf.device(device_sparse):
            reduced = _allreduce_sparse([t for _, t in sparse], [names[i] for i, _ in sparse], op,
                                        prescale, postscale, process_set, atomic)
            for (i, _), r in zip(sparse, reduced):
                results[i] = r
    return results


@_plain
@raises_tf_errors
def allreduce(tensor, average=None, device_dense="", device_sparse="",
              compression=Compression.none, op=None, prescale_factor=1.0, postscale_factor=1.0,
              name=None, process_set=global_process_set, ignore_name_scope=False):
    """Reduces ``tensor`` over the ranks of the set (Average by default); differentiable.

    A tf.IndexedSlices is reduced by allgathering its values and indices (op Average or Sum).
    """
    _check_sparse_scaling([tensor], prescale_factor, postscale_factor)
    return _reduce([tensor], average, device_dense, device_sparse, compression, op,
                   prescale_factor, postscale_factor, process_set, ignore_name_scope, name,
                   atomic=False)[0]


@_plain
@raises_tf_errors
def grouped_allreduce(tensors, average=None, device_dense="", device_sparse="",
                      compression=Compression.none, op=None, prescale_factor=1.0,
                      postscale_factor=1.0, process_set=global_process_set,
                      ignore_name_scope=False, name=None):
    """Reduces every tensor of ``tensors`` as one group that the core runs together, fused.
    Entries may be tf.Tensor, tf.Variable or tf.IndexedSlices. Returns a list in order."""
    _check_sparse_scaling(tensors, prescale_factor, postscale_factor)
    return _reduce(tensors, average, device_dense, device_sparse, compression, op,
                   prescale_factor, postscale_factor, process_set, ignore_name_scope, name,
                   atomic=True)


# ---------------------------------------------------------------------------------- allgather

@_plain
def _allgather(tensors, names, process_set, atomic):
    """Allgather as one graph node, differentiable: each rank's gradient is its own rows of the
    average of every rank's gradient."""
    group = _group(len(tensors), atomic)

    @tf.custom_gradient
    def gather(*xs):
        specs = [bridge.make_spec(ALLGATHER, n, process_set=process_set, group=group)
                 for n in names]
        results = bridge.run(specs, xs)
        outputs = [gathered for gathered, _ in results]
        first_dims = [dims for _, dims in results]

        def grad(*dys):
            dys = [tf.zeros_like(out) if dy is None else dy for out, dy in zip(outputs, dys)]
            averaged = _allreduce_dense(dys, [bridge.auto_name("allgather.grad") for _ in dys],
                                        Average, 1.0, 1.0, process_set, atomic)
            me = list(set_ranks(process_set)).index(basics.rank())
            grads = []
            for total, dims in zip(averaged, first_dims):
                start = tf.reduce_sum(dims[:me])
                grads.append(total[start:start + dims[me]])
            return grads

        return outputs, grad

    return list(gather(*tensors))


def _gather(tensors, process_set, ignore_name_scope, name, atomic):
    tensors = list(tensors)
    if not tensors:
        return tensors
    set_id(process_set)
    names = _names(_name(name, "allgather", ignore_name_scope), len(tensors))
    return _allgather([bridge.to_tensor(t, "allgather", n) for t, n in zip(tensors, names)],
                      names, process_set, atomic)


@_plain
@raises_tf_errors
def allgather(tensor, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Concatenates every rank's ``tensor`` along the first dimension, which may differ between
    ranks (the others must match); differentiable."""
    return _gather([tensor], process_set, ignore_name_scope, name, atomic=False)[0]


@_plain
@raises_tf_errors
def grouped_allgather(tensors, name=None, ignore_name_scope=False,
                      process_set=global_process_set):
    """Allgathers every tensor of ``tensors`` as one group the core runs together."""
    return _gather(tensors, process_set, ignore_name_scope, name, atomic=True)


# ---------------------------------------------------------------------------------- broadcast

@_plain
def _broadcast(tensors, names, root_rank, process_set, atomic=False):
    group = _group(len(tensors), atomic)

    @tf.custom_gradient
    def send(*xs):
        specs = [bridge.make_spec(BROADCAST, n, root_rank=root_rank, process_set=process_set,
                                  group=group) for n in names]
        outputs = bridge.run(specs, xs)

        def grad(*dys):
            dys = [tf.zeros_like(x) if dy is None else dy for x, dy in zip(xs, dys)]
            averaged = _allreduce_dense(dys, [bridge.auto_name("broadcast.grad") for _ in dys],
                                        Average, 1.0, 1.0, process_set, atomic)
            if basics.rank() != root_rank:
                # Depending on the allreduce keeps a graph from pruning it on this rank while
                # the root waits for it.
                with tf.control_dependencies(averaged):
                    return [tf.zeros_like(a) for a in averaged]
            return averaged

        return outputs, grad

    return list(send(*tensors))


@_plain
@raises_tf_errors
def grouped_broadcast(tensors, root_rank, name=None, ignore_name_scope=False,
                      process_set=global_process_set):
    """Sends root_rank's tensors to every rank of the set, as one group; differentiable."""
    tensors = list(tensors)
    if not tensors:
        return tensors
    base = _name(name, "broadcast", ignore_name_scope)
    numpy_ops.relative_root(root_rank, process_set, f"broadcast '{base}'")
    names = _names(base, len(tensors))
    return _broadcast([bridge.to_tensor(t, "broadcast", n) for t, n in zip(tensors, names)],
                      names, root_rank, process_set, atomic=True)


@_plain
@raises_tf_errors
def broadcast(tensor, root_rank, name=None, ignore_name_scope=False,
              process_set=global_process_set):
    """Returns root_rank's ``tensor`` (root_rank is a global rank) on every rank of the set;
    differentiable."""
    base = _name(name, "broadcast", ignore_name_scope)
    numpy_ops.relative_root(root_rank, process_set, f"broadcast '{base}'")
    return _broadcast([bridge.to_tensor(tensor, "broadcast", base)], [base], root_rank,
                      process_set)[0]


# ---------------------------------------------------------------------------------- alltoall

def _alltoall(tensor, splits, name, process_set):
    @tf.custom_gradient
    def exchange(x):
        spec = bridge.make_spec(ALLTOALL, name, process_set=process_set,
                                splits=None if splits is None else 0)
        (output, received), = bridge.run([spec], [x], [] if splits is None else [splits])

        def grad(dy, _=None):
            if dy is None:
                dy = tf.zeros_like(output)
            back, _ = _alltoall(dy, received, bridge.auto_name("alltoall.grad"), process_set)
            return back

        return (output, received), grad

    return exchange(tensor)


@_plain
@raises_tf_errors
def alltoall(tensor, splits=None, name=None, ignore_name_scope=False,
             process_set=global_process_set):
    """Sends rows ``splits[j]`` of ``tensor`` (along the first dimension) to the j-th rank of the
    set and concatenates what every rank sent here, in rank order; equal parts when ``splits`` is
    None. Returns the output, and also the received splits (int32) when ``splits`` is given, as
    in Horovod. Differentiable."""
    base = _name(name, "alltoall", ignore_name_scope)
    x = bridge.to_tensor(tensor, "alltoall", base)
    if x.shape.rank and x.shape[0] is not None and (splits is None or not tf.is_tensor(splits)):
        # Known when traced: check now rather than when the graph runs.
        numpy_ops.check_splits(splits, x.shape[0], process_set, f"alltoall '{base}'")
    split_tensor = None
    if splits is not None:
        split_tensor = tf.reshape(tf.cast(tf.convert_to_tensor(splits), tf.int32), [-1])
    output, received = _alltoall(x, split_tensor, base, process_set)
    return (output, received) if splits is not None else output


# ---------------------------------------------------------------------------------- reducescatter

def _reducescatter(tensors, names, op, prescale, postscale, process_set, atomic):
    group = _group(len(tensors), atomic)

    @tf.custom_gradient
    def scatter(*xs):
        specs = [bridge.make_spec(REDUCESCATTER, n, op, prescale, postscale,
                                  process_set=process_set, group=group) for n in names]
        outputs = bridge.run(specs, xs)

        def grad(*dys):
            dys = [tf.zeros_like(o) if dy is None else dy for o, dy in zip(outputs, dys)]
            if op == Sum:
                dys = [dy * tf.cast(_set_size(process_set), dy.dtype) for dy in dys]
            return _allgather(dys, [bridge.auto_name("reducescatter.grad") for _ in dys],
                              process_set, atomic)

        return outputs, grad

    return list(scatter(*tensors))


def _scatter(tensors, device_dense, compression, op, name, process_set, ignore_name_scope,
             prescale_factor, postscale_factor, atomic):
    tensors = list(tensors)
    if not tensors:
        return tensors
    numpy_ops.check_reduce_op(op, "reducescatter")
    prescale = numpy_ops.check_scale(prescale_factor, "reducescatter", "prescale_factor")
    postscale = numpy_ops.check_scale(postscale_factor, "reducescatter", "postscale_factor")
    set_id(process_set)
    names = _names(_name(name, "reducescatter", ignore_name_scope), len(tensors))
    with tf.device(device_dense):
        compressed, contexts = [], []
        for t, n in zip(tensors, names):
            c, ctx = compression.compress(bridge.to_tensor(t, "reducescatter", n))
            compressed.append(c)
            contexts.append(ctx)
        outputs = _reducescatter(compressed, names, op, prescale, postscale, process_set, atomic)
        return [compression.decompress(o, ctx) for o, ctx in zip(outputs, contexts)]


@_plain
@raises_tf_errors
def reducescatter(tensor, device_dense="", compression=Compression.none, op=Average, name=None,
                  process_set=global_process_set, ignore_name_scope=False, prescale_factor=1.0,
                  postscale_factor=1.0):
    """Reduces ``tensor`` over the set and gives each rank its part along the first dimension
    (the first ranks get one more row when it does not divide evenly); differentiable."""
    return _scatter([tensor], device_dense, compression, op, name, process_set,
                    ignore_name_scope, prescale_factor, postscale_factor, atomic=False)[0]


@_plain
@raises_tf_errors
def grouped_reducescatter(tensors, device_dense="", compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0, name=None, ignore_name_scope=False):
    """Reduce-scatters every tensor of ``tensors`` as one group the core runs together."""
    return _scatter(tensors, device_dense, compression, op, name, process_set, ignore_name_scope,
                    prescale_factor, postscale_factor, atomic=True)


# ---------------------------------------------------------------------------------- others

@_plain
def join():
    """Declares that this rank has no more data: until every rank has joined, the others'
    allreduces go on with this rank contributing zeros. Returns the last rank to join (an int32
    tensor); works eagerly and inside tf.function."""
    return bridge.run_function(numpy_ops.join, tf.int32, "HorovodlikeJoin")


@_plain
def barrier(process_set=global_process_set):
    """Blocks until every rank of the set has called barrier(). Inside tf.function it returns
    the node to depend on."""
    numpy_ops.members(process_set, "barrier")

    def wait():
        numpy_ops.barrier(process_set)
        return 0

    done = bridge.run_function(wait, tf.int32, "HorovodlikeBarrier")
    return None if tf.executing_eagerly() else done


@_plain
def size_op(process_set_id=0, name=None):
    """The number of ranks (of the process set with that id), as an int32 tensor."""
    return tf.constant(len(_core.process_set_ranks(process_set_id)), dtype=tf.int32,
                       name=name)


@_plain
def local_size_op(name=None):
    return tf.constant(basics.local_size(), dtype=tf.int32, name=name)


@_plain
def rank_op(name=None):
    return tf.constant(basics.rank(), dtype=tf.int32, name=name)


@_plain
def local_rank_op(name=None):
    return tf.constant(basics.local_rank(), dtype=tf.int32, name=name)


@_plain
def process_set_included_op(process_set_id=0, name=None):
    """1 if this rank is in the process set with that id, else 0 (int32 tensor)."""
    ranks = _core.process_set_ranks(process_set_id)
    return tf.constant(int(basics.rank() in ranks), dtype=tf.int32, name=name)
