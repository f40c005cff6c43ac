"""Horovod's ``horovod.tensorflow.util`` helpers that its users and tests call."""

import tensorflow as tf


def _executing_eagerly():
    """True outside graphs and tf.function traces."""
    return tf.executing_eagerly()
