"""The link API's tagged messages (isend/irecv returning a request), straight on the job's link
through `_core._testing.tagged_exchange`: every pair of ranks exchanges messages on several tags
and sizes, the receives posted in another order than the sends (so some messages arrive before
their receive and wait per tag), and the bytes are checked against NumPy's. Then a receive of
the wrong size fails with the link's error, naming the sender and the receive's size."""

import sys

import numpy as np

from horovodlike import _core
from horovodlike.common import basics
from horovodlike.common import numpy_ops as ops

basics.init()
rank, size = basics.rank(), basics.size()
TAGS = [2, 3, 7, 1000]
SIZES = {2: 0, 3: 1, 7: 65537, 1000: 3 << 20}  # empty, one byte, beyond a buffer, megabytes


def payload(sender, tag, index):
    """What `sender` sends on `tag` as its `index`-th message there, computed independently."""
    rng = np.random.default_rng(sender * 100003 + tag * 101 + index)
    return rng.integers(0, 256, SIZES[tag] + index, dtype=np.uint8).tobytes()


for peer in range(size):
    if peer == rank:
        continue
    # Two messages per tag, in tag order; received in reverse tag order.
    sends = [(tag, payload(rank, tag, i)) for tag in TAGS for i in range(2)]
    receives = [(tag, SIZES[tag] + i) for tag in reversed(TAGS) for i in range(2)]
    got = _core._testing.tagged_exchange(peer, sends, receives)
    expected = [payload(peer, tag, i) for tag in reversed(TAGS) for i in range(2)]
    for (tag, n), have, want in zip(receives, got, expected):
        assert len(have) == n and have == want, f"rank {rank} from {peer} tag {tag}: wrong bytes"

if size >= 2 and rank < 2:
    peer = 1 - rank
    try:
        # Rank 0 sends 16 bytes; rank 1 expects 8 and must fail, naming both sizes.
        if rank == 0:
            _core._testing.tagged_exchange(peer, [(9, b"x" * 16)], [])
        else:
            _core._testing.tagged_exchange(peer, [], [(9, 8)])
            sys.exit(f"rank {rank}: a 16-byte message filled an 8-byte receive")
    except RuntimeError as e:
        assert rank == 1 and "rank 0" in str(e) and "receive of 8 bytes" in str(e), str(e)
if size >= 2 and _core.build_info()["point_to_point"] != "mpi":
    # A receive given up before its message came leaves the line: the message reaches the
    # next receive of its tag (MPI cancels its own).
    if rank == 1:
        _core._testing.tagged_withdraw(0, 11, 3 << 20)
    ops.allreduce(np.zeros(1), "withdrawn", op=ops.Sum)  # only then does rank 0 send
    message = payload(0, 1000, 5)[: 3 << 20]
    if rank == 0:
        _core._testing.tagged_exchange(1, [(11, message)], [])
    elif rank == 1:
        got = _core._testing.tagged_exchange(0, [], [(11, 3 << 20)])
        assert got[0] == message, f"rank {rank}: the message after a withdrawn receive"
# Every rank is done with its exchanges before any shuts down.
ops.allreduce(np.zeros(1), "done", op=ops.Sum)
print(f"rank {rank}: link={_core.build_info()['point_to_point']} tagged OK", flush=True)
basics.shutdown()
