"""Horovod's Keras gradient step and local (model-parallel) variables, against NumPy:
DistributedOptimizer._compute_gradients + apply_gradients with backward_passes_per_step and
register_local_var, eagerly and in tf.function; PartialDistributedOptimizer and
PartialDistributedGradientTape with local layers; BroadcastGlobalVariablesCallback with
local_variables."""

from tf_common import check

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import horovodlike.keras as hvd  # noqa: E402
import horovodlike.tensorflow as hvd_tf  # noqa: E402

tf.get_logger().setLevel("ERROR")
hvd.init()
rank, size = hvd.rank(), hvd.size()


def coefficients(r, step):
    """Rank r's loss at pass `step` is sum(c * w) + sum(d * u): its gradients are c and d."""
    c = np.array([r + 1.0, 2.0 * step - r], dtype=np.float32)
    d = np.array([3.0 * r - step, 0.5 * (r + step)], dtype=np.float32)
    return c, d


# ---- _compute_gradients + apply_gradients, 2 passes per step, u local to each rank
PASSES, STEPS = 2, 4
w = tf.Variable([1.0, -1.0])
u = tf.Variable([0.5, 2.0])
opt = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), backward_passes_per_step=PASSES)
opt.register_local_var(u)


def one_pass(step):
    c, d = coefficients(rank, step)
    grads_and_vars = opt._compute_gradients(
        lambda: tf.reduce_sum(c * w) + tf.reduce_sum(d * u), var_list=[w, u])
    opt.apply_gradients(grads_and_vars)
    return [g for g, _ in grads_and_vars]


in_graph = tf.function(one_pass)
want_w, want_u = np.array([1.0, -1.0]), np.array([0.5, 2.0])
local_c, local_d = np.zeros(2), np.zeros(2)
for step in range(1, STEPS + 1):
    grads = one_pass(step) if step <= PASSES else in_graph(step)
    local_c += coefficients(rank, step)[0]
    local_d += coefficients(rank, step)[1]
    if step % PASSES:
        # Between reductions Horovod returns the local sums so far, and applies nothing.
        check(np.allclose(grads[0], local_c) and np.allclose(grads[1], local_d),
              f"pass {step}: returned {grads}, want local sums {local_c}, {local_d}")
    else:
        window = [sum(coefficients(r, s)[0] for s in range(step - PASSES + 1, step + 1))
                  for r in range(size)]
        want_w -= np.mean(window, axis=0)
        want_u -= local_d / size  # a local gradient is divided by the number of ranks
        local_c, local_d = np.zeros(2), np.zeros(2)
    check(np.allclose(w.numpy(), want_w) and np.allclose(u.numpy(), want_u),
          f"after pass {step}: w {w.numpy()} u {u.numpy()}, want {want_w} {want_u}")
    check(int(opt.iterations.numpy()) == step, f"iterations {opt.iterations.numpy()} != {step}")
    check(int(opt._agg_helper.counter.numpy()) == step % PASSES, "aggregation counter wrong")

# ---- local layers: their gradients stay on the rank (divided by size), the others averaged
keras.utils.set_random_seed(3)
x = np.random.default_rng(rank).normal(size=(4, 3)).astype(np.float32)
model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"),
                          keras.layers.Dense(2)])
local_ids = {id(v) for v in model.layers[0].trainable_weights}


def loss_of(model):
    return tf.reduce_sum(model(x) ** 2)


with tf.GradientTape(persistent=True) as tape:
    loss = loss_of(model)
own = [g.numpy() for g in tape.gradient(loss, model.trainable_weights)]
everyone = [hvd.allgather(g[None], name=f"own.{i}").numpy() for i, g in enumerate(own)]


def check_partial(label, grads):
    for variable, got, mine, all_ranks in zip(model.trainable_weights, grads, own, everyone):
        want = mine / size if id(variable) in local_ids else all_ranks.mean(axis=0)
        check(np.allclose(np.asarray(got), want, atol=1e-6),
              f"{label}: gradient of {variable.path} wrong on rank {rank}")


partial = hvd.PartialDistributedOptimizer(keras.optimizers.Adam(),
                                          local_layers=model.layers[0])
check_partial("PartialDistributedOptimizer", [
    g for g, _ in partial._compute_gradients(loss, model.trainable_weights, tape=tape)])
with tf.GradientTape() as plain_tape:
    loss = loss_of(model)
partial_tape = hvd_tf.PartialDistributedGradientTape(plain_tape, local_layers=[model.layers[0]])
check_partial("PartialDistributedGradientTape",
              partial_tape.gradient(loss, model.trainable_weights))

# ---- BroadcastGlobalVariablesCallback keeps local_variables as they are on each rank
root = size - 1
constant = keras.initializers.Constant(float(rank))
frozen = keras.Sequential([keras.Input((3,))] + [
    keras.layers.Dense(3, kernel_initializer=constant, bias_initializer=constant,
                       trainable=False) for _ in range(3)])
frozen.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
keep = list(frozen.layers[0].variables)
frozen.fit(x, np.zeros((4, 3), np.float32), epochs=1, verbose=0, callbacks=[
    hvd.callbacks.BroadcastGlobalVariablesCallback(root, local_variables=keep)])
for variable in frozen.variables:
    want = rank if any(variable is k for k in keep) else root
    check(np.all(keras.ops.convert_to_numpy(variable) == want),
          f"{variable.path} is {keras.ops.convert_to_numpy(variable)}, want {want}")
print(f"rank {rank}: keras local OK", flush=True)
