"""DistributedOptimizer for Keras 3 (TensorFlow backend): horovodlike.keras's, and what
horovodlike.tensorflow.DistributedOptimizer returns for a Keras optimizer.

The wrapped optimizer is an instance of a subclass of the optimizer's own class, made from its
config, whose ``apply`` (the method ``apply_gradients`` and Keras' ``model.fit`` train step go
through) first reduces the gradients over all ranks and then lets the original ``apply`` do the
rest: loss-scale handling, clipping, weight decay, the update and the iteration count. So
clipping acts on the averaged gradients, as it would in one process with the global batch.

With ``backward_passes_per_step`` = n > 1, gradients are summed locally (see aggregation.py),
and only every n-th call reduces and applies them; the other calls only count an iteration.

Horovod's ``_compute_gradients(loss, var_list, tape=...)`` (Keras 2's gradient step, which code
written for Horovod calls) is kept: it returns the reduced (and aggregated) gradients, and
``apply_gradients`` then applies them without reducing them again.
"""

import keras
import tensorflow as tf

from horovodlike.common.process_sets import global_process_set, set_id
from horovodlike.tensorflow.aggregation import GradientAggregation
from horovodlike.tensorflow.compression import Compression
from horovodlike.tensorflow.gradient_tape import (check_gradient_options,
                                                  reduce_shared_gradients,
                                                  store_reduction_options)
from horovodlike.tensorflow.keras_variables import local_layer_variables
from horovodlike.tensorflow.mpi_ops import Average


class _DistributedOptimizer:
    """Methods added to the wrapped optimizer's class."""

    def _horovodlike_setup(self, device_dense, device_sparse, compression, sparse_as_dense, op,
                           gradient_predivide_factor, backward_passes_per_step,
                           average_aggregated_gradients, groups, process_set,
                           scale_local_gradients):
        store_reduction_options(self, device_dense, device_sparse, compression, sparse_as_dense, op,
                                gradient_predivide_factor, groups, process_set,
                                scale_local_gradients)
        self._hvd_local_vars = set()
        # Horovod's name for it; None without aggregation.
        self._agg_helper = GradientAggregation(backward_passes_per_step,
                                               average_aggregated_gradients) \
            if backward_passes_per_step > 1 else None
        # Gradients _compute_gradients returned (already aggregated and reduced), by id, so that
        # apply does not reduce them again.
        self._hvd_prepared = set()

    def register_local_var(self, var):
        """Marks ``var`` as local to this rank: its gradient is not reduced (and is divided by
        the number of ranks when scale_local_gradients is set, as in Horovod)."""
        self._hvd_local_vars.add(id(var))

    def _hvd_reduce(self, grads, variables):
        if self._hvd_set_size == 1:
            return list(grads)
        local = [id(v) in self._hvd_local_vars for v in variables]
        return reduce_shared_gradients(self, grads, variables, local, "DistributedOptimizer")

    def _hvd_aggregate_and_reduce(self, grads, variables):
        """Adds this pass's gradients to the local sums. On the pass that completes
        backward_passes_per_step, returns the sums reduced over the ranks and clears them;
        on the others, the local sums so far (as Horovod's optimizer does)."""
        aggregation = self._agg_helper
        count, sums = aggregation.add(grads, variables)
        present = [i for i, total in enumerate(sums) if total is not None]

        def reduce_and_clear():
            values = aggregation.values(sums)
            reduced = self._hvd_reduce(values, variables)
            reduced = [tf.convert_to_tensor(reduced[i]) for i in present]
            with tf.control_dependencies(reduced):
                aggregation.clear(sums)
                return [tf.identity(r) for r in reduced]

        def local_sums():
            return [tf.identity(sums[i].read_value()) for i in present]

        chosen = tf.cond(aggregation.is_complete(count), reduce_and_clear, local_sums)
        out = [None] * len(grads)
        for i, value in zip(present, tf.nest.flatten(chosen)):
            out[i] = value
        return out

    def _compute_gradients(self, loss, var_list, grad_loss=None, tape=None):
        """Horovod's (and Keras 2's) gradient step: the gradients of ``loss`` (a tensor
        recorded on ``tape``, or a callable) with respect to ``var_list``, reduced over the
        ranks (and aggregated over backward_passes_per_step passes). Returns (gradient,
        variable) pairs; pass them to apply_gradients, which then does not reduce them again."""
        tape = tf.GradientTape() if tape is None else tape
        if callable(loss):
            with tape:
                if not callable(var_list):
                    tape.watch(var_list)
                loss = loss()
        if callable(var_list):
            var_list = var_list()
        var_list = list(var_list)
        grads = tape.gradient(loss, var_list, grad_loss)
        if self._agg_helper is None:
            reduced = self._hvd_reduce(list(grads), var_list)
        else:
            reduced = self._hvd_aggregate_and_reduce(list(grads), var_list)
        self._hvd_prepared = {id(g) for g in reduced if g is not None}
        return list(zip(reduced, var_list))

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
        prepared = bool(self._hvd_prepared) and \
            all(g is None or id(g) in self._hvd_prepared for g in grads)
        self._hvd_prepared = set()
        if self._agg_helper is None:
            return parent.apply(grads if prepared else self._hvd_reduce(grads, variables),
                                variables)
        if prepared:
            # _compute_gradients reduced them if this pass completed the aggregation (and
            # reset the counter); otherwise they are partial local sums, not to be applied.
            complete = tf.equal(self._agg_helper.counter, 0)
            return self._hvd_apply_or_count(parent, complete, lambda: grads, variables)
        count, sums = self._agg_helper.add(grads, variables)

        def reduced_sums():
            reduced = self._hvd_reduce(self._agg_helper.values(sums), variables)
            return reduced, sums

        return self._hvd_apply_or_count(parent, self._agg_helper.is_complete(count),
                                        reduced_sums, variables)

    def _hvd_apply_or_count(self, parent, complete, gradients, variables):
        """Applies ``gradients()`` when ``complete``; otherwise only counts an iteration, as
        Horovod does on the passes that only aggregate."""
        def apply_now():
            result = gradients()
            grads, sums = result if isinstance(result, tuple) else (result, None)
            parent.apply(grads, variables)
            if sums is not None:
                self._agg_helper.clear(sums)
            return tf.constant(True)

        def count_only():
            self._iterations.assign_add(1)
            return tf.constant(False)

        tf.cond(complete, apply_now, count_only)


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


def PartialDistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="",
                                compression=Compression.none, sparse_as_dense=False,
                                gradient_predivide_factor=1.0, op=Average,
                                backward_passes_per_step=1, average_aggregated_gradients=False,
                                groups=None, process_set=global_process_set,
                                scale_local_gradients=True, local_layers=None):
    """A DistributedOptimizer whose ``local_layers`` (model-parallel parts each rank owns) keep
    their own gradients: every trainable variable of those layers is registered with
    ``register_local_var``, so its gradient is not reduced (and is divided by the number of
    ranks when scale_local_gradients is set, as in Horovod)."""
    local = local_layer_variables(local_layers, "PartialDistributedOptimizer")
    wrapped = DistributedOptimizer(optimizer, name=name, device_dense=device_dense,
                                   device_sparse=device_sparse, compression=compression,
                                   sparse_as_dense=sparse_as_dense,
                                   gradient_predivide_factor=gradient_predivide_factor, op=op,
                                   backward_passes_per_step=backward_passes_per_step,
                                   average_aggregated_gradients=average_aggregated_gradients,
                                   groups=groups, process_set=process_set,
                                   scale_local_gradients=scale_local_gradients)
    for variable in local:
        wrapped.register_local_var(variable)
    return wrapped


def wrap_in_place(optimizer, compression=Compression.none):
    """Makes an existing optimizer (one loaded with its state) distributed, keeping its state."""
    _check_optimizer(optimizer)
    optimizer.__class__ = _distributed_class(type(optimizer))
    optimizer._horovodlike_setup("", "", compression, False, Average, 1.0, 1, False, None,
                                 global_process_set, True)
    return optimizer
