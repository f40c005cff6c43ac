"""A process set's collectives while the ranks outside it wait in a barrier, with a cycle time
of ten minutes (the test sets HOROVOD_CYCLE_TIME): every round negotiates every set, the global
one first, so each of the set's collectives needs the idle ranks' part of the global
negotiation. The set's rounds ring the idle ranks' round bell (ShmLink::RoundStarted), whose
loops then run a round at once; without it each collective would wait for their next cycle.
Prints the bells each rank rang."""

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
hvd.barrier()
print(f"rank {rank}: BELLS {_core.stats().get('shm_round_bells')}", flush=True)
hvd.shutdown()
