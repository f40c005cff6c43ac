"""Local gradient aggregation for ``backward_passes_per_step`` > 1: gradients are summed on each
rank over that many backward passes, and only then reduced over the ranks and applied.

The sums live in plain tf.Variables outside the optimizer's Keras state, so a checkpoint of a
DistributedOptimizer loads into an unwrapped optimizer and back. ``counter`` (the passes summed
since the last reduction) is public as in Horovod, whose optimizer exposes it as
``optimizer._agg_helper.counter``.
"""

import tensorflow as tf


class GradientAggregation:
    def __init__(self, backward_passes_per_step, average_aggregated_gradients):
        self.backward_passes_per_step = int(backward_passes_per_step)
        self.average_aggregated_gradients = bool(average_aggregated_gradients)
        with tf.init_scope():
            self.counter = tf.Variable(0, dtype=tf.int64, trainable=False,
                                       name="hvd_aggregation_counter")
        self._sums = {}  # id(variable) -> tf.Variable holding its summed gradient

    def _sum_for(self, variable):
        key = id(variable)
        if key not in self._sums:
            # Made outside any tf.function being traced: its value outlives the trace.
            with tf.init_scope():
                self._sums[key] = tf.Variable(tf.zeros(variable.shape, dtype=variable.dtype),
                                              trainable=False, name="hvd_aggregated_gradient")
        return self._sums[key]

    def add(self, grads, variables):
        """Adds one pass's gradients (None entries are skipped; tf.IndexedSlices are summed
        densely) and counts it. Returns (the count after it, the sums, None where the gradient
        is None)."""
        sums = []
        for grad, variable in zip(grads, variables):
            if grad is None:
                sums.append(None)
                continue
            total = self._sum_for(variable)
            total.assign_add(tf.cast(tf.convert_to_tensor(grad), total.dtype))
            sums.append(total)
        count = self.counter.assign_add(1)
        return count, sums

    def is_complete(self, count):
        return count >= self.backward_passes_per_step

    def values(self, sums):
        """The summed gradients to reduce: divided by the number of passes when
        average_aggregated_gradients is set."""
        out = []
        for total in sums:
            if total is None:
                out.append(None)
                continue
            value = tf.identity(total.read_value())
            if self.average_aggregated_gradients:
                value = value / tf.cast(self.backward_passes_per_step, value.dtype)
            out.append(value)
        return out

    def clear(self, sums):
        for total in sums:
            if total is not None:
                total.assign(tf.zeros_like(total))
        self.counter.assign(0)
