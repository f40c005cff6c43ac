"""DistributedGradientTape: a tf.GradientTape whose gradient() averages over all ranks (or
sums, or combines them with Adasum)."""

import tensorflow as tf

from horovodlike.common.process_sets import global_process_set, set_id, set_ranks
from horovodlike.tensorflow import bridge
from horovodlike.tensorflow.compression import Compression
from horovodlike.tensorflow.keras_variables import local_layer_variables
from horovodlike.tensorflow.mpi_ops import Adasum, Average, Sum, _reduce


def check_gradient_options(op, gradient_predivide_factor, what):
    # Adasum combines the gradients themselves (as Horovod's DistributedGradientTape does).
    if op not in (Average, Sum, Adasum):
        raise ValueError(f"{what}: op must be hvd.Average, hvd.Sum or hvd.Adasum, got {op!r}")
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError(f"{what}: gradient_predivide_factor is only defined for op=hvd.Average")
    if gradient_predivide_factor <= 0:
        raise ValueError(f"{what}: gradient_predivide_factor must be positive")


def split_groups(count, groups, sources, what):
    """Positions 0..count-1 split as Horovod's ``groups`` asks: None is one group of all; an int
    n is n groups of consecutive positions; a list of lists of variables puts each inner list in
    a group and every other position in a group of its own."""
    if groups is None:
        return [list(range(count))] if count else []
    if isinstance(groups, bool):
        raise ValueError(f"{what}: groups must be a positive int or a list of lists of variables")
    if isinstance(groups, int):
        if groups <= 0:
            raise ValueError(f"{what}: groups must be a positive int or a list of lists of "
                             f"variables, got {groups}")
        groups = min(groups, count)
        bounds = [count * g // groups for g in range(groups + 1)] if groups else [0]
        return [list(range(bounds[g], bounds[g + 1])) for g in range(groups)]
    if not isinstance(groups, (list, tuple)):
        raise ValueError(f"{what}: groups must be a positive int or a list of lists of variables")
    position = {}
    for i, source in enumerate(sources):
        position.setdefault(source.ref() if hasattr(source, "ref") else id(source), i)
    taken, result = set(), []
    for inner in groups:
        members = []
        for variable in inner:
            key = variable.ref() if hasattr(variable, "ref") else id(variable)
            if key in position and position[key] not in taken:
                members.append(position[key])
                taken.add(position[key])
        if members:
            result.append(sorted(members))
    result.extend([i] for i in range(count) if i not in taken)
    return result


@tf.autograph.experimental.do_not_convert
def reduce_gradients(grads, sources, name, compression, sparse_as_dense, op,
                     gradient_predivide_factor, groups, process_set, device_dense="",
                     device_sparse=""):
    """Averages (or sums) gradients over the ranks of the set; None entries stay None.

    Without ``groups`` all gradients go to the core together, as one graph node, and the core
    fuses them as it sees fit (and serves them from its response cache); each explicit group is
    a grouped allreduce that the core runs as one unit.
    """
    if not process_set.included():
        # A rank outside the set keeps its own gradients (as in Horovod): every rank may build
        # the same tape or optimizer for a set, and only the set's members exchange.
        return list(grads)
    if sparse_as_dense:
        grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
    present = [i for i, g in enumerate(grads) if g is not None]
    if op == Average and gradient_predivide_factor != 1.0:
        # The core divides by the set's size for Average; split that around the sum as asked.
        prescale, postscale = 1.0 / gradient_predivide_factor, gradient_predivide_factor
    else:
        prescale, postscale = 1.0, 1.0
    # Eagerly, fixed names let the core's response cache recognise the same gradients each step;
    # in a graph, names are fixed when it is traced.
    base = name if tf.executing_eagerly() else bridge.auto_name(name)
    reduced = list(grads)
    for number, group in enumerate(split_groups(len(present), groups,
                                                [sources[i] for i in present], name)):
        positions = [present[g] for g in group]
        outputs = _reduce([grads[i] for i in positions], None, device_dense, device_sparse,
                          compression, op, prescale, postscale, process_set, True,
                          f"{base}.group{number}", atomic=groups is not None)
        for i, out in zip(positions, outputs):
            reduced[i] = out
    return reduced


def scale_gradient(grad, factor):
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values * tf.cast(factor, grad.values.dtype), grad.indices,
                                grad.dense_shape)
    return grad * tf.cast(factor, grad.dtype)


def _source_key(source):
    # tf.Variable and tensors hash by .ref(); Keras 3 variables have no ref() but are objects
    # that live as long as the model.
    return source.ref() if hasattr(source, "ref") else id(source)



def store_reduction_options(owner, device_dense, device_sparse, compression, sparse_as_dense, op,
                            gradient_predivide_factor, groups, process_set,
                            scale_local_gradients):
    """Keeps Horovod's reduction options on a tape or optimizer wrapper, as reduce_gradients
    reads them: the options, the process set's size and whether local gradients are scaled."""
    owner._hvd_options = dict(device_dense=device_dense, device_sparse=device_sparse,
                              compression=compression, sparse_as_dense=sparse_as_dense, op=op,
                              gradient_predivide_factor=gradient_predivide_factor,
                              groups=groups, process_set=process_set)
    owner._hvd_set_size = len(set_ranks(process_set))
    owner._hvd_scale_local_gradients = scale_local_gradients


def reduce_shared_gradients(owner, grads, sources, local, what):
    """The gradients of a tape or optimizer wrapper (``owner``, with store_reduction_options'
    options): those of sources not marked ``local`` reduced over the ranks; the local ones kept,
    divided by the set's size when scale_local_gradients is set (as in Horovod)."""
    shared = [i for i, is_local in enumerate(local) if not is_local]
    reduced = reduce_gradients([grads[i] for i in shared], [sources[i] for i in shared], what,
                               **owner._hvd_options)
    out = list(grads)
    for i, g in zip(shared, reduced):
        out[i] = g
    if owner._hvd_scale_local_gradients:
        for i, is_local in enumerate(local):
            if is_local and out[i] is not None:
                out[i] = scale_gradient(out[i], 1.0 / owner._hvd_set_size)
    return out


class _DistributedGradientTape:
    """Methods added to the wrapped tape's class."""

    def _horovodlike_setup(self, device_dense, device_sparse, compression, sparse_as_dense, op,
                           gradient_predivide_factor, groups, process_set, scale_local_gradients):
        store_reduction_options(self, device_dense, device_sparse, compression, sparse_as_dense, op,
                                gradient_predivide_factor, groups, process_set,
                                scale_local_gradients)
        self._hvd_local_sources = set()

    def register_local_source(self, source):
        """Marks ``source`` as local to this rank: its gradient is not reduced (and is divided
        by the number of ranks when scale_local_gradients is set, as in Horovod)."""
        self._hvd_local_sources.add(_source_key(source))

    @tf.autograph.experimental.do_not_convert
    def gradient(self, target, sources, output_gradients=None,
                 unconnected_gradients=tf.UnconnectedGradients.NONE):
        grads = super(self.__class__, self).gradient(target, sources, output_gradients,
                                                     unconnected_gradients)
        flat_sources = tf.nest.flatten(sources)
        flat_grads = tf.nest.flatten(grads, expand_composites=False)
        out = list(flat_grads)
        if self._hvd_set_size > 1:
            local = [_source_key(s) in self._hvd_local_sources for s in flat_sources]
            out = reduce_shared_gradients(self, flat_grads, flat_sources, local,
                                          "DistributedGradientTape")
        return tf.nest.pack_sequence_as(grads, out)


def DistributedGradientTape(gradtape, device_dense="", device_sparse="",
                            compression=Compression.none, sparse_as_dense=False, op=Average,
                            gradient_predivide_factor=1.0, num_groups=0, groups=None,
                            process_set=global_process_set, scale_local_gradients=True):
    """Wraps a tf.GradientTape so that gradient() returns gradients reduced over all ranks
    (averaged by default), as Horovod's DistributedGradientTape does.

    Gradients that are tf.IndexedSlices (embedding lookups) are reduced by allgathering their
    rows, or densified first with ``sparse_as_dense=True``. ``groups`` (or the older
    ``num_groups``) splits the gradients into groups, each reduced as one fused group; by
    default all gradients form one group.
    """
    set_id(process_set)
    check_gradient_options(op, gradient_predivide_factor, "DistributedGradientTape")
    if num_groups and groups is None:
        groups = num_groups
    cls = type(gradtape.__class__.__name__, (gradtape.__class__,),
               {k: v for k, v in _DistributedGradientTape.__dict__.items()
                if k not in ("__dict__", "__weakref__", "__module__", "__doc__")})
    tape = cls.__new__(cls)
    tape.__dict__.update(gradtape.__dict__)
    tape._horovodlike_setup(device_dense, device_sparse, compression, sparse_as_dense, op,
                            gradient_predivide_factor, groups, process_set,
                            scale_local_gradients)
    return tape


def PartialDistributedGradientTape(gradtape, device_dense="", device_sparse="",
                                   compression=Compression.none, sparse_as_dense=False,
                                   op=Average, gradient_predivide_factor=1.0, num_groups=0,
                                   groups=None, process_set=global_process_set,
                                   local_layers=None, scale_local_gradients=True):
    """A DistributedGradientTape whose ``local_layers`` (Keras layers each rank owns, in model
    parallelism) keep their own gradients: their trainable variables are registered with
    ``register_local_source``."""
    tape = DistributedGradientTape(gradtape, device_dense, device_sparse, compression,
                                   sparse_as_dense, op, gradient_predivide_factor, num_groups,
                                   groups, process_set, scale_local_gradients)
    for variable in local_layer_variables(local_layers, "PartialDistributedGradientTape"):
        tape.register_local_source(variable)
    return tape
