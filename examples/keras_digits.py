"""Train a small MLP on scikit-learn's digits with Keras 3's model.fit and horovodlike.keras,
the way a Horovod user would.

    horovodlikerun -np 2 python examples/keras_digits.py --checkpoint-dir /tmp/digits

--batch-size is per rank and --lr is for the global batch (batch size x ranks), so
`-np 2 --batch-size 16` takes the same steps as `-np 1 --batch-size 32` (without warm-up, whose
ramp depends on the number of ranks).
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

import horovodlike.keras as hvd  # noqa: E402


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32, help="batch size per rank")
    parser.add_argument("--lr", type=float, default=0.05, help="learning rate for the global batch")
    parser.add_argument("--warmup-epochs", type=int, default=2,
                        help="epochs of learning-rate warm-up from lr / ranks (0: none)")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--checkpoint-dir", help="rank 0 saves the model here after each epoch")
    parser.add_argument("--save-weights", metavar="PATH",
                        help="rank 0 writes the final weights here (.npz)")
    return parser.parse_args()


def load_data():
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)  # pixels are 0..16
    y = digits.target.astype(np.int64)
    return train_test_split(x, y, test_size=0.2, random_state=0)


class RankShard(keras.utils.PyDataset):
    """This rank's batches, reshuffled every epoch: every rank shuffles alike, drops the
    incomplete last global batch, and takes every size-th sample from its rank on, so that the
    t-th batches of all ranks together are the t-th batch of one process with size x batch."""

    def __init__(self, x, y, batch_size, seed):
        super().__init__()
        self.x, self.y, self.batch_size, self.seed = x, y, batch_size, seed
        self.epoch = 0
        self._shuffle()

    def _shuffle(self):
        global_batch = self.batch_size * hvd.size()
        n = len(self.x) // global_batch * global_batch
        order = np.random.default_rng(self.seed + self.epoch).permutation(len(self.x))[:n]
        self.batches = order[hvd.rank()::hvd.size()].reshape(-1, self.batch_size)

    def __len__(self):
        return len(self.batches)

    def __getitem__(self, index):
        batch = self.batches[index]
        return self.x[batch], self.y[batch]

    def on_epoch_end(self):
        self.epoch += 1
        self._shuffle()


class HeldOutAccuracy(keras.callbacks.Callback):
    """Each rank scores every size-th test example; the summed counts cover the whole set.
    Rank 0 prints the epoch's loss (averaged over ranks by MetricAverageCallback) with it."""

    def __init__(self, x_test, y_test):
        super().__init__()
        self.x = x_test[hvd.rank()::hvd.size()]
        self.y = y_test[hvd.rank()::hvd.size()]

    def on_epoch_end(self, epoch, logs=None):
        predicted = np.argmax(self.model.predict(self.x, verbose=0), axis=1)
        counts = hvd.allreduce(np.array([np.sum(predicted == self.y), len(self.y)], np.float64),
                               name="test_counts", op=hvd.Sum).numpy()
        if hvd.rank() == 0:
            print(f"epoch {epoch + 1}: loss {logs['loss']:.4f} test accuracy "
                  f"{100 * counts[0] / counts[1]:.2f}%", flush=True)


def build_model():
    return keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"),
                             keras.layers.Dense(10)])


def main():
    args = parse_args()
    hvd.init()
    keras.utils.set_random_seed(args.seed)
    x_train, x_test, y_train, y_test = load_data()

    model = build_model()
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(learning_rate=args.lr,
                                                              momentum=0.9))
    model.compile(optimizer=optimizer,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])

    callbacks = [
        # Everyone starts from rank 0's weights and optimizer state.
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        # Before the callbacks that read the metrics, so that they see averages over ranks.
        hvd.callbacks.MetricAverageCallback(),
    ]
    if args.warmup_epochs > 0:
        callbacks.append(hvd.callbacks.LearningRateWarmupCallback(
            initial_lr=args.lr, warmup_epochs=args.warmup_epochs))
    callbacks.append(HeldOutAccuracy(x_test, y_test))
    if hvd.rank() == 0 and args.checkpoint_dir:
        # Only rank 0 writes: the ranks hold the same model, and would overwrite each other.
        os.makedirs(args.checkpoint_dir, exist_ok=True)
        callbacks.append(keras.callbacks.ModelCheckpoint(
            os.path.join(args.checkpoint_dir, "checkpoint-{epoch}.keras")))

    model.fit(RankShard(x_train, y_train, args.batch_size, args.seed), epochs=args.epochs,
              callbacks=callbacks, verbose=0)

    if hvd.rank() == 0 and args.save_weights:
        np.savez(args.save_weights, **{v.path.replace("/", "."): v.numpy()
                                       for v in model.weights})


if __name__ == "__main__":
    main()
