"""What tests/test_spark_torch_distributor.py runs on TorchDistributor's ranks: a function, and
(run as a script) the same allreduce with its command-line arguments."""

import argparse
import os

import numpy as np


def contribution(rank, scale):
    """Rank r's tensor: (r + 1) * scale * [1, 2, 3, 4]."""
    return (rank + 1) * scale * np.arange(1.0, 5.0)


def allreduce_ranks(scale, label="sum"):
    """Sums every rank's contribution; returns what this rank saw."""
    import horovodlike.torch as hvd
    import torch
    hvd.init()
    total = hvd.allreduce(torch.from_numpy(contribution(hvd.rank(), scale)), op=hvd.Sum,
                          name="distributor.sum")
    return {"label": label, "rank": hvd.rank(), "size": hvd.size(), "sum": total.numpy()}


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--scale", type=float, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--fail-on-rank", type=int, default=-1)
    options = parser.parse_args()
    if int(os.environ["HOROVOD_RANK"]) == options.fail_on_rank:
        raise ValueError(f"rank {options.fail_on_rank} gives up")
    seen = allreduce_ranks(options.scale)
    np.save(os.path.join(options.out, f"rank{seen['rank']}of{seen['size']}.npy"), seen["sum"])
