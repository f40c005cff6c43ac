"""init/shutdown and the rank/size family, shared by every framework module."""

import atexit
import os
import re

from horovodlike import _core
from horovodlike.common.backends import GLOO, MPI
from horovodlike.common.exceptions import HorovodInternalError

_atexit_registered = False
_ELASTIC_ROUND_ATTEMPTS = 10

# The modules above this one plug into init() and shutdown() here, so that this module imports
# none of them (common/__init__.py imports them all, so they are registered before any init()).
# Before the core starts: the launcher watch (launcher_watch.py).
_before_start = []
# After each successful start: the framework layers restart the counters that name unnamed
# collectives, so that ranks agree on those names in a job formed by processes with different
# pasts (a reused Spark worker, a worker that joined an elastic job late).
_init_hooks = []
# After shutdown: forget the buffers kept for interrupted waits (point_to_point.py).
_shutdown_hooks = []
# Elastic jobs (elastic.py): (is_elastic(), join_round()) for the worker's place in each round.
_elastic = (lambda: False, None)
# init(process_sets=..., comm=...) (init_process_sets.py): prepare(process_sets, comm) checks the
# arguments before the core starts and returns the ProcessSet objects; register(those, comm)
# registers them once it runs.
_process_sets = None


def register_before_start(hook):
    _before_start.append(hook)


def register_init_hook(hook):
    _init_hooks.append(hook)


def register_shutdown_hook(hook):
    _shutdown_hooks.append(hook)


def register_elastic(is_elastic, join_round):
    global _elastic
    _elastic = (is_elastic, join_round)


def register_process_sets(prepare, register):
    global _process_sets
    _process_sets = (prepare, register)


def init(comm=None, process_sets=None):
    """Starts the runtime: connects to the other ranks of the job started by horovodlikerun.

    ``process_sets``: ProcessSet objects (or lists of ranks) to register at start-up. Each rank
    may pass other sets (a set made from an mpi4py communicator holds, on each rank, the
    members of that rank's communicator); the first init(process_sets=...) registers the sets
    of every rank, numbered in order. ``comm``: an mpi4py communicator of every rank of
    MPI.COMM_WORLD (a job started with ``horovodlikerun --mpi``); it becomes
    ``global_process_set.mpi_comm``.
    """
    global _atexit_registered
    if process_sets is not None and not isinstance(process_sets, (list, tuple)):
        raise TypeError("process_sets must be a list of ProcessSet objects or lists of ranks")
    prepare_sets, register_sets = _process_sets
    process_sets = prepare_sets(process_sets, comm)
    for hook in _before_start:
        hook()  # a rank whose launcher dies ends too, with its children
    starting = not _core.is_initialized()  # init() of a running job changes nothing
    _start_core()
    for hook in _init_hooks if starting else ():
        hook()
    if starting:
        _pin_background_thread()
    if not _atexit_registered:
        atexit.register(_core.shutdown)
        _atexit_registered = True
    register_sets(process_sets, comm)


def _start_core():
    is_elastic, join_round = _elastic
    for attempt in range(_ELASTIC_ROUND_ATTEMPTS):
        if is_elastic() and not _core.is_initialized():
            join_round()  # the driver tells this worker its rank in the next round
        try:
            _core.init()
            return
        except RuntimeError as e:
            if not is_elastic() or attempt + 1 == _ELASTIC_ROUND_ATTEMPTS:
                raise HorovodInternalError(f"horovodlike.init() failed: {e}") from None
            # A member of the round died while it formed: the driver forms another.


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
    for hook in _shutdown_hooks:
        hook()


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
    return bool(_core.build_info()[MPI])


def gloo_built():
    return bool(_core.build_info()[GLOO])


def _gpu_info():
    """The core's report on the CUDA runtime and NCCL it found (``_core.gpu_info()``)."""
    return dict(_core.gpu_info())


def _nccl_version_code(version):
    """NCCL's NCCL_VERSION_CODE: major*10000 + minor*100 + patch from 2.9 on (2.23.5 is 22305),
    major*1000 + minor*100 + patch before; ``version`` is that int or "2.23.5"."""
    if isinstance(version, int) and not isinstance(version, bool):
        return version
    found = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", str(version))
    if found is None:
        return 0
    major, minor, patch = (int(part or 0) for part in found.groups())
    if (major, minor) >= (2, 9):
        return major * 10000 + minor * 100 + patch
    return major * 1000 + minor * 100 + patch


def nccl_built():
    """As in Horovod, NCCL's version code (e.g. 22305 for 2.23.5) when NCCL is available, else
    0. The core loads NCCL at run time, so this says whether it found a loadable libnccl
    (``horovodlikerun --check-build`` says where, or why not)."""
    nccl = _gpu_info().get("nccl") or {}
    return _nccl_version_code(nccl.get("version")) if nccl.get("found") else 0


def ddl_built():
    return False


def ccl_built():
    return False


def cuda_built():
    """True when the core found a loadable CUDA runtime (it is loaded at run time, so one build
    serves machines with and without GPUs)."""
    return bool((_gpu_info().get("cuda") or {}).get("found"))


def rocm_built():
    return False


def _cpu_operations():
    """The transport the running job uses ("tcp", "shm+tcp", "mpi", "gloo"...); None before
    init()."""
    return _core.build_info().get("cpu_operations")


def mpi_enabled():
    """True when the running job communicates over MPI (a job started by mpirun)."""
    return _cpu_operations() == MPI


def gloo_enabled():
    """True when the running job communicates over Gloo (horovodlikerun --gloo)."""
    return _cpu_operations() == GLOO


def mpi_threads_supported():
    return False

