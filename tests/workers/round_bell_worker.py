"""A process set's collectives while the rank outside it waits for a point-to-point message,
with a cycle time of 3 s (the test sets HOROVOD_CYCLE_TIME): every round negotiates
every set, the global one first, so each of the set's collectives needs the idle rank's part
of the global negotiation. The set's rounds ring the idle rank's round bell
(core/round_bells.h), whose loop then runs a round at once; without it each collective
would wait for its next cycle. Prints the bells each rank rang."""

import numpy as np
import torch

import horovodlike.torch as hvd
from horovodlike import _core

hvd.init()
rank, size = hvd.rank(), hvd.size()
pair = hvd.add_process_set([0, 1])
if rank in (0, 1):
    for i in range(50):
        t = torch.full((1024,), float(rank + 1 + i))
        hvd.allreduce_(t, op=hvd.Sum, process_set=pair, name="pair")
        np.testing.assert_array_equal(t.numpy(), np.full(1024, 3.0 + 2 * i, np.float32))
    if rank == 0:
        hvd.send(torch.tensor([float(i)]), dst=2)
else:
    # No collective of its own meanwhile: the loop of this rank has nothing to do.
    got = hvd.irecv(torch.zeros(1), src=0).wait()
    np.testing.assert_array_equal(got.numpy(), [49.0])
bells = hvd.allgather_object(_core.stats().get("shm_round_bells"), name="bells")
print(f"rank {rank}: BELLS {bells[rank]}", flush=True)
hvd.shutdown()
