"""Training functions that the Ray and Spark tests run on a cluster engine's workers; run as a
script under horovodlikerun, `train_linear` writes what it returns (for the comparison with the
launcher).

train_linear: least squares on a fixed data set, each rank its shard, DistributedOptimizer
averaging the gradients; the weights equal full-batch gradient descent in NumPy."""

import json
import os
import signal
import sys
import time

import numpy as np

N, FEATURES, STEPS, LR = 32, 4, 6, 0.1


def linear_data():
    rng = np.random.default_rng(3)
    return rng.normal(size=(N, FEATURES)), rng.normal(size=N)


def numpy_linear_weights(size, steps=STEPS, shards_per_step=None):
    """Full-batch gradient descent over the same data in one process: each step, the mean of
    the ranks' mean-squared-error gradients over their equal shards (np.array_split's, or
    `shards_per_step[step]`: a list of sample indices per rank)."""
    X, y = linear_data()
    w = np.zeros(FEATURES)
    for step in range(steps):
        shards = (np.array_split(np.arange(N), size) if shards_per_step is None
                  else shards_per_step[step])
        grads = [2 * X[s].T @ (X[s] @ w - y[s]) / len(s) for s in shards]
        w = w - LR * np.mean(grads, axis=0)
    return w


def train_linear():
    import torch
    import horovodlike.torch as hvd
    hvd.init()
    torch.set_num_threads(1)
    X, y = (torch.from_numpy(a) for a in linear_data())
    mine = np.array_split(np.arange(N), hvd.size())[hvd.rank()]
    torch.manual_seed(hvd.rank())  # different on purpose: the broadcast makes them equal
    model = torch.nn.Linear(FEATURES, 1, bias=False).double()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    with torch.no_grad():
        model.weight.zero_()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                         named_parameters=model.named_parameters())
    for _ in range(STEPS):
        optimizer.zero_grad()
        loss = ((model(X[mine]).squeeze(1) - y[mine]) ** 2).mean()
        loss.backward()
        optimizer.step()
    return {"rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank(),
            "weights": model.weight.detach().numpy().ravel().tolist()}


def placement():
    """This rank's place in the job, and an allreduce over every rank."""
    import horovodlike.torch as hvd
    import torch
    hvd.init()
    total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum).item()
    return {"rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank(),
            "local_size": hvd.local_size(), "cross_rank": hvd.cross_rank(),
            "cross_size": hvd.cross_size(), "sum": total,
            "hostname": os.environ.get("HOROVOD_HOSTNAME")}


def fail_on_rank(bad_rank, how, report_dir):
    """Rank `bad_rank` raises (how="raise") or kills its own process (how="kill") before an
    allreduce that the others enter, having written when (report_dir/failed_at, time.time());
    they write down what the allreduce raised, and how long after the failure."""
    import horovodlike.torch as hvd
    import torch
    hvd.init()
    failed_at = os.path.join(report_dir, "failed_at")
    if hvd.rank() == bad_rank:
        with open(failed_at, "w") as f:
            f.write(repr(time.time()))
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise ValueError(f"rank {bad_rank} gives up")
    try:
        hvd.allreduce(torch.ones(3), name="after.failure")
        outcome = "no error"
    except Exception as error:  # what the test checks
        outcome = type(error).__name__
    seconds = -1.0  # no failure time: the test fails on it
    if os.path.exists(failed_at):
        with open(failed_at) as f:
            seconds = time.time() - float(f.read())
    with open(os.path.join(report_dir, f"rank{hvd.rank()}.txt"), "w") as f:
        f.write(f"{outcome} {seconds:.2f}\n")
    return outcome


def logged_sums(marker, chief_only=True):
    """Each of 3 steps, an allreduce whose sum goes to the driver's callbacks through
    ray_logger.log; then rank 0 waits (30 s at most) for `marker`, which the test's callback
    creates: whether it appeared tells that the callbacks run while the workers still do."""
    import horovodlike.torch as hvd
    import torch
    from horovodlike.ray import ray_logger
    hvd.init()
    for step in range(3):
        total = hvd.allreduce(torch.tensor([float((hvd.rank() + 1) * (step + 1))]), op=hvd.Sum)
        ray_logger.log({"rank": hvd.rank(), "step": step, "sum": total.item()},
                       chief_only=chief_only)
    if hvd.rank() != 0:
        return None
    deadline = time.monotonic() + 30
    while not os.path.exists(marker) and time.monotonic() < deadline:
        time.sleep(0.02)
    return os.path.exists(marker)


def greet(word, punctuation="."):
    import horovodlike.torch as hvd
    import torch
    hvd.init()
    print(f"{word} from {hvd.rank()}{punctuation}")
    os.write(1, f"and from {hvd.rank()}'s file descriptor 1\n".encode())
    gathered = hvd.allgather(torch.tensor([hvd.rank() * 10]))
    return hvd.rank(), gathered.tolist()


class Counter:
    """An executable for RayExecutor.start(executable_cls=...)."""

    def __init__(self, start):
        self.value = start

    def add(self, amount):
        import horovodlike.torch as hvd
        hvd.init()
        self.value += amount * (hvd.rank() + 1)
        return hvd.rank(), self.value


def elastic_train(report_dir, scenario, hosts_file=None, log_steps=False):
    """tests/workers/elastic_worker.py's training as a function: a worker kills itself
    mid-epoch ("kill"), rank 0 offers a second slot to the discovery ("grow") or takes the
    second slot away ("shrink"), or rank 0 asks the Ray driver to remove the second node of its
    cluster and waits until it is gone ("leave"). Rank 0
    returns the committed steps and the final weights for the test to replay; with log_steps,
    it also sends each step to the Ray driver's callbacks as it goes."""
    import torch
    import horovodlike.torch as hvd
    from horovodlike.common.elastic import hosts_changed_locally
    from horovodlike.data import ElasticSampler

    n, features, classes, batch, epochs, commit_every = 60, 5, 3, 4, 3, 2
    hvd.init()
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    X = torch.randn(n, features, generator=gen, dtype=torch.float64)
    Y = torch.randint(0, classes, (n,), generator=gen)
    torch.manual_seed(1)
    model = torch.nn.Linear(features, classes).double()
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9),
        named_parameters=model.named_parameters(), op=hvd.Sum)
    sampler = ElasticSampler(range(n), shuffle=True, seed=7)
    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0,
                                   steps=[])
    worker = os.environ["HOROVOD_ELASTIC_WORKER_ID"]

    @hvd.elastic.run
    def train(state):
        while state.epoch < epochs:
            for b in range(sampler.batches_per_epoch(batch)):
                idx = sampler.get_indices(b, batch)
                total = sampler.global_batch_size(b, batch)
                optimizer.zero_grad()
                loss = torch.nn.functional.cross_entropy(model(X[idx]), Y[idx], reduction="sum")
                (loss / total).backward()
                optimizer.step()
                state.steps.append([state.epoch, hvd.allgather_object(idx, name="log.indices")])
                if log_steps:
                    from horovodlike.ray import ray_logger
                    ray_logger.log(state.steps[-1])
                sampler.record_batch(b, batch)
                state.batch += 1
                if scenario == "kill" and worker.endswith("/1") and state.epoch == 1 and \
                        state.batch == 3:
                    os.kill(os.getpid(), signal.SIGKILL)  # just after a commit at batch 2
                if scenario == "grow" and hvd.rank() == 0 and state.epoch == 0 and \
                        state.batch == 2 and hvd.size() == 1:
                    with open(hosts_file) as f:
                        host = f.read().split(":")[0]
                    with open(hosts_file, "w") as f:
                        f.write(f"{host}:2\n")
                    while not hosts_changed_locally():  # the driver has started the new worker
                        time.sleep(0.05)
                if scenario == "shrink" and hvd.rank() == 0 and state.epoch == 1 and \
                        state.batch == 3 and hvd.size() == 2:
                    with open(hosts_file) as f:
                        host = f.read().split(":")[0]
                    with open(hosts_file, "w") as f:
                        f.write(f"{host}:1\n")  # the second slot's node leaves
                    while not hosts_changed_locally():  # the driver has stopped its worker
                        time.sleep(0.05)
                if scenario == "leave" and hvd.rank() == 0 and state.epoch == 1 and \
                        state.batch == 3 and hvd.size() == 2:
                    leave = hosts_file + ".leave"
                    open(leave, "w").close()  # the driver removes the second Ray node
                    while os.path.exists(leave):
                        time.sleep(0.05)
                if state.batch % commit_every == 0:
                    state.commit()
            state.epoch += 1
            state.batch = 0
            sampler.set_epoch(state.epoch)
            state.commit()

    train(state)
    print(f"worker {worker} finished as rank {hvd.rank()} of {hvd.size()}")
    if hvd.rank() != 0:
        return None
    return {"steps": state.steps, "size": hvd.size(),
            "weights": {k: v.tolist() for k, v in model.state_dict().items()}}


def hold_a_slot(hosts_file, started_file, _=None):
    """A Spark task that keeps its core until the "grow" scenario asks for a second slot (at
    most 120 s)."""
    open(started_file, "w").close()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        with open(hosts_file) as f:
            if ":2" in f.read():
                return
        time.sleep(0.05)


if __name__ == "__main__":
    result = train_linear()
    with open(os.path.join(sys.argv[1], f"rank{result['rank']}.json"), "w") as f:
        json.dump(result, f)
