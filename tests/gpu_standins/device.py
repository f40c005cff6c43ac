"""ctypes helpers for the stand-in CUDA runtime and NCCL (tests and worker scripts).

Device memory of the stand-in is host memory, so `write` and `read` touch it directly (no
stream ordering: synchronize first). The core dlopens the same file paths, so a process that
loads a library here and also runs the core shares one copy (one log, one memory table).
"""

import ctypes
import time

import numpy as np

NCCL_DTYPES = {"int8": 0, "uint8": 1, "int32": 2, "uint32": 3, "int64": 4, "uint64": 5,
               "float16": 6, "float32": 7, "float64": 8, "bfloat16": 9}
NCCL_OPS = {"sum": 0, "prod": 1, "max": 2, "min": 3, "avg": 4}


class CudaError(RuntimeError):
    def __init__(self, code, what, name=""):
        super().__init__(f"{what}: CUDA error {code} {name}".rstrip())
        self.code = code


class NcclError(RuntimeError):
    def __init__(self, code, what, text=""):
        super().__init__(f"{what}: NCCL error {code} ({text})")
        self.code = code


def _handle(value):
    return int(value or 0)


def to_bfloat16(values):
    """float32 values -> bfloat16 bit patterns (uint16), rounding to nearest even."""
    u = np.asarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    quiet_nan = ((u >> 16) | 0x40).astype(np.uint16)
    return np.where((u & 0x7FFFFFFF) > 0x7F800000, quiet_nan, rounded)


def from_bfloat16(bits):
    """bfloat16 bit patterns (uint16) -> float32."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def _dtype(dtype):
    return NCCL_DTYPES.get(dtype, dtype)


def _op(op):
    return NCCL_OPS.get(op, op)


class StandinCuda:
    """The stand-in CUDA runtime at `path`. Handles (pointers, streams, events) are ints."""

    def __init__(self, path):
        self.path = str(path)
        self.lib = lib = ctypes.CDLL(self.path)
        vp, sz, i, u = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_uint
        signatures = {
            "cudaGetDeviceCount": [ctypes.POINTER(i)], "cudaSetDevice": [i],
            "cudaGetDevice": [ctypes.POINTER(i)], "cudaDeviceGetPCIBusId": [ctypes.c_char_p, i, i],
            "cudaStreamCreateWithFlags": [ctypes.POINTER(vp), u], "cudaStreamDestroy": [vp],
            "cudaStreamSynchronize": [vp], "cudaStreamWaitEvent": [vp, vp, u],
            "cudaEventCreateWithFlags": [ctypes.POINTER(vp), u], "cudaEventDestroy": [vp],
            "cudaEventRecord": [vp, vp], "cudaEventQuery": [vp], "cudaEventSynchronize": [vp],
            "cudaMemcpyAsync": [vp, vp, sz, i, vp], "cudaMalloc": [ctypes.POINTER(vp), sz],
            "cudaFree": [vp], "cudaHostAlloc": [ctypes.POINTER(vp), sz, u], "cudaFreeHost": [vp],
            "cudaRuntimeGetVersion": [ctypes.POINTER(i)],
            "cudaDriverGetVersion": [ctypes.POINTER(i)], "cudaGetLastError": [],
            "cudaDeviceSynchronize": [],
            "standin_cuda_launch_fill": [vp, vp, vp, sz, i],
            "standin_cuda_launch_read": [vp, vp, vp, sz],
        }
        for name, args in signatures.items():
            fn = getattr(lib, name)
            fn.argtypes = args
            fn.restype = i
        for name in ("cudaGetErrorString", "cudaGetErrorName"):
            getattr(lib, name).argtypes = [i]
            getattr(lib, name).restype = ctypes.c_char_p
        lib.standin_cuda_log.argtypes = [ctypes.c_char_p, sz]
        lib.standin_cuda_log.restype = sz
        lib.standin_cuda_log_clear.argtypes = []
        lib.standin_cuda_log_clear.restype = None
        lib.standin_cuda_stream_id.argtypes = [vp]
        lib.standin_cuda_stream_id.restype = i
        lib.standin_cuda_event_id.argtypes = [vp]
        lib.standin_cuda_event_id.restype = i
        self._keep = {}  # host arrays a queued op still refers to, by stream

    # errors
    def error_name(self, code):
        return self.lib.cudaGetErrorName(code).decode()

    def error_string(self, code):
        return self.lib.cudaGetErrorString(code).decode()

    def check(self, code, what):
        if code != 0:
            raise CudaError(code, what, self.error_name(code))

    def get_last_error(self):
        return self.lib.cudaGetLastError()

    # devices
    def device_count(self):
        n = ctypes.c_int(-1)
        self.check(self.lib.cudaGetDeviceCount(ctypes.byref(n)), "cudaGetDeviceCount")
        return n.value

    def set_device(self, device):
        self.check(self.lib.cudaSetDevice(device), "cudaSetDevice")

    def get_device(self):
        d = ctypes.c_int(-1)
        self.check(self.lib.cudaGetDevice(ctypes.byref(d)), "cudaGetDevice")
        return d.value

    def pci_bus_id(self, device):
        buf = ctypes.create_string_buffer(64)
        self.check(self.lib.cudaDeviceGetPCIBusId(buf, 64, device), "cudaDeviceGetPCIBusId")
        return buf.value.decode()

    def runtime_version(self):
        v = ctypes.c_int()
        self.check(self.lib.cudaRuntimeGetVersion(ctypes.byref(v)), "cudaRuntimeGetVersion")
        return v.value

    def driver_version(self):
        v = ctypes.c_int()
        self.check(self.lib.cudaDriverGetVersion(ctypes.byref(v)), "cudaDriverGetVersion")
        return v.value

    # memory
    def malloc(self, n):
        p = ctypes.c_void_p()
        self.check(self.lib.cudaMalloc(ctypes.byref(p), n), "cudaMalloc")
        return _handle(p.value)

    def free(self, ptr):
        self.check(self.lib.cudaFree(ptr), "cudaFree")

    def host_alloc(self, n, flags=0):
        p = ctypes.c_void_p()
        self.check(self.lib.cudaHostAlloc(ctypes.byref(p), n, flags), "cudaHostAlloc")
        return _handle(p.value)

    def free_host(self, ptr):
        self.check(self.lib.cudaFreeHost(ptr), "cudaFreeHost")

    def write(self, ptr, array):
        """Copies array's bytes to ptr now (no stream)."""
        a = np.ascontiguousarray(array)
        ctypes.memmove(ptr, a.ctypes.data, a.nbytes)

    def read(self, ptr, nbytes, dtype=np.uint8, count=-1):
        """nbytes at ptr now (no stream), as a new array of dtype (count elements, -1: all)."""
        return np.frombuffer(ctypes.string_at(ptr, nbytes), dtype=dtype, count=count).copy()

    def memcpy_async(self, dst, src, n, kind, stream=0):
        self.check(self.lib.cudaMemcpyAsync(dst, src, n, kind, stream), "cudaMemcpyAsync")

    # streams and events
    def stream_create(self, flags=0):
        s = ctypes.c_void_p()
        self.check(self.lib.cudaStreamCreateWithFlags(ctypes.byref(s), flags),
                   "cudaStreamCreateWithFlags")
        return _handle(s.value)

    def stream_destroy(self, stream):
        self.check(self.lib.cudaStreamDestroy(stream), "cudaStreamDestroy")

    def stream_synchronize(self, stream=0):
        self.check(self.lib.cudaStreamSynchronize(stream), "cudaStreamSynchronize")
        self._keep.pop(stream, None)

    def device_synchronize(self):
        self.check(self.lib.cudaDeviceSynchronize(), "cudaDeviceSynchronize")
        self._keep.clear()

    def event_create(self, flags=0):
        e = ctypes.c_void_p()
        self.check(self.lib.cudaEventCreateWithFlags(ctypes.byref(e), flags),
                   "cudaEventCreateWithFlags")
        return _handle(e.value)

    def event_destroy(self, event):
        self.check(self.lib.cudaEventDestroy(event), "cudaEventDestroy")

    def event_record(self, event, stream=0):
        self.check(self.lib.cudaEventRecord(event, stream), "cudaEventRecord")

    def stream_wait_event(self, stream, event):
        self.check(self.lib.cudaStreamWaitEvent(stream, event, 0), "cudaStreamWaitEvent")

    def event_query(self, event):
        """0 when the event's latest record has completed, 600 (not ready) otherwise."""
        code = self.lib.cudaEventQuery(event)
        if code not in (0, 600):
            self.check(code, "cudaEventQuery")
        return code

    def event_synchronize(self, event):
        self.check(self.lib.cudaEventSynchronize(event), "cudaEventSynchronize")

    def wait_event(self, event, timeout=10.0):
        """Polls cudaEventQuery; True when the event completed within timeout seconds."""
        deadline = time.monotonic() + timeout
        while self.event_query(event) != 0:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return True

    # test hooks
    def launch_fill(self, stream, ptr, array, delay_ms=0):
        """A kernel writing array's bytes (taken now) to device ptr, after delay_ms."""
        a = np.ascontiguousarray(array)
        self.check(self.lib.standin_cuda_launch_fill(stream, ptr, a.ctypes.data, a.nbytes,
                                                     int(delay_ms)), "standin_cuda_launch_fill")

    def launch_read(self, stream, out, ptr):
        """A kernel copying out.nbytes from device ptr into the host array out (kept alive
        here until the stream is synchronized)."""
        if not (out.flags.c_contiguous and out.flags.writeable):
            raise ValueError("out must be a writeable C-contiguous array")
        self.check(self.lib.standin_cuda_launch_read(stream, out.ctypes.data, ptr, out.nbytes),
                   "standin_cuda_launch_read")
        self._keep.setdefault(stream, []).append(out)

    def log(self):
        """The log's lines: "<seq> run stream=..." / "<seq> call ...", oldest first."""
        while True:
            n = self.lib.standin_cuda_log(None, 0)
            buf = ctypes.create_string_buffer(n + 4096)
            got = self.lib.standin_cuda_log(buf, len(buf))
            if got < len(buf):
                return buf.raw[:got].decode().splitlines()

    def log_clear(self):
        self.lib.standin_cuda_log_clear()

    def stream_id(self, stream):
        return self.lib.standin_cuda_stream_id(stream)

    def event_id(self, event):
        return self.lib.standin_cuda_event_id(event)


class NcclUniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


class StandinNccl:
    """The stand-in NCCL at `path` (load the stand-in CUDA runtime first, or let the library
    find it next to itself). Communicators and streams are ints."""

    def __init__(self, path):
        self.path = str(path)
        self.lib = lib = ctypes.CDLL(self.path)
        vp, sz, i = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
        signatures = {
            "ncclGetVersion": [ctypes.POINTER(i)],
            "ncclGetUniqueId": [ctypes.POINTER(NcclUniqueId)],
            "ncclCommInitRank": [ctypes.POINTER(vp), i, NcclUniqueId, i],
            "ncclCommSplit": [vp, i, i, ctypes.POINTER(vp), vp],
            "ncclCommDestroy": [vp], "ncclCommAbort": [vp],
            "ncclCommGetAsyncError": [vp, ctypes.POINTER(i)],
            "ncclCommCount": [vp, ctypes.POINTER(i)], "ncclCommUserRank": [vp, ctypes.POINTER(i)],
            "ncclAllReduce": [vp, vp, sz, i, i, vp, vp],
            "ncclBroadcast": [vp, vp, sz, i, i, vp, vp],
            "ncclReduce": [vp, vp, sz, i, i, i, vp, vp],
            "ncclReduceScatter": [vp, vp, sz, i, i, vp, vp],
            "ncclSend": [vp, sz, i, i, vp, vp], "ncclRecv": [vp, sz, i, i, vp, vp],
            "ncclGroupStart": [], "ncclGroupEnd": [],
            "ncclRedOpCreatePreMulSum": [ctypes.POINTER(i), vp, i, i, vp],
            "ncclRedOpDestroy": [i, vp],
        }
        if hasattr(lib, "ncclAllGather"):
            signatures["ncclAllGather"] = [vp, vp, sz, i, vp, vp]
        for name, args in signatures.items():
            fn = getattr(lib, name)
            fn.argtypes = args
            fn.restype = i
        lib.ncclGetErrorString.argtypes = [i]
        lib.ncclGetErrorString.restype = ctypes.c_char_p

    def check(self, code, what):
        if code != 0:
            raise NcclError(code, what, self.lib.ncclGetErrorString(code).decode())

    def version(self):
        v = ctypes.c_int()
        self.check(self.lib.ncclGetVersion(ctypes.byref(v)), "ncclGetVersion")
        return v.value

    def unique_id(self):
        """A new unique id, as 128 bytes (to pass to other processes)."""
        uid = NcclUniqueId()
        self.check(self.lib.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
        return bytes(ctypes.string_at(ctypes.addressof(uid), 128))

    def init_rank(self, nranks, uid, rank):
        u = NcclUniqueId()
        ctypes.memmove(ctypes.addressof(u), uid, 128)
        comm = ctypes.c_void_p()
        self.check(self.lib.ncclCommInitRank(ctypes.byref(comm), nranks, u, rank),
                   "ncclCommInitRank")
        return _handle(comm.value)

    def split(self, comm, color, key):
        new = ctypes.c_void_p()
        self.check(self.lib.ncclCommSplit(comm, color, key, ctypes.byref(new), None),
                   "ncclCommSplit")
        return _handle(new.value)

    def async_error(self, comm):
        e = ctypes.c_int(-1)
        self.check(self.lib.ncclCommGetAsyncError(comm, ctypes.byref(e)), "ncclCommGetAsyncError")
        return e.value

    def wait_async_error(self, comm, timeout=10.0):
        """Polls the comm's async error until it is not 0 or timeout seconds pass."""
        deadline = time.monotonic() + timeout
        while (err := self.async_error(comm)) == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        return err

    def count(self, comm):
        n = ctypes.c_int()
        self.check(self.lib.ncclCommCount(comm, ctypes.byref(n)), "ncclCommCount")
        return n.value

    def user_rank(self, comm):
        r = ctypes.c_int()
        self.check(self.lib.ncclCommUserRank(comm, ctypes.byref(r)), "ncclCommUserRank")
        return r.value

    def destroy(self, comm):
        self.check(self.lib.ncclCommDestroy(comm), "ncclCommDestroy")

    def abort(self, comm):
        self.check(self.lib.ncclCommAbort(comm), "ncclCommAbort")

    def premul_sum(self, scalar, dtype, comm, residence=1):
        """A PreMulSum op; scalar: a host value (residence 1) or a device pointer (0)."""
        op = ctypes.c_int()
        if residence == 1:
            if dtype == "bfloat16":
                value = to_bfloat16(np.float32(scalar)).reshape(1)
            else:
                value = np.asarray([scalar], dtype=dtype)
            ptr = value.ctypes.data
        else:
            value, ptr = None, scalar
        self.check(self.lib.ncclRedOpCreatePreMulSum(ctypes.byref(op), ptr, _dtype(dtype),
                                                     residence, comm), "ncclRedOpCreatePreMulSum")
        del value
        return op.value

    def op_destroy(self, op, comm):
        self.check(self.lib.ncclRedOpDestroy(op, comm), "ncclRedOpDestroy")

    # Each call returns NCCL's code (0 = success) rather than raising, for tests of errors.
    def all_reduce(self, send, recv, count, dtype, op, comm, stream):
        return self.lib.ncclAllReduce(send, recv, count, _dtype(dtype), _op(op), comm, stream)

    def broadcast(self, send, recv, count, dtype, root, comm, stream):
        return self.lib.ncclBroadcast(send, recv, count, _dtype(dtype), root, comm, stream)

    def reduce(self, send, recv, count, dtype, op, root, comm, stream):
        return self.lib.ncclReduce(send, recv, count, _dtype(dtype), _op(op),
                                   root, comm, stream)

    def all_gather(self, send, recv, count, dtype, comm, stream):
        return self.lib.ncclAllGather(send, recv, count, _dtype(dtype), comm, stream)

    def reduce_scatter(self, send, recv, count, dtype, op, comm, stream):
        return self.lib.ncclReduceScatter(send, recv, count, _dtype(dtype), _op(op), comm,
                                          stream)

    def send(self, buf, count, dtype, peer, comm, stream):
        return self.lib.ncclSend(buf, count, _dtype(dtype), peer, comm, stream)

    def recv(self, buf, count, dtype, peer, comm, stream):
        return self.lib.ncclRecv(buf, count, _dtype(dtype), peer, comm, stream)

    def group_start(self):
        return self.lib.ncclGroupStart()

    def group_end(self):
        return self.lib.ncclGroupEnd()
