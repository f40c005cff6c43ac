"""Point-to-point between real ranks: values against NumPy, ordering, process sets, bad input,
mismatched sizes, failure notices and interrupted waits. Usage: p2p_worker.py MODE."""

import os
import signal
import sys
import time

import numpy as np
import torch

import horovodlike.torch as hvd
from horovodlike.common import point_to_point as np_p2p
from common import (TORCH_DTYPES, as_float64, check, kill_self, rank_input, seconds_since_kill,
                    to_torch)

mode = sys.argv[1]
hvd.init()
rank, size = hvd.rank(), hvd.size()


def expect_error(kind, fragments, call):
    try:
        call()
    except kind as e:
        for fragment in fragments:
            check(fragment in str(e), f"{kind.__name__} '{e}' does not mention '{fragment}'")
        return e
    raise AssertionError(f"expected {kind.__name__} mentioning {fragments}")


def values(dtype, shape, sender, receiver, seed):
    count = int(np.prod(shape))
    flat = rank_input(dtype, count, sender * 100 + receiver, seed)
    return flat.reshape(shape)


def ring_exchange():
    """Every rank sends to the next and receives from the previous, every dtype and several
    shapes (empty and 0-d too), all at once through batch_isend_irecv."""
    right, left = (rank + 1) % size, (rank - 1) % size
    cases = [(dtype, shape) for dtype in TORCH_DTYPES
             for shape in [(), (0,), (7,), (3, 5, 2)]]
    ops, received = [], []
    for i, (dtype, shape) in enumerate(cases):
        out = torch.zeros(shape, dtype=TORCH_DTYPES[dtype])
        ops.append(hvd.P2POp(hvd.isend, to_torch(values(dtype, shape, rank, right, i), dtype),
                             right, tag=i))
        ops.append(hvd.P2POp(hvd.irecv, out, left, tag=i))
        received.append(out)
    for work in hvd.batch_isend_irecv(ops):
        work.wait()
    for i, ((dtype, shape), out) in enumerate(zip(cases, received)):
        expected = values(dtype, shape, left, rank, i)
        check(out.shape == torch.Size(shape), f"{dtype} {shape}: got shape {tuple(out.shape)}")
        check(np.array_equal(as_float64(out), expected), f"{dtype} {shape}: wrong values")


def ordering_and_tags():
    """Rank 0 sends three messages on tag 1 and one on tag 2; rank 1 takes tag 2 first, then
    tag 1's in the order they were sent. A large message, a non-contiguous target and a
    receive of a shape the sender decides go along."""
    big = np.arange(3 << 20, dtype=np.float32)  # 12 MB: more than any socket buffer
    if rank == 0:
        works = [hvd.isend(torch.full((4,), float(k)), 1, tag=1) for k in range(3)]
        hvd.send(torch.tensor([42.0]), 1, tag=2)
        hvd.send(torch.from_numpy(big), 1, tag=3)
        hvd.send(torch.arange(6.0).reshape(2, 3), 1, tag=4)
        hvd.send(torch.arange(12, dtype=torch.int16).reshape(3, 4), 1, tag=5)
        for work in works:
            check(work.wait() is None, "a send's wait() returns None")
    elif rank == 1:
        first = torch.zeros(1)
        hvd.recv(first, 0, tag=2)
        check(first.item() == 42.0, f"tag 2: {first}")
        for k in range(3):
            out = torch.zeros(4)
            check(hvd.recv(out, 0, tag=1) == 0, "recv returns the sender's rank")
            check(torch.equal(out, torch.full((4,), float(k))), f"tag 1 message {k}: {out}")
        out = hvd.irecv(torch.zeros(3 << 20), 0, tag=3).wait()
        check(np.array_equal(out.numpy(), big), "the 12 MB message differs")
        target = torch.zeros(3, 2).t()  # not contiguous
        hvd.recv(target, 0, tag=4)
        check(torch.equal(target, torch.arange(6.0).reshape(2, 3)), f"non-contiguous: {target}")
        any_shape = hvd.irecv_any(0, tag=5).wait()
        check(any_shape.dtype == torch.int16 and tuple(any_shape.shape) == (3, 4) and
              torch.equal(any_shape, torch.arange(12, dtype=torch.int16).reshape(3, 4)),
              f"irecv_any: {any_shape}")


def process_sets_and_numpy(pair):
    """Messages of the same tag in two process sets are kept apart; the NumPy API too."""
    if rank == 0:
        hvd.send(torch.tensor([1.0]), 1, tag=0, process_set=pair)
        hvd.send(torch.tensor([2.0]), 1, tag=0)
        np_p2p.send(np.arange(5, dtype=np.int64), 1, tag=9)
    elif rank == 1:
        out = torch.zeros(1)
        hvd.recv(out, 0, tag=0)  # the global set's message, though the other came first
        check(out.item() == 2.0, f"global set: {out}")
        hvd.recv(out, 0, tag=0, process_set=pair)
        check(out.item() == 1.0, f"pair set: {out}")
        got = np_p2p.recv(0, tag=9)
        check(got.dtype == np.int64 and np.array_equal(got, np.arange(5)), f"numpy: {got}")


def bad_input(pair):
    """Bad input raises before anything is sent: the exchange after it gets the right message."""
    x = torch.ones(3)
    peer = 1 - rank if rank < 2 else 0
    expect_error(ValueError, ["dst", str(size), "not a rank of this job"],
                 lambda: hvd.send(x, size, tag=0))
    expect_error(ValueError, ["dst", "this rank itself"], lambda: hvd.send(x, rank))
    expect_error(ValueError, [f"rank {rank}: isend to rank {peer}: tag -1", "2**31 - 1"],
                 lambda: hvd.send(x, peer, tag=-1))
    expect_error(ValueError, [f"rank {rank}: irecv from rank {peer}: tag -3"],
                 lambda: hvd.recv(x, peer, tag=-3))
    expect_error(TypeError, ["dst must be an int"], lambda: hvd.isend(x, 1.0))
    expect_error(TypeError, ["dtype complex64"],
                 lambda: hvd.send(torch.zeros(2, dtype=torch.complex64), peer))
    expect_error(TypeError, ["list of P2POp"], lambda: hvd.batch_isend_irecv([x]))
    # One bad operation in a batch: none of them starts.
    expect_error(ValueError, ["tag -2"], lambda: hvd.batch_isend_irecv(
        [hvd.P2POp(hvd.isend, torch.full((3,), 7.0), peer, tag=0),
         hvd.P2POp(hvd.isend, x, peer, tag=-2)]))
    if rank == 2:
        expect_error(ValueError, ["rank 2 is not in the process set [0, 1]"],
                     lambda: hvd.send(x, 0, process_set=pair))
    if rank == 0 and size > 2:
        expect_error(ValueError, ["dst 2 is not a rank of the process set [0, 1]"],
                     lambda: hvd.send(x, 2, process_set=pair))
    if rank < 2:
        hvd.send(torch.full((3,), float(rank)), peer, tag=0)
        out = torch.zeros(3)
        hvd.recv(out, peer, tag=0)
        check(torch.equal(out, torch.full((3,), float(peer))),
              f"a message from the failed calls arrived: {out}")


def mismatch():
    """Rank 0 sends 8 floats where rank 1 expects 4: rank 1's recv raises naming both ranks,
    rank 0's next operation with rank 1 raises the same; afterwards both go on."""
    if rank == 0:
        hvd.send(torch.ones(8), 1, tag=5)
        reply = torch.zeros(1)
        expect_error(hvd.TensorMismatchError,
                     ["rank 0 sent float32 [8]", "rank 1", "expects float32 [4]"],
                     lambda: hvd.recv(reply, 1, tag=6))
        hvd.send(torch.full((4,), 3.0), 1, tag=5)
        hvd.recv(reply, 1, tag=7)
        check(reply.item() == 1.0, f"after the mismatch: {reply}")
    elif rank == 1:
        out = torch.zeros(4)
        expect_error(hvd.TensorMismatchError,
                     ["rank 0 sent float32 [8] with tag 5", "to rank 1",
                      "expects float32 [4]"], lambda: hvd.recv(out, 0, tag=5))
        hvd.recv(out, 0, tag=5)
        check(torch.equal(out, torch.full((4,), 3.0)), f"after the mismatch: {out}")
        hvd.send(torch.ones(1), 0, tag=7)


def failure_notice():
    """A rank that fails tells its peers: their pending receive raises with its reason."""
    if rank == 1:
        np_p2p.notify_failure(hvd.global_process_set, "stage 1 raised ValueError: boom")
    elif rank == 0:
        expect_error(hvd.HorovodInternalError, ["stage 1 raised ValueError: boom"],
                     lambda: hvd.recv(torch.zeros(1), 1, tag=0))


def inside(frame, function):
    """Whether `frame` runs within a call of `function` (a name in point_to_point.py)."""
    while frame is not None:
        code = frame.f_code
        if code.co_name == function and code.co_filename == np_p2p.__file__:
            return True
        frame = frame.f_back
    return False


def interrupted_wait():
    """A wait interrupted by a signal handler's exception leaves the receive pending; waiting
    again gets the message."""
    if rank == 0:
        work = hvd.irecv(torch.zeros(2), 1, tag=11)

        def on_alarm(signum, frame):
            # Interrupts the wait, not the lines before it: on a busy machine the timer may
            # go off before wait() is reached; it then tries again a little later.
            if not inside(frame, "_wait"):
                signal.setitimer(signal.ITIMER_REAL, 0.1)
                return
            signal.setitimer(signal.ITIMER_REAL, 0)
            raise KeyboardInterrupt

        signal.signal(signal.SIGALRM, on_alarm)
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        expect_error(KeyboardInterrupt, [], work.wait)
        check(not work.is_completed(), "the receive completed without a message")
        hvd.send(torch.ones(1), 1, tag=12)  # now rank 1 sends
        out = work.wait(timeout=30)
        check(torch.equal(out, torch.full((2,), 5.0)), f"after the interrupt: {out}")
    elif rank == 1:
        hvd.recv(torch.zeros(1), 0, tag=12)
        hvd.send(torch.full((2,), 5.0), 0, tag=11)


def autograd_chain():
    """A model split over every rank by hand: rank r applies tanh(h @ W_r) and passes h on with
    send_differentiable / recv_differentiable; the last rank's loss backpropagates through
    every rank. Gradients equal one process's, twice in a row on the same tag."""
    torch.manual_seed(3)
    weights = [torch.randn(3, 3, dtype=torch.float64) for _ in range(size)]
    x_ref = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    w_ref = [w.clone().requires_grad_() for w in weights]
    h = x_ref
    for w in w_ref:
        h = torch.tanh(h @ w)
    (h ** 2).sum().backward()
    for _ in range(2):
        w = weights[rank].clone().requires_grad_()
        x = x_ref.detach().clone().requires_grad_()
        h = x if rank == 0 else hvd.recv_differentiable(rank - 1, tag=31)
        check(h.requires_grad and h.dtype == torch.float64, "the received tensor is in the graph")
        h = torch.tanh(h @ w)
        if rank == size - 1:
            (h ** 2).sum().backward()
        else:
            hvd.send_differentiable(h, rank + 1, tag=31).backward()
        check(torch.allclose(w.grad, w_ref[rank].grad, rtol=1e-10),
              f"weight gradient {w.grad} != {w_ref[rank].grad}")
        if rank == 0:
            check(torch.allclose(x.grad, x_ref.grad, rtol=1e-10), "input gradient")
    expect_error(TypeError, ["floating-point"],
                 lambda: hvd.send_differentiable(torch.ones(2, dtype=torch.int32), 1 - rank % 2))


def beside_collectives():
    """Messages in flight while collectives run over the job's transport: neither holds up the
    other, and both give the right values."""
    peer = 1 - rank if rank < 2 else None
    if peer is None:
        hvd.allreduce(torch.ones(1), op=hvd.Sum, name="beside.0")
        hvd.allreduce(torch.ones(1 << 16), op=hvd.Sum, name="beside.1")
        return
    work = hvd.isend(torch.full((1 << 16,), float(rank)), peer, tag=21)
    small = hvd.allreduce(torch.ones(1), op=hvd.Sum, name="beside.0")
    out = hvd.irecv(torch.zeros(1 << 16), peer, tag=21).wait()
    big = hvd.allreduce(torch.ones(1 << 16), op=hvd.Sum, name="beside.1")
    work.wait()
    check(torch.equal(out, torch.full((1 << 16,), float(peer))), f"beside collectives: {out[:3]}")
    check(small.item() == size and torch.all(big == size), "collectives beside p2p")


if mode == "transport":
    # The job's collectives go over the transport the launcher was asked for; point-to-point
    # works beside it.
    from horovodlike.common.basics import build_info
    ring_exchange()
    ordering_and_tags()
    beside_collectives()
    hvd.barrier()
    info = build_info()
    print(f"rank {rank}: transport={info['cpu_operations']} "
          f"point_to_point={info['point_to_point']} p2p OK", flush=True)
elif mode == "correctness":
    pair = hvd.add_process_set([0, 1])
    ring_exchange()
    ordering_and_tags()
    process_sets_and_numpy(pair)
    autograd_chain()
    hvd.barrier()
    print(f"rank {rank}: p2p OK", flush=True)
elif mode == "errors":
    pair = hvd.add_process_set([0, 1])
    bad_input(pair)
    mismatch()
    interrupted_wait()
    failure_notice()
    hvd.barrier()
    print(f"rank {rank}: p2p errors OK", flush=True)
elif mode == "farewell":
    # Rank 1 sends and shuts down at once; rank 0 asks for the message only once it knows rank
    # 1 is gone (its sends start failing): the message is still delivered, and a receive of
    # one that never came raises instead of waiting.
    if rank == 1:
        hvd.send(torch.arange(5.0), 0, tag=40)
        hvd.shutdown()
    else:
        deadline = time.time() + 60
        while True:
            try:
                hvd.send(torch.ones(1), 1, tag=41)
            except hvd.HorovodInternalError:
                break
            check(time.time() < deadline, "rank 1's shutdown was never noticed")
            time.sleep(0.05)
        out = torch.zeros(5)
        hvd.recv(out, 1, tag=40)
        check(torch.equal(out, torch.arange(5.0)), f"the last message: {out}")
        expect_error(hvd.HorovodInternalError, ["rank 1"], lambda: hvd.recv(out, 1, tag=42))
    print(f"rank {rank}: p2p farewell OK", flush=True)
elif mode == "kill":
    # Rank 1 dies while rank 0 waits for its message; rank 0 must raise within seconds.
    report_dir = sys.argv[2]
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # report before the launcher stops this rank
    peer = 1 - rank
    hvd.send(torch.ones(2), peer)
    hvd.recv(torch.zeros(2), peer)
    if rank == 1:
        kill_self(report_dir)
    try:
        hvd.recv(torch.zeros(2), 1, tag=3)
        outcome = "no error"
    except hvd.HorovodInternalError as e:
        outcome = f"HorovodInternalError after {seconds_since_kill(report_dir):.2f} s: {e}"
    try:
        hvd.send(torch.ones(1), 1)
        later = "no error"
    except hvd.HorovodInternalError:
        later = "HorovodInternalError"
    with open(os.path.join(report_dir, f"rank{rank}.txt"), "w") as f:
        f.write(outcome + "\n" + later + "\n")
