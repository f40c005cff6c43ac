"""DistributedOptimizer for TensorFlow 1 optimizers (tf.compat.v1.train.Optimizer): the wrapped
optimizer's compute_gradients, with every gradient reduced over the ranks of the process set
before apply_gradients sees it, as Horovod's TensorFlow 1 DistributedOptimizer does."""

import tensorflow as tf

from horovodlike.common.process_sets import set_id, set_ranks
from horovodlike.tensorflow.gradient_tape import (_source_key, check_gradient_options,
                                                  reduce_shared_gradients,
                                                  store_reduction_options)


class LegacyDistributedOptimizer(tf.compat.v1.train.Optimizer):
    """Built by hvd.DistributedOptimizer when it is given a tf.compat.v1.train.Optimizer."""

    def __init__(self, optimizer, name, use_locking, device_dense, device_sparse, compression,
                 sparse_as_dense, op, gradient_predivide_factor, groups, process_set,
                 scale_local_gradients):
        set_id(process_set)
        check_gradient_options(op, gradient_predivide_factor, "DistributedOptimizer")
        # Horovod's tests and users reach the wrapped optimizer under this name.
        self._optimizer = optimizer
        store_reduction_options(self, device_dense, device_sparse, compression, sparse_as_dense, op,
                                gradient_predivide_factor, groups, process_set,
                                scale_local_gradients)
        self._hvd_local_vars = set()
        super().__init__(name=name or f"Distributed{type(optimizer).__name__}",
                         use_locking=use_locking)

    def register_local_var(self, var):
        """Marks ``var`` as local to this rank: its gradient is not reduced (and is divided by
        the set's size when scale_local_gradients is set)."""
        self._hvd_local_vars.add(_source_key(var))

    @tf.autograph.experimental.do_not_convert
    def compute_gradients(self, *args, **kwargs):
        """The wrapped optimizer's (gradient, variable) pairs, each gradient averaged (or
        summed) over the ranks of the process set; None gradients stay None."""
        pairs = list(self._optimizer.compute_gradients(*args, **kwargs))
        if self._hvd_set_size <= 1:
            return pairs
        grads = [g for g, _ in pairs]
        variables = [v for _, v in pairs]
        local = [_source_key(v) in self._hvd_local_vars for v in variables]
        grads = reduce_shared_gradients(self, grads, variables, local, "DistributedOptimizer")
        return list(zip(grads, variables))

    def apply_gradients(self, *args, **kwargs):
        return self._optimizer.apply_gradients(*args, **kwargs)

    def get_slot(self, *args, **kwargs):
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args, **kwargs):
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args, **kwargs):
        return self._optimizer.variables(*args, **kwargs)


def legacy_distributed_optimizer(optimizer, name, use_locking, device_dense, device_sparse,
                                 compression, sparse_as_dense, backward_passes_per_step, op,
                                 gradient_predivide_factor, average_aggregated_gradients, groups,
                                 process_set, scale_local_gradients):
    if backward_passes_per_step != 1:
        # Aggregating over several session runs needs accumulator variables and conditional
        # updates in the user's graph; the Keras optimizer and the tape paths have it.
        raise ValueError("DistributedOptimizer: backward_passes_per_step > 1 is supported for "
                         "Keras optimizers, not for TensorFlow 1 (tf.compat.v1.train) "
                         f"optimizers such as {type(optimizer).__name__}")
    return LegacyDistributedOptimizer(optimizer, name, use_locking, device_dense, device_sparse,
                                      compression, sparse_as_dense, op,
                                      gradient_predivide_factor, groups, process_set,
                                      scale_local_gradients)
