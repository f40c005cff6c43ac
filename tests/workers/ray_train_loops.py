"""train_loop_per_worker functions that tests/test_ray_train.py runs under HorovodTrainer on Ray
Train's workers (importable there: the test puts this folder on the workers' PYTHONPATH).

linear_loop: cluster_jobs' least squares (each rank a full pass over its Ray Data shard of the
data set each step, DistributedOptimizer averaging the gradients, full-batch gradient descent
in NumPy as the reference), reporting each step with a checkpoint of the weights and the ids
each rank read, resuming from ray.train.get_checkpoint(), until config["steps"]
(cluster_jobs.STEPS by default); with `kill_at`, rank 1 of the first attempt kills its own
process at that step (a marker file says it has)."""

import json
import os
import signal
import tempfile

import numpy as np

from cluster_jobs import FEATURES, LR, N, STEPS, linear_data


def placement(hvd):
    """(Ray Train's world rank, world size, local rank; hvd's rank, size, local rank) of this
    worker, for every rank: what the test compares."""
    import ray.train
    context = ray.train.get_context()
    mine = [context.get_world_rank(), context.get_world_size(), context.get_local_rank(),
            hvd.rank(), hvd.size(), hvd.local_rank()]
    return hvd.allgather_object(mine, name="placement")


def load_checkpoint(model):
    """(the step the last reported checkpoint was taken after, the steps each earlier attempt
    started from), its weights put in `model`; (0, []) without a checkpoint."""
    import ray.train
    import torch
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None:
        return 0, []
    with checkpoint.as_directory() as folder:
        weights = np.load(os.path.join(folder, "weights.npy"))
        with open(os.path.join(folder, "step")) as f:
            step = int(f.read())
        with open(os.path.join(folder, "starts")) as f:
            starts = json.loads(f.read())
    with torch.no_grad():
        model.weight.copy_(torch.from_numpy(weights))
    return step, starts


def report(hvd, metrics, files):
    """Every rank reports (Ray Train waits for all); rank 0 with a checkpoint holding `files`
    ({name: NumPy array or text}). Ray Train V2's result.metrics are those of the last report
    that came with a checkpoint."""
    import ray.train
    if hvd.rank() != 0:
        ray.train.report(metrics)
        return
    with tempfile.TemporaryDirectory() as folder:
        for name, content in files.items():
            if isinstance(content, str):
                with open(os.path.join(folder, name), "w") as f:
                    f.write(content)
            else:
                np.save(os.path.join(folder, name), content)
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(folder))


def kill_once(config, hvd, step):
    """Rank 1 kills its own process at step config["kill_at"], the first time only."""
    marker = config.get("marker")
    if step == config.get("kill_at") and hvd.rank() == 1 and not os.path.exists(marker):
        open(marker, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)


def linear_dataset():
    """cluster_jobs' data set as a Ray dataset: one row per sample, with its index as "id"."""
    import ray.data
    X, y = linear_data()
    return ray.data.from_items([{"id": i, "x": X[i], "y": y[i]} for i in range(N)])


def read_epoch(shard):
    """One epoch of this rank's shard of the data set, in id order: (ids, X, y)."""
    ids, rows, targets = [], [], []
    for batch in shard.iter_batches(batch_size=8, batch_format="numpy"):
        ids += [int(i) for i in batch["id"]]
        rows.append(np.asarray(batch["x"]))
        targets.append(np.asarray(batch["y"]))
    order = np.argsort(ids)
    return (np.asarray(ids)[order].tolist(), np.concatenate(rows)[order],
            np.concatenate(targets)[order])


def linear_loop(config):
    """Each step a full pass over this rank's shard of the "train" dataset."""
    import ray.train
    import torch
    import horovodlike.torch as hvd
    hvd.init()
    torch.set_num_threads(1)
    shard = ray.train.get_dataset_shard("train")
    model = torch.nn.Linear(FEATURES, 1, bias=False).double()
    with torch.no_grad():
        model.weight.zero_()
    # Every worker gets the checkpoint; rank 0's is the one that counts, as in Horovod scripts.
    start, starts = hvd.broadcast_object(load_checkpoint(model), root_rank=0, name="start")
    starts = starts + [start]
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                         named_parameters=model.named_parameters())
    found = {"placement": placement(hvd), "starts": starts, "shards": [],
             "secret_is_key": hvd.allgather_object(
                 os.environ["HOROVOD_SECRET_KEY"] == config.get("key"), name="key")}
    for step in range(start, config.get("steps", STEPS)):
        kill_once(config, hvd, step)
        ids, X, y = read_epoch(shard)
        found["shards"].append(hvd.allgather_object(ids, name="ids"))
        optimizer.zero_grad()
        loss = ((model(torch.from_numpy(X)).squeeze(1) - torch.from_numpy(y)) ** 2).mean()
        loss.backward()
        optimizer.step()
        report(hvd, {"step": step + 1, "loss": loss.item(), **found},
               {"weights.npy": model.weight.detach().numpy(), "step": str(step + 1),
                "starts": json.dumps(starts)})
