"""Point-to-point between the two ranks of one host in a job that also has a rank on another
host (ranks 0 and 1 on "localhost", rank 2 on "127.0.0.1"): each waits for its host peer
and its TCP peer at once, sleeping in poll(), and the host peer rings its poll bell. Ranks 0
and 1 pass a counter back and forth, rank 2 exchanges with rank 0 between rounds; every
value is checked, and the host's ranks report the rings."""

import torch

import horovodlike.torch as hvd
from horovodlike import _core
from common import check

hvd.init()
rank = hvd.rank()
check(hvd.size() == 3, "needs 3 ranks")
value = torch.zeros(3)
for i in range(200):
    if rank == 0:
        hvd.send(torch.full((3,), 2.0 * i), 1, tag=1)
        hvd.recv(value, 1, tag=2)
        check(value.tolist() == [2.0 * i + 1] * 3, f"round {i}: rank 0 got {value.tolist()}")
    elif rank == 1:
        hvd.recv(value, 0, tag=1)
        check(value.tolist() == [2.0 * i] * 3, f"round {i}: rank 1 got {value.tolist()}")
        hvd.send(value + 1, 0, tag=2)
    if i % 50 == 0 and rank != 1:  # the TCP peer, between the host's rounds
        other = 2 - rank
        hvd.send(torch.full((3,), float(rank)), other, tag=3)
        hvd.recv(value, other, tag=3)
        check(value.tolist() == [float(other)] * 3, f"round {i}: rank {rank} from {other}")
stats = _core.stats()
rings = hvd.allgather_object(stats.get("shm_poll_bells", -1), name="rings")
if rank == 0:
    check(rings[2] in (0, -1) and rings[0] + rings[1] > 0,
          f"poll bells rung by ranks 0, 1, 2: {rings}")
print(f"rank {rank}: poll bells {rings} OK", flush=True)
hvd.shutdown()
