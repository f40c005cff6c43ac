"""Process sets made from mpi4py communicators (run under horovodlikerun --mpi with 3 ranks):
a Split subcommunicator is a different set on each rank; duplicates within a rank's own list
raise on that rank before anything is sent; a valid init() gathers every rank's sets and
numbers them in order; collectives over the sets match MPI's own over the communicators."""

import numpy as np
import torch
from mpi4py import MPI

import horovodlike.torch as hvd
from common import check, raises

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
check(size == 3, "run with 3 ranks")
even, odd = list(range(0, size, 2)), list(range(1, size, 2))
mine = even if rank % 2 == 0 else odd
subcomm = world.Split(color=rank % 2, key=rank)
ids = hvd.mpi_ops._basics._get_process_set_ids_and_ranks


# The members of a communicator, as global ranks, differ per rank.
check(hvd.ProcessSet(subcomm).ranks == mine, f"ProcessSet(subcomm): {hvd.ProcessSet(subcomm)}")
raises(ValueError, lambda: hvd.ProcessSet(MPI.COMM_NULL), "COMM_NULL")
raises(ValueError, lambda: hvd.init(comm=subcomm), f"holds {len(mine)} of the 3 processes")

# A communicator of every rank duplicates the global set: every rank raises, nothing is sent.
raises(ValueError, lambda: hvd.init(comm=world, process_sets=[hvd.ProcessSet(subcomm),
                                                              hvd.ProcessSet(world.Dup())]),
       f"on rank {rank}", "process set 1", "duplicate of the global process set")
check(ids() == {0: list(range(size))}, f"a set was registered: {ids()}")

# The set of even ranks given twice is a duplicate on the even ranks only: they raise, the odd
# rank's init() goes ahead and is met by the even ranks' next (valid) init().
first = [hvd.ProcessSet(subcomm), hvd.ProcessSet(even)]
if rank % 2 == 0:
    raises(ValueError, lambda: hvd.init(comm=world, process_sets=first),
           f"on rank {rank}", "process sets 0 and 1", str(even))
    first = [hvd.ProcessSet(subcomm), hvd.ProcessSet([0])]
comm = world.Dup()
hvd.init(comm=comm, process_sets=first)
# Gathered in order: each rank's first set (rank 0's [0, 2], rank 1's [1]), then the second.
expected = {0: list(range(size)), 1: even, 2: odd, 3: [0]}
check(ids() == expected, f"process sets: {ids()}, expected {expected}")
check(hvd.global_process_set.mpi_comm == comm, "global_process_set.mpi_comm")
check(first[0].process_set_id == (1 if rank % 2 == 0 else 2), f"{first[0]}")
check(first[1].process_set_id == (3 if rank % 2 == 0 else 1), f"{first[1]}")

# A later init() only looks the sets up; one that no rank registered is an error on its rank.
again = hvd.ProcessSet(subcomm)
hvd.init(comm=comm, process_sets=[again])
check(again == first[0] and again.size() == len(mine) and again.rank() == mine.index(rank),
      f"{again} after init() again")
raises(ValueError, lambda: hvd.init(process_sets=[hvd.ProcessSet([1, 2])]),
       f"on rank {rank}", "[1, 2] not registered")

# Collectives over the communicator's set agree with MPI's over the communicator itself.
value = np.arange(5, dtype=np.float64) * (rank + 1) + rank
reference = subcomm.allreduce(value, op=MPI.SUM)
summed = hvd.allreduce(torch.from_numpy(value), op=hvd.Sum, process_set=first[0]).numpy()
check(np.array_equal(summed, reference), f"allreduce over {first[0]}: {summed} != {reference}")
gathered = hvd.allgather(torch.from_numpy(value[None]), process_set=first[0]).numpy()
check(np.array_equal(gathered, np.stack(subcomm.allgather(value))), f"allgather: {gathered}")

world.barrier()
print(f"rank {rank}: multi-comm OK", flush=True)
hvd.shutdown()
