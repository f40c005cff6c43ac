"""init/shutdown and the rank/size family, shared by every framework module."""

import atexit

from horovodlike import _core
from horovodlike.common.exceptions import HorovodInternalError

_atexit_registered = False


def init(comm=None, process_sets=None):
    """Starts the runtime: connects to the other ranks of the job started by horovodlikerun.

    ``comm`` and ``process_sets`` are accepted for Horovod compatibility; only their default
    (all ranks) is supported by this version.
    """
    global _atexit_registered
    if comm is not None:
        raise ValueError("init(comm=...) needs the MPI transport, which this build does not have")
    if process_sets is not None:
        raise ValueError("init(process_sets=...) is not supported by this version")
    try:
        _core.init()
    except RuntimeError as e:
        raise HorovodInternalError(f"horovodlike.init() failed: {e}") from None
    if not _atexit_registered:
        atexit.register(_core.shutdown)
        _atexit_registered = True


def shutdown():
    """Stops the runtime. Pending operations fail on every rank; init() may be called again."""
    _core.shutdown()


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


def mpi_enabled():
    return False


def gloo_enabled():
    return False


def mpi_threads_supported():
    return False

