"""Elastic training, framework-neutral: state that is committed, restored and synchronized,
the run() wrapper that rolls back and re-forms the job when a worker fails or hosts change, and
the worker's side of joining a round formed by the launcher's elastic driver."""

from __future__ import annotations

import copy
import functools
import os

import numpy as np

from horovodlike.common import basics, numpy_ops
from horovodlike.common.constants import Max, Min
from horovodlike.common.exceptions import (HorovodInternalError, HostsUpdatedInterrupt,
                                           TensorMismatchError)
from horovodlike.common.rendezvous_client import RendezvousClient

_attempt = 0          # how many rounds this worker has asked to join
_hosts_version = "0"  # the driver's host-set version when this worker's round was formed
_client = None


def is_elastic():
    return os.environ.get("HOROVOD_ELASTIC") == "1"


def _rendezvous():
    global _client
    if _client is None:
        _client = RendezvousClient.from_environment()
    return _client


def join_round():
    """Tells the driver this worker is ready and waits for its place in the next round; sets
    the HOROVOD_* variables init() reads. Called by init() in an elastic job."""
    global _attempt, _hosts_version
    worker = os.environ["HOROVOD_ELASTIC_WORKER_ID"]
    timeout = float(os.environ.get("HOROVOD_ELASTIC_TIMEOUT", "600"))
    client = _rendezvous()
    client.put(f"elastic/ready/{worker}/{_attempt}", "1")
    value = client.get(f"elastic/assign/{worker}/{_attempt}", timeout)
    _attempt += 1
    if value is None:
        raise HorovodInternalError(f"worker {worker} was not given a place in a round within "
                                   f"{timeout:g} s (HOROVOD_ELASTIC_TIMEOUT)")
    fields = value.split(",")
    if fields[0] == "stop":
        raise HorovodInternalError(f"the elastic driver stopped the job: {','.join(fields[1:])}")
    (round_, rank, size, local_rank, local_size, cross_rank, cross_size,
     _hosts_version) = fields
    os.environ.update({
        "HOROVOD_ELASTIC_ROUND": round_, "HOROVOD_RANK": rank, "HOROVOD_SIZE": size,
        "HOROVOD_LOCAL_RANK": local_rank, "HOROVOD_LOCAL_SIZE": local_size,
        "HOROVOD_CROSS_RANK": cross_rank, "HOROVOD_CROSS_SIZE": cross_size})


def hosts_changed_locally():
    """True when the driver has changed the set of hosts since this worker's round formed."""
    if not is_elastic():
        return False
    value = _rendezvous().get("elastic/hosts_version", 0)
    return value is not None and value != _hosts_version


def any_rank_true(flag, name):
    """True on every rank when ``flag`` is true on any rank (an allreduce with Max)."""
    return bool(_allreduce_int(1 if flag else 0, Max, name))


def _allreduce_int(value, op, name):
    """One int64 reduced over every rank of the job (Max or Min)."""
    buffer = np.array([value], dtype=np.int64)
    try:
        return int(numpy_ops.allreduce(buffer, name, op=op)[0])
    except (TensorMismatchError, ValueError) as e:
        raise HorovodInternalError(str(e)) from None


class State:
    """What elastic training keeps consistent: commit() saves a copy (and checks for host
    changes), restore() goes back to it, sync() makes every rank equal to the rank that holds
    the latest commit (sync_root())."""

    def __init__(self, bcast_object, get_rank):
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._reset_callbacks = []
        self._commits = 0  # commits this state has seen, its own and those synced from others

    def register_reset_callbacks(self, callbacks):
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        self._host_messages = None
        for callback in self._reset_callbacks:
            callback()

    def commit(self):
        """Saves the state; then raises HostsUpdatedInterrupt on every rank if hosts changed."""
        self.save()
        self._commits += 1
        self.check_host_updates()

    def sync_root(self):
        """The rank the others synchronize from: the lowest of those holding the most commits.
        Usually rank 0; not when rank 0 is a worker that joined with nothing committed, or when a
        failure let some ranks complete one more commit than others. Every rank ends up with
        that count."""
        latest = _allreduce_int(self._commits, Max, "elastic.sync_root.commits")
        root = _allreduce_int(self._rank() if self._commits == latest else basics.size(), Min,
                              "elastic.sync_root.rank")
        self._commits = latest
        return root

    def check_host_updates(self):
        """Raises HostsUpdatedInterrupt on every rank (they agree through an allreduce) when the
        driver has added or removed hosts since the round began."""
        changed = self._agree(hosts_changed_locally())
        if changed:
            raise HostsUpdatedInterrupt(skip_sync=False)

    def _agree(self, flag):
        raise NotImplementedError

    def save(self):
        raise NotImplementedError

    def restore(self):
        raise NotImplementedError

    def sync(self):
        raise NotImplementedError

    def reset(self):
        pass


class ObjectState(State):
    """Plain Python attributes (epoch, batch, ...), copied on commit and broadcast on sync."""

    def __init__(self, bcast_object, get_rank, **kwargs):
        super().__init__(bcast_object, get_rank)
        self._saved = {}
        for name, value in kwargs.items():
            setattr(self, name, value)
        self._names = list(kwargs)
        ObjectState.save(self)

    def _agree(self, flag):
        return any_rank_true(flag, "elastic.check_host_updates")

    def save(self):
        self._saved = {name: copy.deepcopy(getattr(self, name)) for name in self._names}

    def restore(self):
        for name, value in self._saved.items():
            setattr(self, name, copy.deepcopy(value))

    def sync(self, root=None):
        """Takes the plain attributes of rank `root` (sync_root() when None)."""
        root = self.sync_root() if root is None else root
        if self._saved:
            self._saved = self._bcast_object(self._saved, root)
            ObjectState.restore(self)


def run_fn(func, reset):
    """Wraps a training function taking a State: on a failed peer the state rolls back to its
    last commit; on a failure or host change the job is re-formed (reset) and the state
    synchronized from rank 0, and the function is called again."""

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        skip_sync = False
        while True:
            try:
                if not skip_sync:
                    state.sync()
                return func(state, *args, **kwargs)
            except HorovodInternalError:
                state.restore()
                skip_sync = False
            except HostsUpdatedInterrupt as interrupt:
                skip_sync = interrupt.skip_sync
            reset()  # the driver enforces --reset-limit when it forms the next round
            state.on_reset()

    return wrapper


def reset_runtime():
    """Leaves the current round and joins the next one."""
    basics.shutdown()
    basics.init()


basics.register_elastic(is_elastic, join_round)
