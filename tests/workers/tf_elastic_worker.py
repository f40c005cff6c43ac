"""Elastic training with TensorFlow and Keras 3 under test: a Keras model trained by a
tf.function step with DistributedGradientTape, kept in TensorFlowKerasState; one worker kills
itself just after a commit. Step s always trains on the same global batch, split between however
many ranks there are, and each rank's loss is its share of the global batch's summed loss over
the global batch's size, so the summed gradients are the global mean's. Every committed step is
kept in the state (rolled-back steps vanish with it); rank 0 writes them and the final weights
for the test to replay. Then the survivors train with model.fit, KerasState and its callbacks."""

import json
import os
import signal
import sys

from tf_common import check

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import horovodlike.keras as hvd_keras  # noqa: E402
import horovodlike.tensorflow as hvd  # noqa: E402

report_path, scenario = sys.argv[1], sys.argv[2]
N, FEATURES, CLASSES, GLOBAL_BATCH, STEPS, COMMIT_EVERY, LR, MOMENTUM = \
    60, 5, 3, 6, 12, 2, 0.25, 0.875  # exact in float32, as Keras keeps them

tf.get_logger().setLevel("ERROR")
hvd.init()
rng = np.random.default_rng(0)
X = rng.normal(size=(N, FEATURES))
Y = rng.integers(0, CLASSES, N)
initial = np.random.default_rng(1)
model = keras.Sequential([keras.Input((FEATURES,), dtype="float64"),
                          keras.layers.Dense(CLASSES, dtype="float64")])
model.set_weights([initial.normal(size=(FEATURES, CLASSES)), initial.normal(size=CLASSES)])
optimizer = keras.optimizers.SGD(LR, momentum=MOMENTUM)
state = hvd.elastic.TensorFlowKerasState(model, optimizer, step=0, steps=[])
check(len(optimizer.variables) > 1, "the state did not build the optimizer")
worker = os.environ["HOROVOD_ELASTIC_WORKER_ID"]
LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum",
                                                  dtype="float64")


def global_batch(step):
    return (np.arange(GLOBAL_BATCH) + step * GLOBAL_BATCH) % N


@tf.function
def train_step(x, y):
    with tf.GradientTape() as tape:
        loss = LOSS(y, model(x)) / GLOBAL_BATCH
    tape = hvd.DistributedGradientTape(tape, op=hvd.Sum)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))


@hvd.elastic.run
def train(state):
    while state.step < STEPS:
        mine = np.array_split(global_batch(state.step), hvd.size())[hvd.rank()]
        train_step(X[mine], Y[mine])
        state.steps.append(hvd.allgather_object(mine.tolist(), name="log.indices"))
        state.step += 1
        if scenario == "kill" and worker == "localhost/2" and state.step == 5:
            os.kill(os.getpid(), signal.SIGKILL)  # just after the commit at step 4
        if state.step % COMMIT_EVERY == 0:
            state.commit()


train(state)

# model.fit with KerasState and the state callbacks, in the re-formed job: commits every two
# batches and at each epoch's end, the epoch and batch counters, equal weights everywhere.
keras.utils.set_random_seed(3)
fitted = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(CLASSES)])
fitted.compile(optimizer=hvd_keras.DistributedOptimizer(keras.optimizers.Adam(0.01)),
               loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
keras_state = hvd_keras.elastic.KerasState(fitted, epoch=0, batch=0)
check(keras_state.optimizer is fitted.optimizer and fitted.optimizer.built,
      "KerasState did not take and build the compiled optimizer")
commits = []
keras_state.register_reset_callbacks([lambda: commits.append("reset")])
plain_commit = keras_state.commit
keras_state.commit = lambda: (commits.append(keras_state.batch), plain_commit())


@hvd_keras.elastic.run
def fit(state, epochs):
    fitted.fit(X[hvd.rank()::hvd.size()][:12], Y[hvd.rank()::hvd.size()][:12], batch_size=4,
               epochs=epochs - state.epoch, shuffle=False, verbose=0,
               callbacks=[hvd_keras.elastic.UpdateEpochStateCallback(state),
                          hvd_keras.elastic.UpdateBatchStateCallback(state),
                          hvd_keras.elastic.CommitStateCallback(state, batches_per_commit=2)])


fit(keras_state, 2)
# A commit after every second batch, counted across epochs, and one at each epoch's end (after
# the batch counter went back to 0); three batches an epoch.
expected, batches = [], 0
for _ in range(2):
    for batch in range(3):
        batches += 1
        if batches % 2 == 0:
            expected.append(batch)
    expected.append(0)
check(commits == expected and keras_state.epoch == 2 and keras_state.batch == 0,
      f"Keras elastic callbacks: commits {commits}, epoch {keras_state.epoch}")
flat = np.concatenate([w.ravel() for w in fitted.get_weights()])
everyone = hvd.allgather(flat[None].astype(np.float64), name="fitted.weights").numpy()
check(all(np.array_equal(everyone[0], row) for row in everyone), "fit weights differ")

if hvd.rank() == 0:
    with open(report_path, "w") as f:
        json.dump({"steps": state.steps, "size": hvd.size(), "lr": LR, "momentum": MOMENTUM,
                   "global_batch": GLOBAL_BATCH,
                   "weights": [w.tolist() for w in model.get_weights()]}, f)
print(f"rank {hvd.rank()} of {hvd.size()}: elastic OK", flush=True)
