"""Broadcasting variables, and Python objects, between ranks."""

import tensorflow as tf

from horovodlike.common import numpy_ops, objects
from horovodlike.common.process_sets import global_process_set
from horovodlike.tensorflow import bridge
from horovodlike.tensorflow.errors import raises_tf_errors
from horovodlike.tensorflow.mpi_ops import _broadcast


def _checked_variables(variables, what, root_rank, process_set):
    variables = list(variables)
    for i, variable in enumerate(variables):
        if not hasattr(variable, "assign"):
            raise TypeError(f"{what}: entry {i} is a {type(variable).__name__}, not a variable")
    if variables:
        # As in Horovod, no variables is a no-op that needs no hvd.init().
        numpy_ops.relative_root(root_rank, process_set, what)
    return variables


def _assign_from_root(variables, root_rank, process_set, what, base):
    """Broadcasts the variables' values as one group and assigns what arrives; returns the
    assign results (None for Keras variables assigned eagerly)."""
    names = [f"{base}.{i}" for i in range(len(variables))]
    values = [bridge.to_tensor(v, what, n) for v, n in zip(variables, names)]
    received = _broadcast(values, names, root_rank, process_set)
    return [v.assign(r) for v, r in zip(variables, received)]


@tf.autograph.experimental.do_not_convert
@raises_tf_errors
def broadcast_variables(variables, root_rank, process_set=global_process_set, inplace=False):
    """Overwrites every rank's ``variables`` with root_rank's values.

    Works eagerly (the variables are assigned when it returns) and inside tf.function (returns
    the grouped assign op). ``variables`` may hold tf.Variable or Keras variables, such as
    ``model.variables`` and ``optimizer.variables``. ``inplace`` is accepted for Horovod
    compatibility: the values travel through one host buffer either way.
    """
    variables = _checked_variables(variables, "broadcast_variables", root_rank, process_set)
    if not variables:
        return tf.group([]) if not tf.executing_eagerly() else None
    assigns = _assign_from_root(variables, root_rank, process_set, "broadcast_variables",
                                bridge.auto_name("broadcast_variables"))
    if tf.executing_eagerly():
        return None
    return tf.group(*[a for a in assigns if a is not None])


def broadcast_global_variables(root_rank, process_set=global_process_set):
    """TensorFlow 1: the op that overwrites every rank's global variables (the graph's
    ``tf.compat.v1.global_variables()`` collection) with root_rank's values. Eager code and
    tf.function have no such collection: RuntimeError, naming broadcast_variables."""
    graph = tf.compat.v1.get_default_graph()
    if tf.executing_eagerly() or getattr(graph, "building_function", False):
        raise RuntimeError("broadcast_global_variables() broadcasts a TensorFlow 1 graph's "
                           "global variables and works only while building one; eagerly or "
                           "inside tf.function, use hvd.broadcast_variables(model.variables, "
                           "root_rank) (or the Keras BroadcastGlobalVariablesCallback)")
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank, process_set)


@tf.autograph.experimental.do_not_convert
@raises_tf_errors
def broadcast_(variables, root_rank, name=None, process_set=global_process_set):
    """Broadcasts ``variables`` (a tf.Variable or Keras variable, or a list of them) from
    root_rank in place: every rank's variables take root_rank's values.

    Returns the variables' new values: a tensor for a single variable, else a list of tensors.
    Inside tf.function the returned tensors depend on the assignments, so using them (or
    returning them from the function) makes the assignments run. Not differentiable (it
    assigns). The variables must have the same dtype and shape on every rank.
    """
    single = hasattr(variables, "assign")
    variables = _checked_variables([variables] if single else variables, "broadcast_",
                                   root_rank, process_set)
    if not variables:
        return []
    base = name if name is not None else bridge.auto_name("broadcast_")
    numpy_ops.check_name(base, "broadcast_")
    assigns = _assign_from_root(variables, root_rank, process_set, "broadcast_", base)
    with tf.control_dependencies([a for a in assigns if a is not None and
                                  not tf.executing_eagerly()]):
        values = [tf.identity(tf.convert_to_tensor(v)) for v in variables]
    return values[0] if single else values


def _check_not_traced(what):
    # The objects move through the core directly and come back as Python objects, eagerly or
    # while a TensorFlow 1 graph is being built (where Horovod evaluates them in a session at
    # once); a traced tf.function cannot return a Python object computed when it runs.
    if not tf.executing_eagerly() and \
            getattr(tf.compat.v1.get_default_graph(), "building_function", False):
        raise ValueError(f"{what} returns a Python object, so it cannot run inside tf.function; "
                         "call it outside the function")


def broadcast_object(obj, root_rank=0, session=None, name=None, process_set=global_process_set):
    """Returns root_rank's ``obj`` (anything cloudpickle can serialize) on every rank.

    Works eagerly and in TensorFlow 1 graph mode; ``session`` is accepted for Horovod
    compatibility and not needed, as the object does not travel through the graph."""
    _check_not_traced("broadcast_object")
    return objects.broadcast_object(obj, root_rank, name, process_set)


def broadcast_object_fn(root_rank=0, session=None, name=None, process_set=global_process_set):
    """Returns a function ``fn(obj)`` that broadcasts ``obj`` from root_rank, as
    broadcast_object does (Horovod builds the graph for it once; here there is none to build)."""
    def broadcast_fn(obj):
        return broadcast_object(obj, root_rank, session, name, process_set)
    return broadcast_fn


def allgather_object(obj, session=None, name=None, process_set=global_process_set):
    """Returns the list of every rank's ``obj``, in rank order (eagerly and in TensorFlow 1
    graph mode; ``session`` is accepted and not needed)."""
    _check_not_traced("allgather_object")
    return objects.allgather_object(obj, name, process_set)
