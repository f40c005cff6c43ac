"""init/shutdown and the rank/size family, shared by every framework module."""

import atexit
import os

from horovodlike import _core
from horovodlike.common.exceptions import HorovodInternalError

_atexit_registered = False
_ELASTIC_ROUND_ATTEMPTS = 10
# Called after each successful init(): the framework layers restart the counters that name
# unnamed collectives, so that ranks agree on those names in a job formed by processes with
# different pasts (a reused Spark worker, a worker that joined an elastic job late).
_init_hooks = []


def register_init_hook(hook):
    _init_hooks.append(hook)


def init(comm=None, process_sets=None):
    """Starts the runtime: connects to the other ranks of the job started by horovodlikerun.

    ``process_sets``: ProcessSet objects (or lists of ranks) to register at start-up; every rank
    passes the same ones. ``comm`` (an mpi4py communicator) is not supported.
    """
    global _atexit_registered
    if comm is not None:
        raise ValueError("init(comm=...) is not supported; start the job with horovodlikerun")
    if process_sets is not None and not isinstance(process_sets, (list, tuple)):
        raise TypeError("process_sets must be a list of ProcessSet objects or lists of ranks")
    from horovodlike.common import elastic
    starting = not _core.is_initialized()  # init() of a running job changes nothing
    for attempt in range(_ELASTIC_ROUND_ATTEMPTS):
        if elastic.is_elastic() and not _core.is_initialized():
            elastic.join_round()  # the driver tells this worker its rank in the next round
        try:
            _core.init()
            break
        except RuntimeError as e:
            if not elastic.is_elastic() or attempt + 1 == _ELASTIC_ROUND_ATTEMPTS:
                raise HorovodInternalError(f"horovodlike.init() failed: {e}") from None
            # A member of the round died while it formed: the driver forms another.
    for hook in _init_hooks if starting else ():
        hook()
    if starting:
        _pin_background_thread()
    from horovodlike.common import process_sets as _sets
    _sets.global_process_set.ranks = list(range(_core.size()))
    process_sets = [ps if isinstance(ps, _sets.ProcessSet) else _sets.ProcessSet(ps)
                    for ps in process_sets or []]
    _check_no_duplicates(process_sets)
    for process_set in process_sets:
        if process_set.ranks == list(range(_core.size())):
            process_set.process_set_id = 0  # the global set itself
        else:
            _sets._register(process_set)
    if not _atexit_registered:
        atexit.register(_core.shutdown)
        _atexit_registered = True


def _check_no_duplicates(process_sets):
    """As in Horovod, init(process_sets=...) with two sets of the same ranks (in any order) is a
    ValueError, raised before any set is registered; the runtime stays initialized, so init()
    may be called again with a corrected list."""
    seen = {}
    for position, process_set in enumerate(process_sets):
        key = tuple(process_set.ranks)
        if key in seen:
            raise ValueError(f"init(process_sets=...): process sets {seen[key]} and {position} of "
                             f"the list both hold ranks {list(key)}; pass each set once")
        seen[key] = position


def _get_process_set_ids_and_ranks():
    """{process set id: its global ranks} for every registered set, the global set (0)
    included; at Horovod's path (``hvd.mpi_ops._basics``), which its tests call."""
    return {ps_id: list(_core.process_set_ranks(ps_id)) for ps_id in _core.process_set_ids()}


def _pin_background_thread():
    """HOROVOD_THREAD_AFFINITY (horovodlikerun --thread-affinity): CPU numbers, one per local
    rank; pins this rank's background thread (named hvdl-loop) to its CPU."""
    value = os.environ.get("HOROVOD_THREAD_AFFINITY", "").strip()
    if not value:
        return
    try:
        cores = [int(core) for core in value.split(",")]
    except ValueError:
        raise ValueError(f"HOROVOD_THREAD_AFFINITY must be CPU numbers separated by commas, "
                         f"got '{value}'") from None
    if len(cores) < _core.local_size():
        raise ValueError(f"HOROVOD_THREAD_AFFINITY gives {len(cores)} CPUs for "
                         f"{_core.local_size()} local ranks; give one per local rank")
    core = cores[_core.local_rank()]
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                if f.read().strip() != "hvdl-loop":
                    continue
            os.sched_setaffinity(int(task), {core})
        except FileNotFoundError:
            continue  # a thread that ended meanwhile
        except OSError as e:
            raise ValueError(f"HOROVOD_THREAD_AFFINITY: cannot pin the background thread of "
                             f"local rank {_core.local_rank()} to CPU {core}: {e}") from None


def shutdown():
    """Stops the runtime. Pending operations fail on every rank; init() may be called again."""
    _core.shutdown()
    # The core has let go of every buffer: forget the ones kept for interrupted waits.
    from horovodlike.common import point_to_point
    point_to_point.forget_abandoned()


def start_timeline(file_path, mark_cycles=False):
    """Starts writing the Horovod timeline (a Chrome trace: chrome://tracing, Perfetto) to
    ``file_path``; a recording already in progress ends first. ``mark_cycles``: also mark the
    rounds of the background loop (CYCLE_START). Rank 0 records, as with HOROVOD_TIMELINE; on
    the other ranks this does nothing. Raises ValueError naming the path when it cannot be
    written."""
    if not isinstance(file_path, (str, bytes)) and not hasattr(file_path, "__fspath__"):
        raise TypeError(f"start_timeline: file_path must be a path, not {type(file_path).__name__}")
    _core.start_timeline(os.fsdecode(file_path), bool(mark_cycles))


def stop_timeline():
    """Ends the timeline started by start_timeline() or HOROVOD_TIMELINE and closes its file."""
    _core.stop_timeline()


def is_initialized():
    return _core.is_initialized()


def rank():
    return _core.rank()


def size():
    return _core.size()


def local_rank():
    return _core.local_rank()


def local_size():
    return _core.local_size()


def cross_rank():
    return _core.cross_rank()


def cross_size():
    return _core.cross_size()


def is_homogeneous():
    """True when every host runs the same number of ranks."""
    return _core.size() == _core.local_size() * _core.cross_size()


def _runtime_stats():
    """This rank's counters and the tuned parameters in force: allreduce_collectives,
    allreduce_tensors, errors, fusion_threshold_bytes, cycle_time_ms, cache_enabled,
    parameters_round (the negotiation round in which they took effect, numbered alike on every
    rank), autotune (HOROVOD_AUTOTUNE is on) and autotune_done (it fixed its choice)."""
    return dict(_core.stats())


def build_info():
    return dict(_core.build_info())


def mpi_built():
    return bool(_core.build_info()["mpi"])


def gloo_built():
    return bool(_core.build_info()["gloo"])


def nccl_built():
    return bool(_core.build_info()["nccl"])


def ddl_built():
    return False


def ccl_built():
    return False


def cuda_built():
    return bool(_core.build_info()["nccl"])


def rocm_built():
    return False


def _cpu_operations():
    """The transport the running job uses ("tcp", "shm+tcp", "mpi", "gloo"...); None before
    init()."""
    return _core.build_info().get("cpu_operations")


def mpi_enabled():
    """True when the running job communicates over MPI (a job started by mpirun)."""
    return _cpu_operations() == "mpi"


def gloo_enabled():
    """True when the running job communicates over Gloo (horovodlikerun --gloo)."""
    return _cpu_operations() == "gloo"


def mpi_threads_supported():
    return False

