"""Point-to-point messages between two ranks, framework-neutral: argument checks, the core's
handles, and interruptible waits. horovodlike.torch.p2p and the NumPy functions at the end sit
on top.

Peers are global ranks, as root ranks are in Horovod; ``process_set`` says which set the
message belongs to (both ranks must be in it), and messages are matched per (process set,
sender, tag) in the order they were sent. There is no negotiation round: a send goes out at
once and completes when written; the receiver keeps it until a receive matches. A receive whose
dtype or number of elements differs from what was sent fails, naming both ranks, and so does the
sender's pending or next operation with that peer.
"""

import threading

import numpy as np

from horovodlike import _core
from horovodlike.common import basics
from horovodlike.common.exceptions import raise_for_status
from horovodlike.common.numpy_ops import DTYPE_CODES, check_array
from horovodlike.common.process_sets import global_process_set, set_id, set_ranks

MAX_TAG = 2 ** 31 - 1
# A wait looks at Python's signals this often, so that Ctrl-C interrupts it.
_WAIT_SLICE_S = 0.1

_abandoned_lock = threading.Lock()
# Buffers of operations whose wait was interrupted: the core may still write into them.
_abandoned = []


def check_peer(peer, process_set, what, role):
    """The peer as an int, after checking it is another rank of the set (and this rank too)."""
    if isinstance(peer, bool) or not isinstance(peer, (int, np.integer)):
        raise TypeError(f"{what}: {role} must be an int (a global rank), got {peer!r}")
    peer = int(peer)
    ranks = list(set_ranks(process_set))
    me = basics.rank()
    where = "this job" if set_id(process_set) == 0 else f"the process set {ranks}"
    if me not in ranks:
        raise ValueError(f"{what}: rank {me} is not in {where}")
    if peer not in ranks:
        raise ValueError(f"{what} on rank {me}: {role} {peer} is not a rank of {where}")
    if peer == me:
        raise ValueError(f"{what} on rank {me}: {role} is this rank itself; point-to-point "
                         "needs two different ranks")
    return peer


def check_tag(tag, what):
    if isinstance(tag, bool) or not isinstance(tag, (int, np.integer)):
        raise TypeError(f"{what}: tag must be an int, got {tag!r}")
    if not 0 <= int(tag) <= MAX_TAG:
        # Named with both ranks: `what` names the peer.
        raise ValueError(f"rank {basics.rank()}: {what}: tag {int(tag)} is out of range; tags "
                         "are integers from 0 to 2**31 - 1")
    return int(tag)


class Work:
    """One send or receive in flight, as ``torch.distributed``'s Work: ``wait()`` blocks until
    it is done (raising what it failed with), ``is_completed()`` does not block. ``wait()`` may
    be interrupted (KeyboardInterrupt); the buffers then stay alive until the core lets go."""

    def __init__(self, core_handle, keep, finish=None):
        self._core_handle = core_handle
        self._keep = keep          # the buffers the core reads or writes until done
        self._finish = finish      # turns the core's output into the result of wait()
        self._result = None
        self._error = None
        self._done = False

    def is_completed(self):
        if self._done:
            return True
        return _core.poll(self._core_handle)

    def wait(self, timeout=None):
        """Waits (at most ``timeout`` seconds, then raises TimeoutError) and returns the
        received data for a receive, None for a send. Waiting again returns the same."""
        if not self._done:
            self._wait(timeout)
        if self._error is not None:
            raise self._error
        return self._result

    def _wait(self, timeout):
        waited = 0.0
        status = None
        # A KeyboardInterrupt or TimeoutError leaves this Work pending: wait() may be called
        # again, and the buffers stay alive until it completes (see __del__).
        while status is None:
            if timeout is not None and waited >= timeout:
                raise TimeoutError(f"point-to-point operation not done after {timeout} s")
            step = _WAIT_SLICE_S if timeout is None else min(_WAIT_SLICE_S, timeout - waited)
            status = _core.wait_for(self._core_handle, step)
            waited += step
        self._done = True
        code, message = status
        try:
            if code != _core.STATUS_OK:
                try:
                    raise_for_status(code, message)
                except Exception as e:  # noqa: BLE001 - kept to raise on every wait()
                    self._error = e
            elif self._finish is not None:
                self._result = self._finish(self._core_handle)
        finally:
            self._keep = None
            _core.release(self._core_handle)

    def __del__(self):
        if not self._done and self._keep is not None:
            # Dropped while pending: the core may still read or write these buffers.
            with _abandoned_lock:
                _abandoned.append((self._core_handle, self._keep))
                _collect_abandoned()

    def exception(self):
        """The error this operation failed with (after it completed), or None."""
        return self._error


def _collect_abandoned():
    still = []
    for core_handle, keep in _abandoned:
        try:
            if _core.poll(core_handle):
                _core.release(core_handle)
                continue
        except Exception:  # noqa: BLE001 - the runtime was shut down: nothing uses it any more
            continue
        still.append((core_handle, keep))
    _abandoned[:] = still


def forget_abandoned():
    with _abandoned_lock:
        _abandoned.clear()


# The core has let go of every buffer once shut down.
basics.register_shutdown_hook(forget_abandoned)


def send_raw(pointer, dtype_code, shape, keep, dst, tag, process_set):
    return Work(_core.send(set_id(process_set), dst, tag, pointer, dtype_code, list(shape)),
                keep)


def recv_raw(pointer, dtype_code, shape, keep, src, tag, process_set, finish):
    return Work(_core.recv(set_id(process_set), src, tag, pointer, dtype_code, list(shape)),
                keep, finish)


def recv_any_raw(src, tag, process_set, finish):
    """A receive whose buffer the core allocates with the sender's dtype and shape;
    ``finish(raw_uint8, shape, dtype_code)`` makes the result of wait()."""
    def unpack(core_handle):
        raw, shape, extra = _core.output(core_handle)
        return finish(raw, list(shape), int(extra[0]))
    return Work(_core.recv(set_id(process_set), src, tag, 0, 0, []), None, unpack)


def notify_failure(process_set, reason):
    """Makes every other rank's pending and later point-to-point operations with this rank in
    ``process_set`` fail with ``reason`` (a stage raised: its neighbours must not wait for it)."""
    _core.notify_failure(set_id(process_set), str(reason))


# ---------------------------------------------------------------------------------- NumPy

_DTYPE_OF_CODE = {c: d for d, c in DTYPE_CODES.items()}


def _numpy_dtype(code):
    if code not in _DTYPE_OF_CODE:
        raise TypeError(f"received a dtype (code {code}) NumPy cannot represent here")
    return _DTYPE_OF_CODE[code]


def send_async(array, dst, tag=0, process_set=global_process_set):
    """Starts sending the NumPy ``array`` to global rank ``dst``; returns a Work."""
    what = "send"
    check_array(array, what)
    dst = peer = check_peer(dst, process_set, what, "dst")
    direction = "to"
    tag = check_tag(tag, f"{what} {direction} rank {peer}")
    source = np.ascontiguousarray(array).reshape(array.shape)
    return send_raw(source.ctypes.data, DTYPE_CODES[source.dtype], source.shape, source, dst,
                    tag, process_set)


def recv_async(src, tag=0, process_set=global_process_set, out=None):
    """Starts receiving from global rank ``src``; ``wait()`` returns the array. Into ``out``
    (its dtype and number of elements must be the sender's) or, without it, a new array of the
    sender's dtype and shape."""
    what = "recv"
    src = peer = check_peer(src, process_set, what, "src")
    direction = "from"
    tag = check_tag(tag, f"{what} {direction} rank {peer}")
    if out is None:
        return recv_any_raw(src, tag, process_set,
                            lambda raw, shape, code: raw.view(_numpy_dtype(code)).reshape(shape)
                            .copy() if raw.size else np.empty(shape, _numpy_dtype(code)))
    check_array(out, what)
    if not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError(f"{what}: out must be a writeable C-contiguous array")
    return recv_raw(out.ctypes.data, DTYPE_CODES[out.dtype], out.shape, out, src, tag,
                    process_set, lambda _: out)


def send(array, dst, tag=0, process_set=global_process_set):
    send_async(array, dst, tag, process_set).wait()


def recv(src, tag=0, process_set=global_process_set, out=None):
    return recv_async(src, tag, process_set, out).wait()
