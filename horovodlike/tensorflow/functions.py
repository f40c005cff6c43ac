"""Broadcasting variables, and Python objects, between ranks."""

import tensorflow as tf

from horovodlike.common import numpy_ops, objects
from horovodlike.common.process_sets import global_process_set
from horovodlike.tensorflow import bridge
from horovodlike.tensorflow.mpi_ops import _broadcast


@tf.autograph.experimental.do_not_convert
def broadcast_variables(variables, root_rank, process_set=global_process_set, inplace=False):
    """Overwrites every rank's ``variables`` with root_rank's values.

    Works eagerly (the variables are assigned when it returns) and inside tf.function (returns
    the grouped assign op). ``variables`` may hold tf.Variable or Keras variables, such as
    ``model.variables`` and ``optimizer.variables``. ``inplace`` is accepted for Horovod
    compatibility: the values travel through one host buffer either way.
    """
    variables = list(variables)
    for i, variable in enumerate(variables):
        if not hasattr(variable, "assign"):
            raise TypeError(f"broadcast_variables: entry {i} is a {type(variable).__name__}, not "
                            "a variable")
    numpy_ops.relative_root(root_rank, process_set, "broadcast_variables")
    if not variables:
        return tf.group([]) if not tf.executing_eagerly() else None
    base = bridge.auto_name("broadcast_variables")
    names = [f"{base}.{i}" for i in range(len(variables))]
    values = [bridge.to_tensor(v, "broadcast_variables", n) for v, n in zip(variables, names)]
    received = _broadcast(values, names, root_rank, process_set)
    assigns = [v.assign(r) for v, r in zip(variables, received)]
    if tf.executing_eagerly():
        return None
    return tf.group(*[a for a in assigns if a is not None])


def _check_eager(what, session):
    if session is not None:
        raise ValueError(f"{what}: session is for TensorFlow 1 graphs, which horovodlike does not "
                         "support; call it eagerly")
    if not tf.executing_eagerly():
        raise ValueError(f"{what} runs eagerly; call it outside tf.function")


def broadcast_object(obj, root_rank=0, session=None, name=None, process_set=global_process_set):
    """Returns root_rank's ``obj`` (anything cloudpickle can serialize) on every rank."""
    _check_eager("broadcast_object", session)
    return objects.broadcast_object(obj, root_rank, name, process_set)


def allgather_object(obj, session=None, name=None, process_set=global_process_set):
    """Returns the list of every rank's ``obj``, in rank order."""
    _check_eager("allgather_object", session)
    return objects.allgather_object(obj, name, process_set)
