"""TensorFlow: every rank wraps its tape for a process set that leaves rank 1 out; the set's
members get the average of their gradients, rank 1 its own (as in Horovod). Expected values
from NumPy, per rank."""

import numpy as np
import tensorflow as tf

import horovodlike.tensorflow as hvd
from common import check

even = hvd.ProcessSet([0, 2])
hvd.init(process_sets=[even])
rank = hvd.rank()
rng = np.random.default_rng(3)
xs = [rng.standard_normal((6, 4)) for _ in range(hvd.size())]
w = tf.Variable(np.ones((4, 1)))


def gradient(x):  # d/dw of sum(x w)^2 at w = 1, by hand
    return 2.0 * x.T @ (x @ np.ones((4, 1)))


with tf.GradientTape() as tape:
    loss = tf.reduce_sum(tf.matmul(tf.constant(xs[rank]), w) ** 2)
tape = hvd.DistributedGradientTape(tape, process_set=even)
(got,) = tape.gradient(loss, [w])
expected = (np.mean([gradient(xs[r]) for r in (0, 2)], axis=0) if rank in (0, 2)
            else gradient(xs[rank]))
check(np.allclose(got.numpy(), expected, rtol=1e-12), f"rank {rank}: {got.numpy()} != {expected}")
hvd.barrier()
print(f"rank {rank}: TF OUTSIDER OK", flush=True)
hvd.shutdown()
