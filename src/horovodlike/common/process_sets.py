"""Process sets: collectives among a subset of the ranks, as in Horovod.

Every rank must call add_process_set / remove_process_set (they are collective), in the same
order; ranks outside a set may not use it. Root ranks of broadcasts stay global ranks.
"""

import os

from horovodlike import _core
from horovodlike.common.exceptions import HorovodInternalError, TensorMismatchError

from horovodlike.common.constants import ADD_PROCESS_SET as _OP_ADD
from horovodlike.common.constants import REMOVE_PROCESS_SET as _OP_REMOVE


class ProcessSet:
    """A set of global ranks. Usable once registered (``process_set_id`` is set)."""

    def __init__(self, ranks_or_comm):
        """``ranks_or_comm``: global ranks (any order), or an mpi4py communicator, whose members
        (translated to ranks of MPI.COMM_WORLD) form the set; a communicator may hold other
        ranks on each process, as one made by ``Split`` does."""
        self.mpi_comm = None
        if hasattr(ranks_or_comm, "Get_group"):
            self.mpi_comm = ranks_or_comm
            self.ranks = _communicator_ranks(ranks_or_comm)
        else:
            self.ranks = sorted(int(r) for r in ranks_or_comm)
        self.process_set_id = None

    def _invalidate(self):
        self.process_set_id = None

    def size(self):
        """Number of ranks in the set, or None if the set is not registered."""
        if self.process_set_id is None:
            return None
        return len(_core.process_set_ranks(self.process_set_id))

    def rank(self):
        """This process's rank within the set (-1 outside it), or None if not registered."""
        if self.process_set_id is None:
            return None
        ranks = _core.process_set_ranks(self.process_set_id)
        return ranks.index(_core.rank()) if _core.rank() in ranks else -1

    def included(self):
        """Whether this process is in the set."""
        if self.process_set_id == 0:
            return True
        return _core.rank() in self.ranks

    def __eq__(self, other):
        return isinstance(other, ProcessSet) and self.ranks == other.ranks and \
            self.process_set_id == other.process_set_id

    def __hash__(self):
        return hash((tuple(self.ranks), self.process_set_id))

    def __repr__(self):
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"


def _communicator_ranks(comm):
    """The ranks of MPI.COMM_WORLD that an mpi4py communicator holds, sorted (mpi4py is
    imported only here, when a communicator is passed)."""
    from mpi4py import MPI  # deferred: mpi4py is optional, needed only with a communicator
    if comm == MPI.COMM_NULL:
        raise ValueError("ProcessSet(MPI.COMM_NULL): this process is not in the communicator; "
                         "pass a communicator this process belongs to")
    if comm.Is_inter():
        raise ValueError("ProcessSet(communicator): an intercommunicator has two groups; pass "
                         "an intracommunicator")
    group, world = comm.Get_group(), MPI.COMM_WORLD.Get_group()
    try:
        ranks = group.Translate_ranks(list(range(comm.Get_size())), world)
    finally:
        group.Free()
        world.Free()
    if any(r == MPI.UNDEFINED for r in ranks):
        raise ValueError("ProcessSet(communicator): the communicator holds processes outside "
                         "MPI.COMM_WORLD; pass a communicator made from MPI.COMM_WORLD")
    return sorted(int(r) for r in ranks)


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0


def _run(op, name, **change):
    handle = _core.enqueue_control(op, name, **change)
    code, message = _core.wait(handle)
    try:
        if code == _core.STATUS_INVALID_ARGUMENT:
            raise ValueError(message)
        if code == _core.STATUS_MISMATCH:
            raise TensorMismatchError(message)
        if code != _core.STATUS_OK:
            raise HorovodInternalError(message)
        return _core.output(handle)[2][0]
    finally:
        _core.release(handle)


def _register(process_set):
    ranks = process_set.ranks
    name = "process_set.add." + "-".join(map(str, ranks))
    process_set.process_set_id = _run(_OP_ADD, name, ranks=ranks)
    return process_set


def _dynamic_enabled():
    return os.environ.get("HOROVOD_DYNAMIC_PROCESS_SETS", "") not in ("", "0", "false", "False")


def add_process_set(process_set):
    """Registers a process set (a ProcessSet or a list of ranks) on every rank and returns it.

    Collective: all ranks call it with the same ranks. Needs HOROVOD_DYNAMIC_PROCESS_SETS=1
    (sets known at start-up go to init(process_sets=[...]) instead).
    """
    if not _dynamic_enabled():
        raise ValueError("adding process sets after init() needs HOROVOD_DYNAMIC_PROCESS_SETS=1 "
                         "in the environment; or pass them to init(process_sets=[...])")
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set.process_set_id is not None:
        raise ValueError(f"{process_set} is already registered")
    return _register(process_set)


def remove_process_set(process_set):
    """Removes a registered process set on every rank (collective). Returns True if removed."""
    if not _dynamic_enabled():
        raise ValueError("removing process sets needs HOROVOD_DYNAMIC_PROCESS_SETS=1")
    if process_set.process_set_id in (None, 0):
        return False
    _run(_OP_REMOVE, f"process_set.remove.{process_set.process_set_id}",
         process_set_id=process_set.process_set_id)
    process_set._invalidate()
    return True


def set_id(process_set):
    """The id a collective is sent with; raises for an unregistered set."""
    if process_set is None:
        return 0
    if not isinstance(process_set, ProcessSet):
        raise TypeError(f"process_set must be a ProcessSet, got {type(process_set).__name__}")
    if process_set.process_set_id is None:
        raise ValueError(f"{process_set} is not registered: pass it to init(process_sets=...) "
                         "or hvd.add_process_set() first (or it was removed)")
    return process_set.process_set_id


def set_ranks(process_set):
    return _core.process_set_ranks(set_id(process_set))
