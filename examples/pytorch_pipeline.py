"""Pipeline x data parallel: an MLP on scikit-learn's digits, split into pipeline stages, with the
pipeline replicated for data parallel.

    horovodlikerun -np 4 python examples/pytorch_pipeline.py            # pp=2 x dp=2
    horovodlikerun -np 4 python examples/pytorch_pipeline.py --pp 4     # one pipeline of 4
    horovodlikerun -np 2 python examples/pytorch_pipeline.py --pp 2 --schedule gpipe

The ranks form a ProcessMesh (pp, dp). Each pipeline (one dp coordinate) takes its share of
every global batch, cuts it into micro-batches, and runs them through its stages with the chosen
schedule; each stage's gradients are then averaged over its data-parallel replicas only, so the
big allreduce stays within a stage and only activations travel between stages (the layout of
the Whale paper). The last stage of the first pipeline prints the loss and held-out accuracy.
"""

import argparse

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import horovodlike.torch as hvd
from horovodlike.torch.pipelining import (PipelineStage, Schedule1F1B, ScheduleGPipe,
                                          ScheduleInterleaved1F1B, split_sequential)

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B,
             "interleaved": ScheduleInterleaved1F1B}


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pp", type=int, default=2, help="pipeline stages (ranks per pipeline)")
    parser.add_argument("--schedule", choices=sorted(SCHEDULES), default="1f1b")
    parser.add_argument("--stages-per-rank", type=int, default=1,
                        help="with --schedule interleaved: model chunks per rank")
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--batch-size", type=int, default=64, help="global batch size")
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--lr", type=float, default=0.1)
    return parser.parse_args()


def load_data():
    digits = load_digits()
    x = torch.from_numpy((digits.data / 16.0).astype(np.float32))
    y = torch.from_numpy(digits.target.astype(np.int64))
    return train_test_split(x, y, test_size=0.2, random_state=0)


def build_model(num_stages):
    # Every rank builds the whole model from one seed and keeps its stages' layers.
    torch.manual_seed(0)
    widths = [64] + [128] * (num_stages - 1) + [10]
    blocks = []
    for i in range(num_stages):
        layer = nn.Linear(widths[i], widths[i + 1])
        blocks.append(nn.Sequential(layer, nn.ReLU()) if i < num_stages - 1 else layer)
    return nn.Sequential(*blocks)


def main():
    args = parse_args()
    hvd.init()
    if hvd.size() % args.pp:
        raise SystemExit(f"--pp {args.pp} must divide the number of ranks ({hvd.size()})")
    mesh = hvd.ProcessMesh((args.pp, hvd.size() // args.pp), ("pp", "dp"))
    pp_set, dp_set = mesh.process_set("pp"), mesh.process_set("dp")
    position, replicas, replica = pp_set.rank(), mesh.size("dp"), mesh.coordinate("dp")
    num_stages = args.pp * args.stages_per_rank

    model = build_model(num_stages)
    parts = split_sequential(model, num_stages)
    mine = [i for i in range(num_stages) if i % args.pp == position]
    stages = [PipelineStage(parts[i], i, num_stages, process_set=pp_set) for i in mine]
    schedule = SCHEDULES[args.schedule](stages if len(stages) > 1 else stages[0],
                                        args.microbatches, loss_fn=F.cross_entropy)
    params = [p for i in mine for p in parts[i].parameters()]
    named = [(f"stage{i}.{name}", p) for i in mine for name, p in parts[i].named_parameters()]
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(params, lr=args.lr, momentum=0.9),
                                         named_parameters=named, process_set=dp_set)

    x_train, x_test, y_train, y_test = load_data()
    first, last = 0 in schedule.stages, num_stages - 1 in schedule.stages
    per_replica = args.batch_size // replicas
    for epoch in range(args.epochs):
        order = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(epoch))
        epoch_losses = []
        for start in range(0, len(order) - args.batch_size + 1, args.batch_size):
            rows = order[start + replica * per_replica:start + (replica + 1) * per_replica]
            optimizer.zero_grad()
            losses = []
            if first and last:
                schedule.step(x_train[rows], target=y_train[rows], losses=losses)
            elif first:
                schedule.step(x_train[rows])
            elif last:
                schedule.step(target=y_train[rows], losses=losses)
            else:
                schedule.step()
            optimizer.step()
            epoch_losses += [loss.item() for loss in losses]
        # Held-out accuracy: the test set through the same pipeline, without training.
        correct = evaluate(schedule, x_test, y_test, first, last)
        if last and replica == 0:
            print(f"epoch {epoch}: loss {np.mean(epoch_losses):.4f} "
                  f"test accuracy {100.0 * correct / len(y_test):.1f}%", flush=True)


def evaluate(schedule, x, y, first, last):
    """Runs the test set through the pipeline, forward only, and counts the correct
    predictions on the last stage."""
    rows = len(x) - len(x) % schedule.n_microbatches
    output = None
    if first and last:
        output = schedule.eval(x[:rows])
    elif first:
        schedule.eval(x[:rows])
    elif last:
        output = schedule.eval()
    else:
        schedule.eval()
    return int((output.argmax(1) == y[:rows]).sum()) if output is not None else 0


if __name__ == "__main__":
    main()
