"""After a join, collectives other than allreduce fail at once on every rank that calls them,
even where the ranks' unnamed calls are numbered differently (Horovod's
test_horovod_join_allgather at more than 2 ranks). Each rank in turn joins first while the
others call an unnamed allgather, which must raise, then join; every rank then agrees on the
join's result, and an allreduce after it is right."""

import torch

import horovodlike.torch as hvd
from common import check

hvd.init()
rank, size = hvd.rank(), hvd.size()
for first in range(size):
    if rank == first:
        last = hvd.join()
    else:
        try:
            hvd.allgather(torch.ones(3, 2))
        except RuntimeError as e:
            check("already called join()" in str(e), f"unclear error: {e}")
        else:
            raise AssertionError("allgather after a join did not raise")
        last = hvd.join()
    check(last != first, f"join() returned the first rank to join ({first})")
    values = hvd.allgather_object(last)
    check(values == [last] * size, f"join() results differ: {values}")
total = hvd.allreduce(torch.full((4,), float(rank)), op=hvd.Sum)
check(float(total[0]) == size * (size - 1) / 2, f"allreduce after the joins: {total}")
print(f"rank {rank}: JOINS OK", flush=True)
hvd.shutdown()
