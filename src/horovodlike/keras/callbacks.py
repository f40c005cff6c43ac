"""Keras 3 callbacks for data-parallel training, with Horovod's names and arguments."""

import numpy as np
import keras

from horovodlike.common import basics, numpy_ops
from horovodlike.tensorflow.functions import broadcast_variables
from horovodlike.tensorflow.keras_variables import optimizer_variables


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Makes every rank start from root_rank's model and optimizer state.

    Keras 3 builds the model and the optimizer before training starts, so the broadcast happens
    in ``on_train_begin``, before the first step; state that only appears during the first step
    (an optimizer built lazily) is broadcast again after that step. ``local_variables`` (for
    model-parallel parts each rank owns) keep every rank's own values.
    """

    def __init__(self, root_rank, device="", local_variables=None):
        super().__init__()
        self.root_rank = root_rank
        self.device = device
        self.local_variables = list(local_variables or [])
        self.broadcast_done = False
        self._optimizer_pending = False

    def _shared(self, variables):
        local = {id(v) for v in self.local_variables}
        return [v for v in variables if id(v) not in local]

    def _broadcast(self):
        broadcast_variables(self._shared(self.model.variables), root_rank=self.root_rank)
        optimizer = getattr(self.model, "optimizer", None)
        variables = optimizer_variables(optimizer) if optimizer is not None else []
        if variables:
            broadcast_variables(self._shared(variables), root_rank=self.root_rank)
        return optimizer is not None and not getattr(optimizer, "built", True)

    def on_train_begin(self, logs=None):
        if self.broadcast_done:
            return
        self._optimizer_pending = self._broadcast()
        self.broadcast_done = True

    def on_train_batch_end(self, batch, logs=None):
        if self._optimizer_pending:
            self._optimizer_pending = self._broadcast()


class MetricAverageCallback(keras.callbacks.Callback):
    """Replaces every metric in the epoch's logs by its average over all ranks.

    Put it before callbacks that read the metrics (checkpoints, early stopping, TensorBoard), so
    that they see the averages.
    """

    def __init__(self, device=""):
        super().__init__()
        self.device = device

    def on_epoch_end(self, epoch, logs=None):
        if logs is None:
            return
        # Sorted, so that every rank reduces the same metric under the same name.
        keys = sorted(k for k, v in logs.items() if np.ndim(v) == 0)
        handles = [numpy_ops.allreduce_async(np.asarray([float(logs[k])], dtype=np.float64),
                                             f"MetricAverageCallback.{k}", numpy_ops.Average)
                   for k in keys]
        for key, value in zip(keys, numpy_ops.wait_all(handles)):
            logs[key] = float(value[0])


def _get_lr(optimizer):
    return float(keras.ops.convert_to_numpy(optimizer.learning_rate))


def _momentum_buffers(optimizer):
    """The optimizer's momentum buffers, which carry the learning rate of the steps that filled
    them (Keras' SGD and RMSprop keep lr * gradient in them)."""
    if not getattr(optimizer, "momentum", 0):
        return []
    for attribute in ("momentums", "_momentums"):
        buffers = getattr(optimizer, attribute, None)
        if buffers:
            return list(buffers)
    return []


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """Sets the learning rate to ``initial_lr * multiplier(epoch)`` from start_epoch up to
    end_epoch (excluded): at the start of each epoch with ``staircase=True``, or at every batch
    with a fractional epoch otherwise. A constant ``multiplier`` m means
    ``m ** (epoch - start_epoch)``, as in Horovod.

    With ``momentum_correction``, when the learning rate changes from old to new, the optimizer's
    momentum buffers are scaled by new / old (Goyal et al., 2017). Horovod scales the momentum
    coefficient for one step instead; Keras 3 optimizers compile the coefficient into the train
    step as a constant, and scaling the buffers has the same effect on the update.
    """

    def __init__(self, initial_lr, multiplier, start_epoch=0, end_epoch=None, staircase=True,
                 momentum_correction=True, steps_per_epoch=None):
        super().__init__()
        if initial_lr is None:
            raise ValueError("Parameter `initial_lr` is required")
        self.initial_lr = float(initial_lr)
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch = None
        if callable(multiplier):
            self.multiplier = multiplier
        else:
            self.multiplier = lambda epoch: multiplier ** (epoch - start_epoch)

    def _autodetect_steps_per_epoch(self):
        steps = (self.params or {}).get("steps")
        if steps:
            return steps
        raise ValueError(f"{type(self).__name__} could not find the number of steps per epoch in "
                         "model.fit's parameters; pass steps_per_epoch")

    def _adjust_learning_rate(self, epoch):
        optimizer = self.model.optimizer
        old_lr = _get_lr(optimizer)
        new_lr = self.initial_lr * self.multiplier(epoch)
        try:
            optimizer.learning_rate = new_lr
        except TypeError as e:
            raise ValueError(f"{type(self).__name__} sets the learning rate, so the optimizer "
                             "needs a float learning_rate, not a LearningRateSchedule") from e
        if self.momentum_correction and old_lr > 0 and new_lr != old_lr:
            ratio = new_lr / old_lr
            for buffer in _momentum_buffers(optimizer):
                buffer.assign(buffer * ratio)

    def on_train_begin(self, logs=None):
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = self._autodetect_steps_per_epoch()

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if self.current_epoch < self.start_epoch or \
                (self.end_epoch is not None and self.current_epoch >= self.end_epoch):
            return
        if self.staircase and batch == 0:
            self._adjust_learning_rate(self.current_epoch)
        elif not self.staircase:
            self._adjust_learning_rate(self.current_epoch + float(batch) / self.steps_per_epoch)

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["lr"] = _get_lr(self.model.optimizer)


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Ramps the learning rate from ``initial_lr / size`` up to ``initial_lr`` over the first
    ``warmup_epochs`` epochs, batch by batch (Goyal et al., 2017): large global batches diverge
    when they start at the full learning rate."""

    def __init__(self, initial_lr, warmup_epochs=5, momentum_correction=True, steps_per_epoch=None,
                 verbose=0):
        def multiplier(epoch):
            # Shifted by one step so that each epoch ends on a round value.
            epoch += 1.0 / self.steps_per_epoch
            size = basics.size()
            return 1.0 / size * (epoch * (size - 1) / warmup_epochs + 1)

        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs,
                         staircase=False, momentum_correction=momentum_correction,
                         steps_per_epoch=steps_per_epoch)
        self.warmup_epochs = warmup_epochs
        self.verbose = verbose

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        if epoch == self.end_epoch - 1 and self.verbose > 0 and basics.rank() == 0:
            print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to "
                  f"{_get_lr(self.model.optimizer):g}.")
