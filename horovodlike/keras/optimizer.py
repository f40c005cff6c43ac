"""DistributedOptimizer for Keras 3 (TensorFlow backend).

The wrapped optimizer is an instance of a subclass of the optimizer's own class, made from its
config, whose ``apply`` (the method ``apply_gradients`` and Keras' ``model.fit`` train step go
through) first reduces the gradients over all ranks and then lets the original ``apply`` do the
rest: loss-scale handling, clipping, weight decay, the update and the iteration count. So
clipping acts on the averaged gradients, as it would in one process with the global batch.

With ``backward_passes_per_step`` = n > 1, gradients are summed locally in variables the
optimizer keeps outside its Keras state (so checkpoints match an unwrapped optimizer's), and
only every n-th call reduces and applies them; the other calls only count an iteration.
"""

import keras
import tensorflow as tf

from horovodlike.common.process_sets import global_process_set, set_id, set_ranks
from horovodlike.tensorflow.compression import Compression
from horovodlike.tensorflow.gradient_tape import (check_gradient_options, reduce_gradients,
                                                  scale_gradient)
from horovodlike.tensorflow.mpi_ops import Average


class _DistributedOptimizer:
    """Methods added to the wrapped optimizer's class."""

    def _horovodlike_setup(self, device_dense, device_sparse, compression, sparse_as_dense, op,
                           gradient_predivide_factor, backward_passes_per_step,
                           average_aggregated_gradients, groups, process_set,
                           scale_local_gradients):
        self._hvd_options = dict(device_dense=device_dense, device_sparse=device_sparse,
                                 compression=compression, sparse_as_dense=sparse_as_dense, op=op,
                                 gradient_predivide_factor=gradient_predivide_factor,
                                 groups=groups, process_set=process_set)
        self._hvd_set_size = len(set_ranks(process_set))
        self._hvd_passes = int(backward_passes_per_step)
        self._hvd_average_aggregated = bool(average_aggregated_gradients)
        self._hvd_scale_local_gradients = scale_local_gradients
        self._hvd_local_vars = set()
        self._hvd_aggregated = None  # per trainable variable, when backward_passes_per_step > 1
        self._hvd_counter = None

    def register_local_var(self, var):
        """Marks ``var`` as local to this rank: its gradient is not reduced (and is divided by
        the number of ranks when scale_local_gradients is set, as in Horovod)."""
        self._hvd_local_vars.add(id(var))

    def build(self, variables):
        super(self.__class__, self).build(variables)
        if self._hvd_passes > 1:
            self._hvd_build_aggregation(variables)

    def _hvd_build_aggregation(self, variables):
        # Plain tf.Variables: Keras does not count them among the optimizer's variables, so a
        # checkpoint of this optimizer loads into an unwrapped one and back.
        with tf.init_scope():
            self._hvd_aggregated = [
                tf.Variable(tf.zeros(v.shape, dtype=v.dtype), trainable=False,
                            name="hvd_aggregated_gradient") for v in variables]
            self._hvd_counter = tf.Variable(0, dtype=tf.int64, trainable=False,
                                            name="hvd_aggregation_counter")
            self._hvd_aggregated_index = {id(v): i for i, v in enumerate(variables)}

    def _hvd_reduce(self, grads, variables):
        if self._hvd_set_size == 1:
            return list(grads)
        local = [id(v) in self._hvd_local_vars for v in variables]
        shared = [i for i, is_local in enumerate(local) if not is_local]
        reduced = reduce_gradients([grads[i] for i in shared], [variables[i] for i in shared],
                                   "DistributedOptimizer", **self._hvd_options)
        out = list(grads)
        for i, g in zip(shared, reduced):
            out[i] = g
        if self._hvd_scale_local_gradients:
            for i, is_local in enumerate(local):
                if is_local and out[i] is not None:
                    out[i] = scale_gradient(out[i], 1.0 / self._hvd_set_size)
        return out

    @tf.autograph.experimental.do_not_convert
    def apply(self, grads, trainable_variables=None):
        parent = super(self.__class__, self)
        grads = list(grads)
        if not grads:
            return parent.apply(grads, trainable_variables)
        if trainable_variables is None:
            if not self.built:
                return parent.apply(grads, trainable_variables)  # raises Keras' own error
            variables = list(self._trainable_variables)
        else:
            variables = list(trainable_variables)
            if not self.built:
                with keras.name_scope(self.name, caller=self):
                    self.build(variables)
                self.built = True
        if len(grads) != len(variables):
            raise ValueError(f"DistributedOptimizer.apply: {len(grads)} gradients for "
                             f"{len(variables)} variables")
        if self._hvd_passes == 1:
            return parent.apply(self._hvd_reduce(grads, variables), variables)
        return self._hvd_apply_aggregated(parent, grads, variables)

    def _hvd_apply_aggregated(self, parent, grads, variables):
        if self._hvd_aggregated is None:
            self._hvd_build_aggregation(self._trainable_variables)
        slots = [self._hvd_aggregated[self._hvd_aggregated_index[id(v)]] for v in variables]
        for slot, g in zip(slots, grads):
            if g is not None:
                slot.assign_add(tf.cast(tf.convert_to_tensor(g), slot.dtype))
        count = self._hvd_counter.assign_add(1)
        present = [g is not None for g in grads]
        passes = self._hvd_passes

        def reduce_and_apply():
            aggregated = []
            for slot, has_grad in zip(slots, present):
                if not has_grad:
                    aggregated.append(None)
                    continue
                value = tf.identity(slot.read_value())
                aggregated.append(value / passes if self._hvd_average_aggregated else value)
            parent.apply(self._hvd_reduce(aggregated, variables), variables)
            for slot in slots:
                slot.assign(tf.zeros_like(slot))
            self._hvd_counter.assign(0)
            return tf.constant(True)

        def count_only():
            self._iterations.assign_add(1)
            return tf.constant(False)

        tf.cond(count >= passes, reduce_and_apply, count_only)


def _distributed_class(base):
    attrs = {k: v for k, v in _DistributedOptimizer.__dict__.items()
             if k not in ("__dict__", "__weakref__", "__module__", "__doc__")}
    # Saved models name the original class, so they load without horovodlike.
    attrs["__module__"] = base.__module__
    attrs["__doc__"] = base.__doc__
    return type(base.__name__, (base,), attrs)


def _check_optimizer(optimizer):
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError("DistributedOptimizer expects a Keras 3 optimizer (keras.optimizers."
                        f"Optimizer), got {type(optimizer).__name__}; for a custom training loop "
                        "use hvd.DistributedGradientTape")
    if hasattr(optimizer, "_hvd_options"):
        raise ValueError("this optimizer is already a DistributedOptimizer")


def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="",
                         compression=Compression.none, sparse_as_dense=False,
                         gradient_predivide_factor=1.0, op=Average, backward_passes_per_step=1,
                         average_aggregated_gradients=False, num_groups=0, groups=None,
                         process_set=global_process_set, scale_local_gradients=True):
    """Wraps a Keras 3 optimizer so that gradients are reduced (averaged by default) over all
    ranks before they are applied.

    As in Horovod, the result is a new optimizer made from ``optimizer.get_config()`` (state such
    as momentum is not copied): wrap the optimizer before training with it. ``name`` renames the
    optimizer; by default it keeps the original's name.
    """
    set_id(process_set)
    _check_optimizer(optimizer)
    check_gradient_options(op, gradient_predivide_factor, "DistributedOptimizer")
    if isinstance(backward_passes_per_step, bool) or not isinstance(backward_passes_per_step, int) \
            or backward_passes_per_step < 1:
        raise ValueError("backward_passes_per_step must be an int >= 1, got "
                         f"{backward_passes_per_step!r}")
    if num_groups and groups is None:
        groups = num_groups
    config = optimizer.get_config()
    if name is not None:
        config["name"] = name
    wrapped = _distributed_class(type(optimizer)).from_config(config)
    wrapped._horovodlike_setup(device_dense, device_sparse, compression, sparse_as_dense, op,
                               gradient_predivide_factor, backward_passes_per_step,
                               average_aggregated_gradients, groups, process_set,
                               scale_local_gradients)
    return wrapped


def wrap_in_place(optimizer, compression=Compression.none):
    """Makes an existing optimizer (one loaded with its state) distributed, keeping its state."""
    _check_optimizer(optimizer)
    optimizer.__class__ = _distributed_class(type(optimizer))
    optimizer._horovodlike_setup("", "", compression, False, Average, 1.0, 1, False, None,
                                 global_process_set, True)
    return optimizer
