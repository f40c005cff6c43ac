"""Train a small MLP on scikit-learn's digits with horovodlike.tensorflow and a custom training
loop (tf.function + DistributedGradientTape), the way a Horovod user would.

    horovodlikerun -np 2 python examples/tensorflow2_digits.py

--batch-size is per rank and --lr is for the global batch (batch size x ranks), so
`-np 2 --batch-size 16` takes the same steps as `-np 1 --batch-size 32`.
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

import horovodlike.tensorflow as hvd  # noqa: E402


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32, help="batch size per rank")
    parser.add_argument("--lr", type=float, default=0.05, help="learning rate for the global batch")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--save-weights", metavar="PATH",
                        help="rank 0 writes the final weights here (.npz)")
    return parser.parse_args()


def load_data():
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)  # pixels are 0..16
    y = digits.target.astype(np.int64)
    return train_test_split(x, y, test_size=0.2, random_state=0)


def rank_batches(n, batch_size, epoch, seed):
    """This rank's batches of one epoch: every rank shuffles alike, drops the incomplete last
    global batch, and takes every size-th sample from its rank on, so that the t-th batches of
    all ranks together are the t-th batch of one process with size x batch_size."""
    global_batch = batch_size * hvd.size()
    order = np.random.default_rng(seed + epoch).permutation(n)[:n // global_batch * global_batch]
    return order[hvd.rank()::hvd.size()].reshape(-1, batch_size)


def build_model():
    return keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"),
                             keras.layers.Dense(10)])


def main():
    args = parse_args()
    hvd.init()
    keras.utils.set_random_seed(args.seed)
    x_train, x_test, y_train, y_test = load_data()

    model = build_model()
    optimizer = keras.optimizers.SGD(learning_rate=args.lr, momentum=0.9)
    optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    # Everyone starts from rank 0's weights and optimizer state.
    hvd.broadcast_variables(model.variables, root_rank=0)
    hvd.broadcast_variables(optimizer.variables, root_rank=0)

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        # Gradients of each rank's mean loss, averaged over ranks: the global batch's gradient.
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    for epoch in range(1, args.epochs + 1):
        losses = [train_step(x_train[b], y_train[b])
                  for b in rank_batches(len(x_train), args.batch_size, epoch, args.seed)]
        # Equal batches on every rank: the average over ranks is the mean over global batches.
        loss = hvd.allreduce(tf.reduce_mean(losses), name="train_loss", op=hvd.Average)

        # Each rank scores every size-th test example; the summed counts cover the whole set.
        x, y = x_test[hvd.rank()::hvd.size()], y_test[hvd.rank()::hvd.size()]
        correct = np.sum(np.argmax(model(x, training=False), axis=1) == y)
        counts = hvd.allreduce(np.array([correct, len(y)], dtype=np.float64), name="test_counts",
                               op=hvd.Sum).numpy()
        if hvd.rank() == 0:
            print(f"epoch {epoch}: loss {float(loss):.4f} test accuracy "
                  f"{100 * counts[0] / counts[1]:.2f}%", flush=True)

    if hvd.rank() == 0 and args.save_weights:
        np.savez(args.save_weights, **{v.path.replace("/", "."): v.numpy()
                                       for v in model.weights})


if __name__ == "__main__":
    main()
