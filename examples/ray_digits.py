"""examples/pytorch_digits.py's training with its ranks as Ray actors (RayExecutor).

    python examples/ray_digits.py --num-workers 2

Joins the Ray cluster of RAY_ADDRESS, or starts a local Ray instance with as many CPUs as
workers. Rank 0's loss and held-out accuracy per epoch come back to this process.
"""

import argparse
import os

import ray
import torch

import pytorch_digits
import horovodlike.torch as hvd
from horovodlike.data import DistributedSampler
from horovodlike.ray import RayExecutor


def train(epochs, batch_size, lr, seed):
    hvd.init()
    torch.manual_seed(seed)
    torch.set_num_threads(1)
    train_set, test_set = pytorch_digits.load_data()
    sampler = DistributedSampler(train_set, num_replicas=hvd.size(), rank=hvd.rank(),
                                 shuffle=True, seed=seed, drop_last=True)
    loader = torch.utils.data.DataLoader(train_set, batch_size=batch_size, sampler=sampler,
                                         drop_last=True)
    model = pytorch_digits.build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    history = []
    for epoch in range(1, epochs + 1):
        sampler.set_epoch(epoch)
        loss = pytorch_digits.train_epoch(model, optimizer, loader)
        history.append((epoch, loss, pytorch_digits.held_out_accuracy(model, test_set)))
    return history


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32, help="batch size per rank")
    parser.add_argument("--lr", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()

    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"])
    else:
        ray.init(address="local", num_cpus=args.num_workers, include_dashboard=False)
    # The actors cannot import this folder's modules: send them along with the function.
    ray.cloudpickle.register_pickle_by_value(pytorch_digits)
    executor = RayExecutor(RayExecutor.create_settings(timeout_s=60),
                           num_workers=args.num_workers, cpus_per_worker=1)
    executor.start()
    try:
        history = executor.run(train, args=[args.epochs, args.batch_size, args.lr, args.seed])[0]
    finally:
        executor.shutdown()
        ray.shutdown()
    for epoch, loss, accuracy in history:
        print(f"epoch {epoch}: loss {loss:.4f} test accuracy {100 * accuracy:.2f}%")


if __name__ == "__main__":
    main()
