"""Elastic training on scikit-learn's digits: the job keeps going when a worker dies and grows
when the host discovery script reports more slots.

    echo localhost:3 > hosts.txt
    horovodlikerun -np 3 --min-np 2 --max-np 4 \\
        --host-discovery-script "cat hosts.txt" python examples/pytorch_digits_elastic.py

Kill one of the workers (kill -9 <pid>) while it trains: the others roll back to the last
commit, re-form without it and finish the epoch without repeating or skipping a sample. Write
`localhost:4` to hosts.txt: a fourth worker joins at the next commit.
"""

import argparse

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import horovodlike.torch as hvd
from horovodlike.data import ElasticSampler


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--batch-size", type=int, default=16, help="batch size per worker")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--commit-every", type=int, default=10, help="batches between commits")
    args = parser.parse_args()

    hvd.init()
    torch.manual_seed(0)
    digits = load_digits()
    x = torch.from_numpy((digits.data / 16.0).astype(np.float32))
    y = torch.from_numpy(digits.target.astype(np.int64))
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, random_state=0)

    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    # Each worker's loss is its part of the global batch's summed loss, divided by the global
    # batch's size; summing the gradients gives the mean over the global batch, whatever the
    # number of workers and however unevenly the last batch is split.
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9),
        named_parameters=model.named_parameters(), op=hvd.Sum)
    sampler = ElasticSampler(range(len(x_train)), shuffle=True, seed=0)
    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0)

    def on_reset():
        if hvd.rank() == 0:
            print(f"re-formed with {hvd.size()} workers", flush=True)

    state.register_reset_callbacks([on_reset])

    @hvd.elastic.run
    def train(state):
        while state.epoch < args.epochs:
            model.train()
            total = torch.zeros(())
            for batch in range(sampler.batches_per_epoch(args.batch_size)):
                indices = sampler.get_indices(batch, args.batch_size)
                size = sampler.global_batch_size(batch, args.batch_size)
                optimizer.zero_grad()
                loss = F.cross_entropy(model(x_train[indices]), y_train[indices],
                                       reduction="sum") / size
                loss.backward()
                optimizer.step()
                total += loss.detach()
                sampler.record_batch(batch, args.batch_size)
                state.batch = batch + 1
                if state.batch % args.commit_every == 0:
                    state.commit()
            model.eval()
            with torch.no_grad():
                accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
            loss_sum = hvd.allreduce(total, op=hvd.Sum, name="epoch_loss").item()
            if hvd.rank() == 0:
                print(f"epoch {state.epoch + 1}: {hvd.size()} workers, loss "
                      f"{loss_sum / max(1, batch + 1):.4f}, test accuracy {accuracy:.2%}",
                      flush=True)
            state.epoch += 1
            state.batch = 0
            sampler.set_epoch(state.epoch)
            state.commit()

    train(state)


if __name__ == "__main__":
    main()
