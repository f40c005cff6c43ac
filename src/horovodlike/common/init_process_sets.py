"""init(process_sets=..., comm=...): the arguments checked before the core starts, and the sets
registered once it runs (plugged into basics.init(), which imports nothing above it)."""

from horovodlike import _core
from horovodlike.common import basics, objects
from horovodlike.common.process_sets import (ProcessSet, _communicator_ranks, _register,
                                             global_process_set)


def prepare(process_sets, comm):
    """The ProcessSet objects of init(process_sets=...) (lists of ranks become sets), after
    checking ``comm``; raises before the core starts."""
    if process_sets is not None:
        process_sets = [ps if isinstance(ps, ProcessSet) else ProcessSet(ps)
                        for ps in process_sets]
    if comm is not None:
        _check_world_communicator(comm)
    return process_sets


def register(process_sets, comm):
    """Once the core runs: the global set's ranks and communicator, and the sets of
    init(process_sets=...)."""
    global_process_set.ranks = list(range(_core.size()))
    if comm is not None or any(ps.mpi_comm is not None for ps in process_sets or ()):
        _check_mpi_ranks()
    if comm is not None:
        global_process_set.mpi_comm = comm
    if process_sets is not None:
        _check_no_duplicates(process_sets)
        _register_at_init(process_sets)


def _check_world_communicator(comm):
    """init(comm=...): horovodlike runs every rank of the job, so the communicator must hold
    every process of MPI.COMM_WORLD, in its order (MPI.COMM_WORLD or a Dup of it)."""
    if not hasattr(comm, "Get_group"):
        raise ValueError(f"init(comm=...) takes an mpi4py communicator, got "
                         f"{type(comm).__name__}; to run collectives among some ranks, "
                         "pass init(process_sets=[...])")
    from mpi4py import MPI  # deferred: mpi4py is optional, needed only with a communicator
    world = MPI.COMM_WORLD.Get_size()
    if comm.Get_size() != world or _communicator_ranks(comm) != list(range(world)) or \
            comm.Get_rank() != MPI.COMM_WORLD.Get_rank():
        raise ValueError(f"init(comm=...): the communicator holds {comm.Get_size()} of the "
                         f"{world} processes of MPI.COMM_WORLD (or orders them otherwise); "
                         "horovodlike runs every rank of the job: pass MPI.COMM_WORLD or a Dup "
                         "of it, and use process_sets=[hvd.ProcessSet(subcommunicator)] for "
                         "collectives among some ranks")


def _check_mpi_ranks():
    """Communicators name ranks of MPI.COMM_WORLD: they must be horovodlike's ranks."""
    from mpi4py import MPI  # deferred: mpi4py is optional, needed only with communicators
    if (MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()) != (_core.rank(), _core.size()):
        raise ValueError(f"mpi4py communicators: MPI.COMM_WORLD has rank "
                         f"{MPI.COMM_WORLD.Get_rank()} of {MPI.COMM_WORLD.Get_size()}, "
                         f"horovodlike rank {_core.rank()} of {_core.size()}; start the job "
                         "with horovodlikerun --mpi so that MPI's ranks are horovodlike's")


def _check_no_duplicates(process_sets):
    """As in Horovod, init(process_sets=...) with two sets of the same ranks (in any order) is a
    ValueError, raised before any set is registered; the runtime stays initialized, so init()
    may be called again with a corrected list. Each rank checks its own list (sets made from
    communicators differ per rank). A set made from a communicator of every rank duplicates
    the global process set."""
    seen = {}
    everyone = list(range(_core.size()))
    for position, process_set in enumerate(process_sets):
        key = tuple(process_set.ranks)
        if process_set.mpi_comm is not None and process_set.ranks == everyone:
            raise ValueError(f"init(process_sets=...) on rank {_core.rank()}: process set "
                             f"{position} of the list is a communicator of every rank "
                             f"{everyone}, a duplicate of the global process set; leave it "
                             "out (use hvd.global_process_set)")
        if key in seen:
            raise ValueError(f"init(process_sets=...) on rank {_core.rank()}: process sets "
                             f"{seen[key]} and {position} of the list both hold ranks "
                             f"{list(key)}; pass each set once")
        seen[key] = position


def _register_at_init(process_sets):
    """init(process_sets=...): gives each set its id. The first such init() of a running job
    (no set registered yet) registers the sets of every rank: each rank may pass other sets
    (those made from communicators differ per rank); they are gathered and numbered in order,
    the first set of every rank (in rank order), then the second ones, and so on, each set
    once; a set of every rank is the global set (0). A later init() only looks the sets up."""
    everyone = tuple(range(_core.size()))
    registered = {tuple(_core.process_set_ranks(i)): i for i in _core.process_set_ids()}
    registered[everyone] = 0
    if len(registered) == 1:
        per_rank = objects.allgather_object([ps.ranks for ps in process_sets],
                                            name="process_sets.init")
        for position in range(max(map(len, per_rank), default=0)):
            for rank_sets in per_rank:
                if position < len(rank_sets) and tuple(rank_sets[position]) not in registered:
                    ranks = list(rank_sets[position])
                    registered[tuple(ranks)] = _register(ProcessSet(ranks)).process_set_id
    missing = [ps for ps in process_sets if tuple(ps.ranks) not in registered]
    if missing:
        raise ValueError(f"init(process_sets=...) on rank {_core.rank()}: "
                         f"{', '.join(str(ps.ranks) for ps in missing)} not registered; the "
                         "job's sets come from its first init(process_sets=...) "
                         f"({sorted(list(r) for r in registered if r != everyone)}); add more "
                         "with hvd.add_process_set() and HOROVOD_DYNAMIC_PROCESS_SETS=1")
    for ps in process_sets:
        ps.process_set_id = registered[tuple(ps.ranks)]


basics.register_process_sets(prepare, register)
