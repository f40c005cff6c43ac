"""Train a small MLP on scikit-learn's digits with horovodlike, the way a Horovod user would.

    horovodlikerun -np 2 python examples/pytorch_digits.py

--batch-size is per rank and --lr is for the global batch (batch size x ranks), so
`-np 2 --batch-size 16` takes the same steps as `-np 1 --batch-size 32`.

--cuda trains on the GPU cuda:<local rank> (one GPU per rank, as Horovod's examples pin them;
ranks beyond the GPUs share them): the model, the batches and the gradients' allreduces live
there (docs/gpu.md).
"""

import argparse
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch.utils.data import DataLoader, TensorDataset

import horovodlike.torch as hvd
from horovodlike.data import DistributedSampler


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32, help="batch size per rank")
    parser.add_argument("--lr", type=float, default=0.2, help="learning rate for the global batch")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--save-weights", metavar="PATH", help="rank 0 writes the final weights here (.npz)")
    parser.add_argument("--cuda", action="store_true", help="train on the GPU cuda:<local rank>")
    return parser.parse_args()


def check_cuda():
    """--cuda without a GPU that PyTorch can use: say so before joining the job."""
    if not torch.cuda.is_available():
        sys.exit(f"--cuda: this PyTorch ({torch.__version__}) sees no CUDA device "
                 f"(torch.version.cuda = {torch.version.cuda}); install a CUDA build of PyTorch "
                 "on a machine with a GPU, or leave out --cuda")


def pick_device(use_cuda):
    """cuda:<local rank> with --cuda (after hvd.init()), else the CPU. With more ranks than GPUs
    on a host, ranks share them (local rank modulo the GPUs): NCCL takes one rank per GPU, so
    horovodlike then stages their tensors through host memory (docs/gpu.md)."""
    if not use_cuda:
        return torch.device("cpu")
    index = hvd.local_rank() % torch.cuda.device_count()
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def load_data():
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)  # pixels are 0..16
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, random_state=0)
    train = TensorDataset(torch.from_numpy(x_train), torch.from_numpy(y_train))
    test = TensorDataset(torch.from_numpy(x_test), torch.from_numpy(y_test))
    return train, test


def build_model():
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))


def train_epoch(model, optimizer, loader, device=torch.device("cpu")):
    model.train()
    total = torch.zeros((), device=device)
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        total += loss.detach()
    # Every rank has the same number of equal-size batches, so the average over ranks of each
    # rank's mean is the mean over the global batches.
    return hvd.allreduce(total / len(loader), name="train_loss", op=hvd.Average).item()


def held_out_accuracy(model, test, device=torch.device("cpu")):
    # Each rank scores every size-th test example; summing the counts gives the whole set.
    model.eval()
    x, y = test.tensors
    x, y = x[hvd.rank() :: hvd.size()].to(device), y[hvd.rank() :: hvd.size()].to(device)
    with torch.no_grad():
        correct = (model(x).argmax(dim=1) == y).sum()
    counts = torch.tensor([correct.item(), len(y)], dtype=torch.float64, device=device)
    correct, total = hvd.allreduce(counts, name="test_counts", op=hvd.Sum).tolist()
    return correct / total


def main():
    args = parse_args()
    if args.cuda:
        check_cuda()
    hvd.init()
    device = pick_device(args.cuda)
    torch.manual_seed(args.seed)
    # Ranks share the host's cores; one thread each avoids oversubscribing them.
    torch.set_num_threads(1)

    train, test = load_data()
    # drop_last in the sampler and the loader: every rank runs the same number of steps on
    # batches of the same size, so averaging the ranks' gradients equals one global batch.
    sampler = DistributedSampler(
        train, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=True, seed=args.seed, drop_last=True
    )
    loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler, drop_last=True)

    model = build_model().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), op=hvd.Average)

    for epoch in range(1, args.epochs + 1):
        sampler.set_epoch(epoch)
        loss = train_epoch(model, optimizer, loader, device)
        accuracy = held_out_accuracy(model, test, device)
        if hvd.rank() == 0:
            print(f"epoch {epoch}: loss {loss:.4f} test accuracy {100 * accuracy:.2f}%", flush=True)

    if hvd.rank() == 0 and args.save_weights:
        np.savez(args.save_weights, **{k: v.detach().cpu().numpy() for k, v in model.state_dict().items()})


if __name__ == "__main__":
    main()
