"""Elastic training for TensorFlow 2 and Keras 3, with Horovod's API: the training function,
decorated with ``hvd.elastic.run``, takes a ``hvd.elastic.TensorFlowKerasState(model,
optimizer, epoch=0, batch=0)`` and calls ``state.commit()`` after each batch it wants kept; the
job runs under ``horovodlikerun --min-np N --max-np M --host-discovery-script SCRIPT`` (see
horovodlike.torch.elastic for the same with PyTorch).
"""

import functools

import numpy as np
import tensorflow as tf

from horovodlike.common.basics import rank
from horovodlike.common.elastic import ObjectState as _ObjectState
from horovodlike.common.elastic import State, reset_runtime, run_fn
from horovodlike.common.exceptions import HorovodInternalError
from horovodlike.tensorflow.functions import broadcast_object, broadcast_variables
from horovodlike.tensorflow.keras_variables import optimizer_variables


def run(func):
    """Decorator for the training function: on a worker failure the state is restored to its
    last commit, the job re-formed without the failed worker and the function called again; on
    new hosts the job grows at the next commit.

    A failed peer met inside a tf.function (Keras' train step, for one) reaches Python as
    TensorFlow's error naming HorovodInternalError; it is handled as that error is eagerly.
    """

    @functools.wraps(func)
    def unwrap_graph_errors(state, *args, **kwargs):
        try:
            return func(state, *args, **kwargs)
        except tf.errors.OpError as e:
            if "HorovodInternalError" in (e.message or ""):
                raise HorovodInternalError(e.message) from e
            raise

    return run_fn(unwrap_graph_errors, reset_runtime)


def _copies(variables):
    return [np.array(v.numpy(), copy=True) for v in variables]


def _assign(variables, values):
    for variable, value in zip(variables, values):
        variable.assign(value)


class ObjectState(_ObjectState):
    """Python attributes kept by elastic training: ``ObjectState(epoch=0, batch=0)``."""

    def __init__(self, bcast_object=broadcast_object, get_rank=rank, **kwargs):
        super().__init__(bcast_object, get_rank, **kwargs)


class TensorFlowState(ObjectState):
    """A list of tf.Variable (or Keras variables) and plain attributes. TensorFlow 1's global
    variables and sessions do not exist in TensorFlow 2, so ``variables`` must be given;
    ``session`` is accepted for Horovod compatibility and must be None."""

    def __init__(self, variables=None, session=None, **kwargs):
        if variables is None:
            raise ValueError("TensorFlowState needs the variables to keep: TensorFlow 2 has no "
                             "global variables")
        if session is not None:
            raise ValueError("TensorFlowState: session is for TensorFlow 1 graphs, which "
                             "horovodlike does not support")
        self.variables = list(variables)
        self._saved_values = _copies(self.variables)
        super().__init__(**kwargs)

    def save(self):
        self._saved_values = _copies(self.variables)
        super().save()

    def restore(self):
        _assign(self.variables, self._saved_values)
        super().restore()

    def sync(self, root=None):
        root = self.sync_root() if root is None else root
        if self.variables:
            broadcast_variables(self.variables, root_rank=root)
        self._saved_values = _copies(self.variables)
        super().sync(root)


class TensorFlowKerasState(ObjectState):
    """A Keras 3 model, its optimizer (``optimizer`` or the model's compiled one) and plain
    attributes. commit() keeps a copy of every model and optimizer variable, restore() assigns
    them back, sync() gives every rank the values of the rank holding the latest commit.

    The model must be built. An optimizer not yet built is built here, for the model's trainable
    variables, so that its state exists from the first commit and has the same variables on
    every rank, including workers that join later. ``backend`` is accepted for Horovod
    compatibility and ignored.
    """

    def __init__(self, model, optimizer=None, backend=None, **kwargs):
        if not getattr(model, "built", True):
            raise ValueError("TensorFlowKerasState: the model must be built first; call "
                             "model.build(input_shape) or run it on a batch")
        self.model = model
        self.optimizer = optimizer if optimizer is not None else getattr(model, "optimizer",
                                                                         None)
        if self.optimizer is not None and not getattr(self.optimizer, "built", True):
            self.optimizer.build(model.trainable_variables)
        self._save_model()
        super().__init__(**kwargs)

    def _variables(self):
        variables = list(self.model.variables)
        if self.optimizer is not None:
            variables += optimizer_variables(self.optimizer)
        return variables

    def _save_model(self):
        self._saved_values = _copies(self._variables())

    def save(self):
        self._save_model()
        super().save()

    def restore(self):
        variables = self._variables()
        if len(variables) != len(self._saved_values):
            raise RuntimeError(f"TensorFlowKerasState: the model and optimizer have "
                               f"{len(variables)} variables, but {len(self._saved_values)} were "
                               "committed; variables must not be created after the state")
        _assign(variables, self._saved_values)
        super().restore()

    def sync(self, root=None):
        root = self.sync_root() if root is None else root
        broadcast_variables(self._variables(), root_rank=root)
        self._save_model()
        super().sync(root)


__all__ = ["run", "State", "ObjectState", "TensorFlowState", "TensorFlowKerasState"]
