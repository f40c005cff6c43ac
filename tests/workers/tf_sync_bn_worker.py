"""SyncBatchNormalization against Keras' BatchNormalization run in one process on the global batch
(every rank has different data, and a different number of samples), eagerly and inside
tf.function; then broadcast_ and horovodlike.keras.broadcast_global_variables against values set
differently on every rank."""

from tf_common import check, expect

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import horovodlike.keras as hvd_keras  # noqa: E402
import horovodlike.tensorflow as hvd  # noqa: E402

tf.get_logger().setLevel("ERROR")
hvd.init()
rank, size = hvd.rank(), hvd.size()
assert size >= 2, "run with at least 2 ranks"
TOL = dict(rtol=1e-9, atol=1e-10)

# Uneven batches; in the second case the last rank has no samples at all.
BATCH_SIZES = {"uneven": [3, 6, 2, 5][:size], "one rank empty": [4, 3, 5, 2][:size - 1] + [0]}


def close(a, b):
    return np.allclose(np.asarray(a), np.asarray(b), **TOL)


def make_layer(cls, feature_shape, axis, seed):
    """A layer in float64 with non-trivial weights and moving statistics, equal on every rank."""
    layer = cls(axis=axis, momentum=0.7, epsilon=1e-3, dtype="float64")
    layer.build((None, *feature_shape))
    rng = np.random.default_rng(seed)
    layer.set_weights([rng.normal(size=w.shape) if i != 3 else rng.uniform(0.5, 2, w.shape)
                       for i, w in enumerate(layer.get_weights())])
    return layer


def step(layer, x, weights):
    """Output, gradients of sum(output * weights) for the input, gamma and beta."""
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = layer(x, training=True)
        loss = tf.reduce_sum(y * weights)
    dx, dgamma, dbeta = tape.gradient(loss, [x, layer.gamma, layer.beta])
    return y, dx, dgamma, dbeta


def check_sync_bn(label, sizes, feature_shape, axis, graph):
    rng = np.random.default_rng([len(sizes), len(feature_shape), axis % 3])
    x_global = rng.normal(2.0, 3.0, size=(sum(sizes), *feature_shape))
    w_global = rng.normal(size=x_global.shape)
    start = sum(sizes[:rank])
    mine = slice(start, start + sizes[rank])
    x, w = tf.constant(x_global[mine]), tf.constant(w_global[mine])
    what = f"{label}, features {feature_shape}, axis {axis}, {'graph' if graph else 'eager'}"

    reference = make_layer(keras.layers.BatchNormalization, feature_shape, axis, seed=9)
    ref_y, ref_dx, ref_dgamma, ref_dbeta = step(reference, tf.constant(x_global),
                                                tf.constant(w_global))

    layer = make_layer(hvd.SyncBatchNormalization, feature_shape, axis, seed=9)
    run = tf.function(step, reduce_retracing=True) if graph else step
    for _ in range(2):  # the second call checks the moving statistics after two updates
        y, dx, dgamma, dbeta = run(layer, x, w)
        if _ == 0:
            check(close(y, ref_y.numpy()[mine]), f"SyncBatchNormalization output ({what})")
            check(close(dx, ref_dx.numpy()[mine]), f"input gradient ({what})")
            # Each rank's gamma and beta gradients are its share of the global batch's.
            check(close(hvd.allreduce(dgamma, op=hvd.Sum), ref_dgamma),
                  f"summed gamma gradient ({what})")
            check(close(hvd.allreduce(dbeta, op=hvd.Sum), ref_dbeta),
                  f"summed beta gradient ({what})")
    step(reference, tf.constant(x_global), tf.constant(w_global))
    check(close(layer.moving_mean, reference.moving_mean), f"moving mean ({what})")
    check(close(layer.moving_variance, reference.moving_variance), f"moving variance ({what})")
    if sizes[rank]:
        check(close(layer(x, training=False), reference(x, training=False)),
              f"inference output ({what})")


for graph in (False, True):
    for label, sizes in BATCH_SIZES.items():
        check_sync_bn(label, sizes, (3,), -1, graph)
    check_sync_bn("uneven", BATCH_SIZES["uneven"], (4, 2), -1, graph)
    check_sync_bn("uneven", BATCH_SIZES["uneven"], (2, 5), 1, graph)

# An ordinary Keras layer: trained with model.fit, every rank ends with the same weights and
# moving statistics, and its config round-trips.
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((3,)), hvd.SyncBatchNormalization(dtype="float64"),
                          keras.layers.Dense(1, dtype="float64")])
model.compile(optimizer=hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
data_rng = np.random.default_rng(rank)
model.fit(data_rng.normal(size=(8, 3)), data_rng.normal(size=(8, 1)), batch_size=4, epochs=1,
          verbose=0)
flat = np.concatenate([v.ravel() for v in model.get_weights()])
everyone = hvd.allgather(flat[None]).numpy()
check(all(np.array_equal(everyone[0], everyone[r]) for r in range(size)),
      "SyncBatchNormalization in model.fit: ranks' weights or moving statistics differ")
config = model.layers[0].get_config()
check(type(model.layers[0]).from_config(config).get_config() == config,
      "SyncBatchNormalization config does not round-trip")
expect(ValueError, lambda: hvd.SyncBatchNormalization(fused=True), "fused")

# ---- broadcast_: in place, from a root other than 0, eagerly and inside tf.function
root = size - 1


def rank_values(r, shape, dtype):
    return (np.arange(np.prod(shape)).reshape(shape) * (r + 1) + 10 * r).astype(dtype)


shapes = [((2, 3), "float32"), ((4,), "int64"), ((), "float64")]
variables = [tf.Variable(rank_values(rank, s, d)) for s, d in shapes]
returned = hvd.broadcast_(variables, root_rank=root, name="inplace")
for v, r, (s, d) in zip(variables, returned, shapes):
    check(np.array_equal(v.numpy(), rank_values(root, s, d)), "broadcast_ did not assign")
    check(np.array_equal(r.numpy(), rank_values(root, s, d)), "broadcast_ returned a wrong value")

single = tf.Variable(rank_values(rank, (3,), "float32"))
check(np.array_equal(hvd.broadcast_(single, 0).numpy(), rank_values(0, (3,), "float32")) and
      np.array_equal(single.numpy(), rank_values(0, (3,), "float32")),
      "broadcast_ of one variable")

in_graph = [tf.Variable(rank_values(rank + 5, s, d)) for s, d in shapes]


@tf.function
def broadcast_in_graph():
    return hvd.broadcast_(in_graph, root_rank=root)


returned = broadcast_in_graph()
for v, r, (s, d) in zip(in_graph, returned, shapes):
    expected = rank_values(root + 5, s, d)
    check(np.array_equal(v.numpy(), expected) and np.array_equal(r.numpy(), expected),
          "broadcast_ inside tf.function")
keras_variable = keras.Variable(rank_values(rank, (2, 2), "float32"))
hvd.broadcast_([keras_variable], root_rank=root)
check(np.array_equal(keras_variable.numpy(), rank_values(root, (2, 2), "float32")),
      "broadcast_ of a Keras variable")
expect(TypeError, lambda: hvd.broadcast_([tf.constant(1.0)], 0), "not a variable")
expect(ValueError, lambda: hvd.broadcast_(variables, size), "root")

# ---- horovodlike.keras.broadcast_global_variables: a model and its optimizer
keras.utils.set_random_seed(rank)  # different initial weights on every rank
net = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
net.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
net.optimizer.build(net.trainable_variables)
for v in net.optimizer.variables:
    v.assign(np.full(v.shape, rank + 1, dtype=v.dtype))
weights = [v.numpy() for v in net.variables] + [v.numpy() for v in net.optimizer.variables]
everyone = hvd.allgather_object(weights, name="weights.before")
hvd_keras.broadcast_global_variables(root, net)
after = [v.numpy() for v in net.variables] + [v.numpy() for v in net.optimizer.variables]
check(len(after) == len(everyone[root]) and
      all(np.array_equal(a, b) for a, b in zip(after, everyone[root])),
      "broadcast_global_variables did not give every rank root's model and optimizer")
check(rank == root or not all(np.array_equal(a, b) for a, b in zip(after, weights)),
      "test inputs were equal before the broadcast")
expect(RuntimeError, lambda: hvd_keras.broadcast_global_variables(0), "model")

print(f"rank {rank}: sync batch norm and broadcasts OK", flush=True)
