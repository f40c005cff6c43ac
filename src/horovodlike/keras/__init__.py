"""horovodlike for Keras 3: the API of ``horovod.keras`` and ``horovod.tensorflow.keras``.

    import horovodlike.keras as hvd       # or horovodlike.tensorflow.keras
    hvd.init()
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01 * hvd.size())),
                  loss=...)
    model.fit(x, y, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                               hvd.callbacks.MetricAverageCallback()],
              verbose=1 if hvd.rank() == 0 else 0)

Keras 3 runs on several backends; horovodlike uses its TensorFlow one (KERAS_BACKEND=tensorflow,
the default).
"""

import keras

if keras.backend.backend() != "tensorflow":
    raise ImportError(f"horovodlike.keras needs Keras' TensorFlow backend, but Keras uses "
                      f"'{keras.backend.backend()}'; set KERAS_BACKEND=tensorflow (with PyTorch "
                      "models use horovodlike.torch)")

import tensorflow as tf  # noqa: E402

from horovodlike.common.basics import (init, shutdown, is_initialized, rank, size,  # noqa: E402
                                       local_rank, local_size, cross_rank, cross_size,
                                       is_homogeneous, mpi_built, gloo_built, nccl_built,
                                       ddl_built, ccl_built, cuda_built, rocm_built, mpi_enabled,
                                       gloo_enabled, mpi_threads_supported)
from horovodlike.common.basics import start_timeline, stop_timeline  # noqa: E402
from horovodlike.common.exceptions import (HorovodInternalError, HostsUpdatedInterrupt,  # noqa
                                           TensorMismatchError)
from horovodlike.tensorflow import mpi_ops as _ops  # noqa: E402
from horovodlike.tensorflow.compression import Compression  # noqa: E402
from horovodlike.tensorflow.functions import (broadcast_object, allgather_object,  # noqa: E402
                                              broadcast_variables)
from horovodlike.tensorflow.keras_optimizer import (DistributedOptimizer,  # noqa: E402
                                                    PartialDistributedOptimizer, wrap_in_place)
from horovodlike.tensorflow.keras_variables import optimizer_variables  # noqa: E402
from horovodlike.tensorflow.mpi_ops import (Average, Sum, Min, Max, Product, Adasum,  # noqa
                                            ProcessSet, global_process_set, add_process_set,
                                            remove_process_set)
from horovodlike.keras import callbacks, elastic  # noqa: E402,F401

__all__ = ["init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
           "cross_rank", "cross_size", "is_homogeneous", "mpi_built", "gloo_built", "nccl_built",
           "ddl_built", "ccl_built", "cuda_built", "rocm_built", "mpi_enabled", "gloo_enabled",
           "mpi_threads_supported", "HorovodInternalError", "HostsUpdatedInterrupt",
           "TensorMismatchError", "Compression", "Average", "Sum", "Min", "Max", "Product",
           "Adasum", "ProcessSet", "global_process_set", "add_process_set",
           "remove_process_set", "DistributedOptimizer", "PartialDistributedOptimizer", "allreduce", "allgather", "broadcast",
           "reducescatter", "broadcast_object", "allgather_object", "broadcast_global_variables",
           "load_model", "callbacks", "elastic"]
__all__ += ["start_timeline", "stop_timeline"]


def allreduce(value, name=None, average=None, prescale_factor=1.0, postscale_factor=1.0, op=None,
              compression=Compression.none, process_set=global_process_set):
    """Reduces a tensor-compatible value (tensor, NumPy array, number) over all ranks; returns a
    tensor."""
    return _ops.allreduce(tf.convert_to_tensor(value), average=average, name=name,
                          prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                          op=op, compression=compression, process_set=process_set)


def allgather(value, name=None, process_set=global_process_set):
    """Concatenates every rank's value along the first dimension; returns a tensor."""
    return _ops.allgather(tf.convert_to_tensor(value), name=name, process_set=process_set)


def broadcast(value, root_rank, name=None, process_set=global_process_set):
    """Returns root_rank's value on every rank, as a tensor."""
    return _ops.broadcast(tf.convert_to_tensor(value), root_rank, name=name,
                          process_set=process_set)


def reducescatter(value, name=None, op=Average, process_set=global_process_set):
    """Reduces a value over all ranks and returns this rank's part along the first dimension."""
    return _ops.reducescatter(tf.convert_to_tensor(value), name=name, op=op,
                              process_set=process_set)


def broadcast_global_variables(root_rank, model=None):
    """Overwrites every rank's ``model`` variables, and those of its optimizer once built, with
    root_rank's values; returns None, after the assignments.

    Horovod's version broadcasts TensorFlow 1's collection of global variables, which Keras 3
    (eager, no sessions) does not keep; the model whose state should agree is the closest
    meaningful equivalent, so it is passed explicitly. ``model`` may be any Keras layer or model,
    or anything with a ``variables`` list. Called without one it raises RuntimeError, as
    Horovod's does under eager execution. In ``model.fit``, use
    ``callbacks.BroadcastGlobalVariablesCallback(root_rank)`` instead.
    """
    if model is None:
        raise RuntimeError("broadcast_global_variables: Keras 3 has no global variables; pass "
                           "the model, broadcast_global_variables(root_rank, model), or use "
                           "callbacks.BroadcastGlobalVariablesCallback with model.fit")
    if not hasattr(model, "variables"):
        raise TypeError(f"broadcast_global_variables: model must be a Keras model or layer, got "
                        f"{type(model).__name__}")
    variables = list(model.variables)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None:
        variables += optimizer_variables(optimizer)
    broadcast_variables(variables, root_rank=root_rank)


def load_model(filepath, custom_optimizers=None, custom_objects=None,
               compression=Compression.none):
    """Loads a model saved with ``model.save`` and makes its optimizer, with the state it was
    saved with, a DistributedOptimizer.

    ``custom_optimizers`` lists optimizer classes the saved model uses that Keras does not know.
    """
    objects = dict(custom_objects or {})
    for cls in custom_optimizers or []:
        objects.setdefault(cls.__name__, cls)
    model = keras.models.load_model(filepath, custom_objects=objects)
    if getattr(model, "optimizer", None) is not None:
        wrap_in_place(model.optimizer, compression)
    return model
