"""join() while the other ranks run collectives that already ran once (so the response cache
holds them): allreduce goes on with the joined rank's zeros, every other collective fails on
the ranks that started it, naming the joined rank, and nobody waits forever for the joined
rank's part. Afterwards the same collectives run normally again."""

import torch

import horovodlike.torch as hvd
from common import check

hvd.init()
rank, size = hvd.rank(), hvd.size()
torch.set_num_threads(1)

ROWS = 2 * size  # divisible by size for reducescatter, rows per rank for alltoall


def value(r):
    return torch.full((ROWS, 3), float(r + 1))


COLLECTIVES = {
    "allgather": lambda: hvd.allgather(value(rank), name="c.allgather"),
    "broadcast": lambda: hvd.broadcast(value(rank), root_rank=size - 1, name="c.broadcast"),
    "barrier": lambda: hvd.barrier(),
    "alltoall": lambda: hvd.alltoall(value(rank), name="c.alltoall"),
    "reducescatter": lambda: hvd.reducescatter(value(rank), op=hvd.Sum, name="c.reducescatter"),
}


def check_results(results):
    gathered = results["allgather"]
    check(torch.equal(gathered, torch.cat([value(r) for r in range(size)])), "allgather wrong")
    check(torch.equal(results["broadcast"], value(size - 1)), "broadcast wrong")
    check(torch.equal(results["alltoall"], torch.cat([value(r)[:2] for r in range(size)])),
          "alltoall wrong")
    total = sum(r + 1 for r in range(size))
    check(torch.equal(results["reducescatter"], torch.full((2, 3), float(total))),
          "reducescatter wrong")


# Every collective once, so that each is in the response cache.
check_results({kind: run() for kind, run in COLLECTIVES.items()})
hvd.allreduce(value(rank), op=hvd.Sum, name="c.allreduce")

for round_ in range(2):
    if rank == 0:
        last = hvd.join()
    else:
        for kind, run in COLLECTIVES.items():
            try:
                run()
            except RuntimeError as e:
                check("join" in str(e) and "rank 0" in str(e), f"{kind}: unclear error: {e}")
            else:
                raise AssertionError(f"{kind} after rank 0 joined did not fail")
        # The cached allreduce goes on, rank 0 contributing zeros.
        out = hvd.allreduce(value(rank), op=hvd.Sum, name="c.allreduce")
        expected = sum(r + 1 for r in range(1, size))
        check(torch.equal(out, torch.full((ROWS, 3), float(expected))),
              f"allreduce with a joined rank: {out[0].tolist()}")
        last = hvd.join()
    everyone = hvd.allgather_object(last)
    check(everyone == [everyone[0]] * size and everyone[0] != 0, f"join returned {everyone}")

# After the join every collective works again.
check_results({kind: run() for kind, run in COLLECTIVES.items()})
print(f"rank {rank}: join with cached collectives OK", flush=True)
