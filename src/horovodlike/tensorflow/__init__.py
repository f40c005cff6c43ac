"""horovodlike for TensorFlow 2: the API of ``horovod.tensorflow``.

    import horovodlike.tensorflow as hvd
    hvd.init()

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))

    hvd.broadcast_variables(model.variables, root_rank=0)

Every collective works eagerly and inside tf.function (not XLA-compiled functions), and has a
gradient. Eagerly, a mismatch between ranks raises TensorMismatchError and a failed peer
HorovodInternalError. Inside tf.function, bad arguments raise when the function is traced;
failures while the graph runs come out as TensorFlow's errors (tf.errors.UnknownError, whose
message names TensorMismatchError or HorovodInternalError and what differed), because TensorFlow
converts every Python exception raised by a graph node.

Tensors on a GPU work, through host memory: TensorFlow copies them to the host and back around
each collective, whatever ``tf.device`` scope or ``device_dense`` / ``device_sparse`` is given
(those are accepted as in Horovod). NCCL serves PyTorch's CUDA tensors only (docs/gpu.md).
"""

import tensorflow as tf

from horovodlike.common.basics import (init, shutdown, is_initialized, rank, size, local_rank,
                                       local_size, cross_rank, cross_size, is_homogeneous,
                                       mpi_built, gloo_built, nccl_built, ddl_built, ccl_built,
                                       cuda_built, rocm_built, mpi_enabled, gloo_enabled,
                                       mpi_threads_supported)
from horovodlike.common.basics import start_timeline, stop_timeline
from horovodlike.common.exceptions import (HorovodInternalError, HostsUpdatedInterrupt,
                                           TensorMismatchError)
from horovodlike.tensorflow.compression import Compression
from horovodlike.tensorflow.mpi_ops import (Average, Sum, Min, Max, Product, Adasum,
                                            allreduce, grouped_allreduce, allgather,
                                            grouped_allgather, broadcast, grouped_broadcast,
                                            alltoall, reducescatter, grouped_reducescatter, join,
                                            barrier, size_op, local_size_op, rank_op,
                                            local_rank_op, process_set_included_op,
                                            handle_average_backwards_compatibility, ProcessSet,
                                            global_process_set, add_process_set,
                                            remove_process_set)
from horovodlike.tensorflow.functions import (broadcast_variables, broadcast_global_variables,
                                              broadcast_,
                                              broadcast_object, broadcast_object_fn,
                                              allgather_object)
from horovodlike.tensorflow.gradient_tape import (DistributedGradientTape,
                                                  PartialDistributedGradientTape)
from horovodlike.tensorflow import elastic, util  # noqa: F401
from horovodlike.tensorflow.util import _executing_eagerly  # noqa: F401
from horovodlike.tensorflow.legacy_optimizer import legacy_distributed_optimizer


def gpu_available(ext_base_name="tensorflow", verbose=False):
    """Whether the framework named by ``ext_base_name`` ("tensorflow" or "torch") sees a GPU,
    as Horovod's helper of this name answers."""
    if ext_base_name == "torch":
        import torch  # deferred: torch is optional, asked about only here
        return torch.cuda.is_available()
    return bool(tf.config.list_physical_devices("GPU"))


def check_num_rank_power_of_2(num_rank):
    """True when ``num_rank`` is a power of two (what Adasum needs)."""
    return num_rank > 0 and num_rank & (num_rank - 1) == 0


def DistributedOptimizer(optimizer, name=None, use_locking=False, device_dense="",
                         device_sparse="", compression=Compression.none, sparse_as_dense=False,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         average_aggregated_gradients=False, num_groups=0, groups=None,
                         process_set=global_process_set, scale_local_gradients=True):
    """Wraps a Keras 3 optimizer (see horovodlike.keras.DistributedOptimizer), or a TensorFlow 1
    optimizer (tf.compat.v1.train.Optimizer), whose compute_gradients then returns gradients
    reduced over the ranks of the process set."""
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        return legacy_distributed_optimizer(
            optimizer, name, use_locking, device_dense, device_sparse, compression,
            sparse_as_dense, backward_passes_per_step, op, gradient_predivide_factor,
            average_aggregated_gradients, groups if groups is not None else (num_groups or None),
            process_set, scale_local_gradients)
    # Deferred: Keras is imported only when a Keras optimizer is wrapped (importing it is slow,
    # and a script may have set it to another backend).
    import keras
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(f"DistributedOptimizer expects a Keras optimizer or a "
                        f"tf.compat.v1.train.Optimizer, got {type(optimizer).__name__}")
    from horovodlike.tensorflow.keras_optimizer import DistributedOptimizer as keras_optimizer
    return keras_optimizer(optimizer, name=name, device_dense=device_dense,
                           device_sparse=device_sparse, compression=compression,
                           sparse_as_dense=sparse_as_dense,
                           gradient_predivide_factor=gradient_predivide_factor, op=op,
                           backward_passes_per_step=backward_passes_per_step,
                           average_aggregated_gradients=average_aggregated_gradients,
                           num_groups=num_groups, groups=groups, process_set=process_set,
                           scale_local_gradients=scale_local_gradients)


def __getattr__(name):
    # Keras is imported only when these are used: importing it is slow, and it may be set to
    # another backend in a script that does not use them.
    if name == "SyncBatchNormalization":
        from horovodlike.tensorflow.sync_batch_norm import SyncBatchNormalization
        return SyncBatchNormalization
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
