"""Exceptions raised by horovodlike, named as in Horovod."""

from horovodlike.common.constants import STATUS_INVALID_ARGUMENT, STATUS_MISMATCH


class HorovodInternalError(RuntimeError):
    """A collective failed inside the runtime: a peer died or stopped answering, or the
    runtime was shut down. The runtime has stopped; call shutdown() and init() to go on."""


class TensorMismatchError(HorovodInternalError):
    """The ranks disagreed about one collective (shape, dtype, op, root...). Only that call
    failed; the runtime keeps working."""


class DeviceMismatchError(ValueError, RuntimeError):
    """The tensors of one grouped call are on different devices (the CPU and a GPU, or two
    GPUs): refused before any is queued. A RuntimeError as in Horovod, and a ValueError as any
    other bad argument here."""


class HostsUpdatedInterrupt(RuntimeError):
    """The set of hosts changed during elastic training."""

    def __init__(self, skip_sync=False):
        super().__init__("hosts updated")
        self.skip_sync = skip_sync


def raise_for_status(code, message):
    """Raises what a failed operation's status code means: TensorMismatchError when the ranks
    disagreed, ValueError for a bad argument, HorovodInternalError otherwise."""
    if code == STATUS_MISMATCH:
        raise TensorMismatchError(message)
    if code == STATUS_INVALID_ARGUMENT:
        raise ValueError(message)
    raise HorovodInternalError(message)
