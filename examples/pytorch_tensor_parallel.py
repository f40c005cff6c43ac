"""Tensor parallel x data parallel with sharded optimizer state, on scikit-learn's digits.

    horovodlikerun -np 4 python examples/pytorch_tensor_parallel.py --tp 2

The ranks form a ProcessMesh (dp, tp). Along tp, the MLP's hidden layer is split the Megatron
way (ColumnParallelLinear then RowParallelLinear: one allreduce forward, one backward); along
dp, each replica trains on its share of every batch and a ZeroRedundancyOptimizer (Adam) keeps
1/dp of the optimizer state per rank and averages the gradients over dp. --batch-size is the
global batch, so any (dp, tp) takes the same steps as one process.
"""

import argparse

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import horovodlike.torch as hvd
from horovodlike.torch.parallel import ColumnParallelLinear, RowParallelLinear


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tp", type=int, default=2, help="ranks per tensor-parallel group")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=64, help="global batch size")
    parser.add_argument("--lr", type=float, default=3e-3)
    return parser.parse_args()


class TensorParallelMLP(torch.nn.Module):
    def __init__(self, hidden, tp_set):
        super().__init__()
        self.up = ColumnParallelLinear(64, hidden, process_set=tp_set)     # hidden/tp here
        self.down = RowParallelLinear(hidden, 64, process_set=tp_set)      # allreduce out
        self.head = torch.nn.Linear(64, 10)

    def forward(self, x):
        return self.head(F.relu(x + self.down(F.relu(self.up(x)))))


def main():
    args = parse_args()
    hvd.init()
    if hvd.size() % args.tp:
        raise SystemExit(f"--tp {args.tp} does not divide the {hvd.size()} ranks")
    mesh = hvd.ProcessMesh((hvd.size() // args.tp, args.tp), ("dp", "tp"))
    dp, dp_rank = mesh.size("dp"), mesh.coordinate("dp")

    digits = load_digits()
    x = torch.tensor(digits.data / 16.0, dtype=torch.float32)
    y = torch.tensor(digits.target)
    x_train, x_test, y_train, y_test = (torch.as_tensor(np.asarray(a)) for a in
                                        train_test_split(x, y, test_size=0.2, random_state=0))
    torch.manual_seed(0)   # every rank draws the same weights and keeps its slice
    model = TensorParallelMLP(args.hidden, mesh.process_set("tp"))
    optimizer = hvd.ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam,
                                            process_set=mesh.process_set("dp"), lr=args.lr)
    share = args.batch_size // dp
    for epoch in range(1, args.epochs + 1):
        order = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(epoch))
        total = 0.0
        for start in range(0, len(order) - args.batch_size + 1, args.batch_size):
            batch = order[start:start + args.batch_size][dp_rank * share:(dp_rank + 1) * share]
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x_train[batch]), y_train[batch])
            loss.backward()
            optimizer.step()
            total += loss.item()
        with torch.no_grad():
            accuracy = (model(x_test).argmax(1) == y_test).float().mean().item() * 100
        steps = len(order) // args.batch_size
        # Each replica saw its share of every batch: the mean over dp is the global batch's.
        total = hvd.allreduce(torch.tensor(total), name=f"loss.{epoch}",
                              process_set=mesh.process_set("dp")).item()
        if hvd.rank() == 0:
            print(f"epoch {epoch}: loss {total / steps:.4f} test accuracy {accuracy:.1f}%",
                  flush=True)
    hvd.barrier()
    hvd.shutdown()


if __name__ == "__main__":
    main()
