"""Exceptions raised by horovodlike, named as in Horovod."""


class HorovodInternalError(RuntimeError):
    """A collective failed inside the runtime: a peer died or stopped answering, or the
    runtime was shut down. The runtime has stopped; call shutdown() and init() to go on."""


class TensorMismatchError(HorovodInternalError):
    """The ranks disagreed about one collective (shape, dtype, op, root...). Only that call
    failed; the runtime keeps working."""


class HostsUpdatedInterrupt(RuntimeError):
    """The set of hosts changed during elastic training."""

    def __init__(self, skip_sync=False):
        super().__init__("hosts updated")
        self.skip_sync = skip_sync
