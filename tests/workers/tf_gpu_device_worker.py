"""GPU device strings with TensorFlow: collectives under tf.device("/GPU:0") (eagerly and in
tf.function), Horovod's device_dense / device_sparse, and DistributedGradientTape give the same
values as without them. With tensorflow-cpu there is no GPU and soft placement puts the ops on
the host; on a GPU the collective node is placed on the host and TensorFlow copies across."""

from tf_common import check

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import horovodlike.tensorflow as hvd  # noqa: E402

tf.get_logger().setLevel("ERROR")
hvd.init()
rank, size = hvd.rank(), hvd.size()
x = tf.constant([1.0, 2.0, 3.0, 4.0]) * (rank + 1)
total = np.array([1.0, 2.0, 3.0, 4.0]) * size * (size + 1) / 2
mine = np.array([1.0, 2.0, 3.0, 4.0]) * (rank + 1)

for device in ("/GPU:0", "/device:GPU:0", "/gpu:0"):
    with tf.device(device):
        check(np.allclose(hvd.allreduce(x, op=hvd.Sum).numpy(), total), f"allreduce {device}")
        gathered = hvd.allgather(x).numpy()
        check(np.allclose(gathered[4 * rank:4 * rank + 4], mine), f"allgather {device}")
        check(np.allclose(hvd.broadcast(x, 0).numpy(), [1.0, 2.0, 3.0, 4.0]), f"bcast {device}")
    check(np.allclose(hvd.allreduce(x, op=hvd.Sum, device_dense=device,
                                    device_sparse=device).numpy(), total), f"device_dense {device}")


@tf.function
def in_graph(t):
    with tf.device("/GPU:0"):
        return hvd.allreduce(t, op=hvd.Sum, name="gpu.graph"), hvd.allgather(t, name="gpu.gather")


reduced, gathered = in_graph(x)
check(np.allclose(reduced.numpy(), total), "allreduce in tf.function under /GPU:0")
check(gathered.shape[0] == 4 * size, "allgather in tf.function under /GPU:0")

v = tf.Variable([3.0 * (rank + 1)])
with tf.GradientTape() as tape:
    with tf.device("/GPU:0"):
        loss = tf.reduce_sum(v * v)
tape = hvd.DistributedGradientTape(tape, device_dense="/gpu:0")
(grad,) = tape.gradient(loss, [v])
check(np.allclose(grad.numpy(), [3.0 * (size + 1)]), "DistributedGradientTape(device_dense=GPU)")
print(f"rank {rank}: tensorflow gpu device strings OK", flush=True)
