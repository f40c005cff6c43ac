"""Elastic training with TensorFlow and Keras 3 under test: a Keras model trained by a
tf.function step with DistributedGradientTape, kept in TensorFlowKerasState; one worker kills
itself just after a commit. Step s always trains on the same global batch, split between however
many ranks there are, and each rank's loss is its share of the global batch's summed loss over
the global batch's size, so the summed gradients are the global mean's. Every committed step is
kept in the state (rolled-back steps vanish with it); rank 0 writes them and the final weights
for the test to replay."""

import json
import os
import signal
import sys

from tf_common import check

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

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
if hvd.rank() == 0:
    with open(report_path, "w") as f:
        json.dump({"steps": state.steps, "size": hvd.size(), "lr": LR, "momentum": MOMENTUM,
                   "global_batch": GLOBAL_BATCH,
                   "weights": [w.tolist() for w in model.get_weights()]}, f)
print(f"rank {hvd.rank()} of {hvd.size()}: elastic OK", flush=True)
