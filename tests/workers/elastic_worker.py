"""Elastic training under test: a worker may kill itself mid-epoch, or stop itself (SIGSTOP, as
a hung worker: it writes its pid to stopped.pid next to the report first), or rank 0 may add a
host to the discovery file; in "hang_new" the added worker stops itself before init(), and in
"rejoin" a host is removed and added back (its new worker becomes rank 0 with nothing committed).
Every committed step is kept in the elastic state (so rolled-back steps vanish with it); rank 0
writes them and the final weights for the test to replay, and the number of committed steps
after each commit to commits.txt."""

import json
import os
import signal
import sys
import time

import torch

import horovodlike.torch as hvd
from horovodlike.common.elastic import hosts_changed_locally
from horovodlike.data import ElasticSampler

report_path, scenario = sys.argv[1], sys.argv[2]
hosts_file = sys.argv[3] if len(sys.argv) > 3 else None
N, FEATURES, CLASSES, BATCH, EPOCHS, COMMIT_EVERY = 60, 5, 3, 4, 3, 2

worker = os.environ["HOROVOD_ELASTIC_WORKER_ID"]
directory = os.path.dirname(report_path)
if scenario == "hang_new" and worker == "localhost/2":  # hangs before it asks for a round
    with open(os.path.join(directory, "stopped.pid"), "w") as f:
        f.write(str(os.getpid()))
    os.kill(os.getpid(), signal.SIGSTOP)
hvd.init()
torch.set_num_threads(1)
gen = torch.Generator().manual_seed(0)
X = torch.randn(N, FEATURES, generator=gen, dtype=torch.float64)
Y = torch.randint(0, CLASSES, (N,), generator=gen)
torch.manual_seed(1)
model = torch.nn.Linear(FEATURES, CLASSES).double()
# Each rank's loss is its share of the global batch's summed loss over the global batch's size,
# so summing the gradients gives the global mean, however unevenly the batch is split.
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9),
                                     named_parameters=model.named_parameters(), op=hvd.Sum)
sampler = ElasticSampler(range(N), shuffle=True, seed=7)
state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0, steps=[])


def change_hosts(line):
    """Offers the hosts of `line` and waits until the driver has acted on it."""
    with open(hosts_file, "w") as f:
        f.write(line + "\n")
    while not hosts_changed_locally():
        time.sleep(0.05)


def commit():
    state.commit()
    if hvd.rank() == 0:
        with open(os.path.join(directory, "commits.txt"), "a") as f:
            f.write(f"{len(state.steps)}\n")


@hvd.elastic.run
def train(state):
    while state.epoch < EPOCHS:
        for b in range(sampler.batches_per_epoch(BATCH)):
            idx = sampler.get_indices(b, BATCH)
            total = sampler.global_batch_size(b, BATCH)
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(X[idx]), Y[idx], reduction="sum")
            (loss / total).backward()
            optimizer.step()
            state.steps.append([state.epoch, hvd.allgather_object(idx, name="log.indices")])
            sampler.record_batch(b, BATCH)
            state.batch += 1
            if scenario in ("kill", "stop") and worker == "localhost/2" and \
                    state.epoch == 1 and state.batch == 3:  # just after a commit at batch 2
                if scenario == "stop":
                    with open(os.path.join(directory, "stopped.pid"), "w") as f:
                        f.write(str(os.getpid()))
                os.kill(os.getpid(), signal.SIGKILL if scenario == "kill" else signal.SIGSTOP)
            if scenario in ("grow", "hang_new") and hvd.rank() == 0 and state.epoch == 0 and \
                    state.batch == 2 and hvd.size() == 2:
                change_hosts("localhost:3")  # the driver has started the new worker
            if scenario == "rejoin" and worker == "localhost/0" and state.batch == 2:
                if state.epoch == 0 and hvd.size() == 3:
                    change_hosts("localhost:2")  # the driver stops 127.0.0.2/0, rank 0
                elif state.epoch == 1 and hvd.size() == 2:
                    change_hosts("127.0.0.2:1,localhost:2")  # a new 127.0.0.2/0: rank 0
            if state.batch % COMMIT_EVERY == 0:
                commit()
        state.epoch += 1
        state.batch = 0
        sampler.set_epoch(state.epoch)
        commit()


train(state)
if hvd.rank() == 0:
    with open(report_path, "w") as f:
        json.dump({"steps": state.steps, "size": hvd.size(),
                   "weights": {k: v.tolist() for k, v in model.state_dict().items()}}, f)
print(f"rank {hvd.rank()} of {hvd.size()}: elastic OK", flush=True)
