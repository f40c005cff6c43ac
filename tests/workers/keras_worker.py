"""Keras 3 model.fit with horovodlike.keras: DistributedOptimizer against a single-process
replica on the global batch (dense and embedding models, gradient aggregation), the callbacks
(broadcast, metric averaging, warm-up and schedule with momentum correction) and load_model."""

import os
import sys

from reference import expected_adasum
from tf_common import check, expect

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import horovodlike.keras as hvd  # noqa: E402
import horovodlike.tensorflow.keras as hvd_tf_keras  # noqa: E402

tf.get_logger().setLevel("ERROR")
hvd.init()
rank, size = hvd.rank(), hvd.size()
work_dir = sys.argv[1]
check(hvd_tf_keras.DistributedOptimizer is hvd.DistributedOptimizer and
      hvd_tf_keras.callbacks.MetricAverageCallback is hvd.callbacks.MetricAverageCallback,
      "horovodlike.tensorflow.keras is not horovodlike.keras")

PER_RANK, BATCHES = 4, 6
rng = np.random.default_rng(5)
X = rng.normal(size=(PER_RANK * size * BATCHES, 8)).astype(np.float32)
Y = rng.integers(0, 3, len(X))
IDS = rng.integers(0, 20, (len(X), 3))
mine = slice(rank, None, size)  # rank r's t-th batch + the others' = the t-th global batch


def dense_model(seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="tanh"),
                             keras.layers.Dense(3)])


def embedding_model(seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((3,), dtype="int32"), keras.layers.Embedding(20, 4),
                             keras.layers.Flatten(), keras.layers.Dense(3)])


LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def fit(model, optimizer, x, y, batch_size, epochs=2, callbacks=()):
    model.compile(optimizer=optimizer, loss=LOSS)
    return model.fit(x, y, batch_size=batch_size, epochs=epochs, shuffle=False, verbose=0,
                     callbacks=list(callbacks))


def same_weights(a, b, tol):
    return all(np.allclose(u, v, rtol=tol, atol=tol) for u, v in zip(a.get_weights(),
                                                                      b.get_weights()))


def everyone_equal(model, tag):
    flat = np.concatenate([w.ravel() for w in model.get_weights()])
    everyone = hvd.allgather(flat[None], name=f"weights.{tag}").numpy()
    return all(np.array_equal(everyone[0], everyone[r]) for r in range(size))


# ---- DistributedOptimizer equals one process on the global batch
cases = [
    ("sgd", dense_model, lambda: keras.optimizers.SGD(0.1, momentum=0.9), {}, 1, 1.0),
    ("adam", dense_model, lambda: keras.optimizers.Adam(0.01), {}, 1, 1.0),
    ("clipnorm", dense_model, lambda: keras.optimizers.SGD(0.1, clipnorm=0.05), {}, 1, 1.0),
    ("embedding", embedding_model, lambda: keras.optimizers.Adam(0.01), {}, 1, 1.0),
    ("embedding+sparse_as_dense", embedding_model, lambda: keras.optimizers.SGD(0.1),
     dict(sparse_as_dense=True), 1, 1.0),
    ("2 passes averaged", dense_model, lambda: keras.optimizers.SGD(0.1, momentum=0.9),
     dict(backward_passes_per_step=2, average_aggregated_gradients=True), 2, 1.0),
    ("2 passes summed", dense_model, lambda: keras.optimizers.SGD(0.1),
     dict(backward_passes_per_step=2), 2, 2.0),
]
for label, make, make_optimizer, options, passes, lr_factor in cases:
    x = IDS if make is embedding_model else X
    model = make(seed=11)
    distributed = hvd.DistributedOptimizer(make_optimizer(), **options)
    history = fit(model, distributed, x[mine], Y[mine], PER_RANK)
    reference_optimizer = make_optimizer()
    reference_optimizer.learning_rate = float(reference_optimizer.learning_rate) * lr_factor
    reference = make(seed=11)
    # With gradient aggregation, one replica step covers `passes` batches of every rank.
    fit(reference, reference_optimizer, x, Y, PER_RANK * size * passes)
    diff = max(np.abs(u - v).max() for u, v in zip(model.get_weights(), reference.get_weights()))
    check(same_weights(model, reference, 1e-5),
          f"{label}: weights differ from the single-process run by {diff}")
    check(everyone_equal(model, label.replace(" ", "_")), f"{label}: ranks diverged")
    check(int(model.optimizer.iterations.numpy()) == 2 * BATCHES,
          f"{label}: {int(model.optimizer.iterations.numpy())} iterations")

# ---- op=Adasum: one SGD step applies the Adasum of the ranks' gradients (a power-of-two job)
if size > 1 and size & (size - 1) == 0:
    model = dense_model(seed=11)
    fit(model, hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), op=hvd.Adasum),
        X[mine][:PER_RANK], Y[mine][:PER_RANK], PER_RANK, epochs=1)
    start = dense_model(seed=11)
    per_rank = []
    for r in range(size):
        x, y = X[r::size][:PER_RANK], Y[r::size][:PER_RANK]
        with tf.GradientTape() as tape:
            loss = LOSS(y, start(x, training=True))
        per_rank.append([g.numpy().ravel().astype(np.float64)
                         for g in tape.gradient(loss, start.trainable_variables)])
    for i, (got, w0) in enumerate(zip(model.get_weights(), start.get_weights())):
        want = w0 - 0.1 * expected_adasum([g[i] for g in per_rank], np.float32).reshape(w0.shape)
        check(np.allclose(got, want, rtol=1e-5, atol=1e-6),
              f"Adasum step: weight {i} differs by {np.abs(got - want).max()}")
    check(everyone_equal(model, "adasum"), "Adasum: ranks diverged")

# ---- callbacks: different initial weights are broadcast; metrics are averaged
local_logs = []


class RecordLogs(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        local_logs.append(dict(logs))


model = dense_model(seed=100 + rank)  # different on every rank: the broadcast makes them equal
history = fit(model, hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9)),
              X[mine], Y[mine], PER_RANK,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), RecordLogs(),
                         hvd.callbacks.MetricAverageCallback()])
reference = dense_model(seed=100)
reference_history = fit(reference, keras.optimizers.SGD(0.1, momentum=0.9), X, Y,
                        PER_RANK * size)
check(same_weights(model, reference, 1e-5), "BroadcastGlobalVariablesCallback: not rank 0's run")
check(np.allclose(history.history["loss"], reference_history.history["loss"], rtol=1e-5),
      f"averaged loss {history.history['loss']} != {reference_history.history['loss']}")
own = hvd.allgather_object([logs["loss"] for logs in local_logs])
check(any(own[r] != own[0] for r in range(size)),
      "every rank had the same loss before averaging: the averaging proved nothing")

# ---- learning-rate warm-up and schedule, as seen by the optimizer at each batch
seen = []


class RecordLearningRate(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        optimizer = self.model.optimizer
        # Keras builds the optimizer (and its momentum buffers) in the first step.
        buffers = getattr(optimizer, "momentums", None)
        momentum = buffers[0].numpy().copy() if buffers else None
        seen.append((self.epoch, batch, float(optimizer.learning_rate.numpy()), momentum))

    def on_epoch_end(self, epoch, logs=None):
        optimizer = self.model.optimizer
        seen.append((epoch, "end", float(optimizer.learning_rate.numpy()),
                     optimizer.momentums[0].numpy().copy()))


model = dense_model(seed=11)
fit(model, hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9)), X[mine], Y[mine],
    PER_RANK, epochs=3, callbacks=[hvd.callbacks.LearningRateWarmupCallback(0.1, warmup_epochs=2),
                                   RecordLearningRate()])
for epoch, batch, lr, _ in seen:
    if batch == "end" or epoch >= 2:
        continue
    progress = epoch + (batch + 1) / BATCHES
    want = 0.1 / size * (progress * (size - 1) / 2 + 1)
    check(np.isclose(lr, want), f"warm-up epoch {epoch} batch {batch}: lr {lr}, want {want}")
check(np.isclose(seen[-1][2], 0.1), f"after warm-up the lr is {seen[-1][2]}, not 0.1")

seen.clear()
model = dense_model(seed=11)
fit(model, hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9)), X[mine], Y[mine],
    PER_RANK, epochs=3,
    callbacks=[hvd.callbacks.LearningRateScheduleCallback(0.1, multiplier=0.5, start_epoch=1),
               RecordLearningRate()])
for epoch, batch, lr, _ in seen:
    # As in Horovod, a constant multiplier counts from start_epoch.
    want = 0.1 * 0.5 ** (epoch - 1) if epoch >= 1 else 0.1
    check(np.isclose(lr, want), f"schedule epoch {epoch} batch {batch}: lr {lr}, want {want}")
# Momentum correction: when the lr halves, the momentum buffers (which hold lr * gradients)
# halve with it before the next step.
end_of_first = next(m for e, b, _, m in seen if e == 1 and b == "end")
start_of_second = next(m for e, b, _, m in seen if e == 2 and b == 0)
check(np.allclose(start_of_second, 0.5 * end_of_first) and np.abs(end_of_first).max() > 0,
      "momentum buffers were not scaled with the learning rate")

# ---- load_model: the optimizer comes back distributed, with its state
model = dense_model(seed=11)
fit(model, hvd.DistributedOptimizer(keras.optimizers.Adam(0.01)), X[mine], Y[mine], PER_RANK,
    epochs=1)
path = os.path.join(work_dir, f"model.rank{rank}.keras")
model.save(path)
plain = keras.models.load_model(path)  # loads without horovodlike: the original class is saved
check(type(plain.optimizer).__name__ == "Adam" and not hasattr(plain.optimizer, "_hvd_options"),
      f"saved optimizer loads as {type(plain.optimizer)}")
loaded = hvd.load_model(path)
check(hasattr(loaded.optimizer, "_hvd_options") and isinstance(loaded.optimizer,
                                                               keras.optimizers.Adam),
      "load_model did not return a DistributedOptimizer")
check(int(loaded.optimizer.iterations.numpy()) == BATCHES, "load_model lost the optimizer state")
loaded.fit(X[mine], Y[mine], batch_size=PER_RANK, epochs=1, shuffle=False, verbose=0)
check(everyone_equal(loaded, "loaded"), "ranks diverged after load_model")

# ---- bad use
expect(TypeError, lambda: hvd.DistributedOptimizer(object()), "Keras 3 optimizer")
expect(ValueError, lambda: hvd.DistributedOptimizer(keras.optimizers.SGD(),
                                                    backward_passes_per_step=0), ">= 1")
expect(ValueError, lambda: hvd.DistributedOptimizer(loaded.optimizer), "already")
expect(ValueError, lambda: hvd.callbacks.LearningRateScheduleCallback(None, 0.5), "initial_lr")
print(f"rank {rank}: keras OK", flush=True)
