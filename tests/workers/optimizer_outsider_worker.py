"""Every rank builds a DistributedOptimizer for a process set that leaves some ranks out (as
Horovod's test_optimizer_process_sets does at 4 ranks): the set's members average their
gradients, the others step on their own. Each rank computes the expected weights itself with
NumPy from every rank's data, without the runtime."""

import numpy as np
import torch

import horovodlike.torch as hvd
from common import check

even = hvd.ProcessSet([0, 2])
hvd.init(process_sets=[even])
rank, size = hvd.rank(), hvd.size()
members = [0, 2]
rng = np.random.default_rng(7)
w0 = rng.standard_normal((3, 4))
data = [(rng.standard_normal((5, 4)), rng.standard_normal((5, 3))) for _ in range(size)]


def grad(w, r):
    """d/dw of sum((x w^T - y)^2) / 5 for rank r's data."""
    x, y = data[r]
    return 2.0 * (x @ w.T - y).T @ x / 5


def adasum(a, b):
    """Adasum of two changes, by its formula (Maleki et al.): each scaled by how much of it the
    other does not already contain."""
    dot = float(np.sum(a * b))
    return (1 - dot / (2 * np.sum(a * a))) * a + (1 - dot / (2 * np.sum(b * b))) * b


for opt in ("sgd", "adasum"):
    model = torch.nn.Linear(4, 3, bias=False).double()
    with torch.no_grad():
        model.weight.copy_(torch.from_numpy(w0))
    base = torch.optim.SGD(model.parameters(), lr=0.1)
    op = hvd.Adasum if opt == "adasum" else hvd.Average
    optimizer = hvd.DistributedOptimizer(base, named_parameters=model.named_parameters(),
                                         process_set=even, op=op)
    expected = w0.copy()
    for _ in range(3):
        x, y = (torch.from_numpy(a) for a in data[rank])
        optimizer.zero_grad()
        ((model(x) - y) ** 2).sum().div(5).backward()
        optimizer.step()
        if rank in members and opt == "sgd":
            expected -= 0.1 * np.mean([grad(expected, r) for r in members], axis=0)
        elif rank in members:
            # Adasum combines the members' changes after each one's own SGD step.
            expected += adasum(*(-0.1 * grad(expected, r) for r in members))
        else:
            expected -= 0.1 * grad(expected, rank)
    got = model.weight.detach().numpy()
    check(np.allclose(got, expected, rtol=1e-10, atol=1e-12),
          f"{opt}: rank {rank} weights {got} != expected {expected}")
hvd.barrier()
print(f"rank {rank}: OUTSIDER OK", flush=True)
hvd.shutdown()
