"""SyncBatchNormalization: Keras 3 batch normalization whose training statistics are those of the
global batch, every rank's samples together."""

import keras
import tensorflow as tf

from horovodlike.common import basics
from horovodlike.tensorflow.mpi_ops import Sum, allreduce


class SyncBatchNormalization(keras.layers.BatchNormalization):
    """Batch normalization over the global batch: in training, the mean and variance come from
    every rank's samples, so each rank normalizes exactly as one process holding the whole batch
    would, however unevenly the batch is split between ranks (a rank may even have none). The
    moving statistics are updated with the global values and so stay equal on every rank.

    Each training call allreduces, in one message, each rank's sample count, sum and sum of
    squares per channel; the allreduce has a gradient, so the gradients of the inputs, gamma and
    beta are those of the global batch's loss (each rank getting its share). Inference uses the
    moving statistics and communicates nothing. Every rank must call the layer the same number of
    times, in training or not alike.

    ``fused`` is accepted for Horovod compatibility and must be False (Keras 3 has no fused
    kernel). Keras' own ``synchronized`` argument (tf.distribute) has no effect here.
    """

    def __init__(self, fused=False, **kwargs):
        if fused in (True, None):
            raise ValueError("SyncBatchNormalization does not support fused=True")
        kwargs.pop("synchronized", None)
        super().__init__(**kwargs)

    def _moments(self, inputs, mask):
        if basics.size() == 1:
            return super()._moments(inputs, mask)
        axes = list(self._reduction_axes)
        if mask is None:
            count = tf.cast(tf.reduce_prod(tf.gather(tf.shape(inputs), axes)), inputs.dtype)
            total = tf.reduce_sum(inputs, axis=axes)
            squares = tf.reduce_sum(tf.square(inputs), axis=axes)
            count = tf.fill(tf.shape(total), count)
        else:
            weights = tf.cast(tf.broadcast_to(tf.expand_dims(mask, -1), tf.shape(inputs)),
                              "bool")
            masked = tf.where(weights, inputs, tf.zeros_like(inputs))
            count = tf.reduce_sum(tf.cast(weights, inputs.dtype), axis=axes)
            total = tf.reduce_sum(masked, axis=axes)
            squares = tf.reduce_sum(tf.square(masked), axis=axes)
        count, total, squares = tf.unstack(
            allreduce(tf.stack([count, total, squares]), op=Sum))
        if mask is not None:
            # As Keras does for masks, so that a channel without samples gives 0, not NaN.
            count = count + keras.backend.epsilon()
        mean = total / count
        # E[x^2] - E[x]^2 can come out a rounding error below zero.
        variance = tf.maximum(squares / count - tf.square(mean), 0.0)
        return mean, variance

    def get_config(self):
        config = super().get_config()
        config.pop("synchronized", None)
        return config
