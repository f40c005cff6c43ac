"""The stand-in CUDA runtime (tests/gpu_standins) on its own, and the build of the stand-ins:
stream ordering read from the runtime's log, events, the legacy default stream, the memory
table's copy checks, device queries."""

import os
import re
import sys
import time
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from gpu_standins import build as standin_build  # noqa: E402
from gpu_standins.device import CudaError  # noqa: E402
from gpu_standins.testing import (D2D, D2H, DEFAULT, H2D, H2H,  # noqa: E402
                                  NON_BLOCKING, NOT_READY, lines, seq)





# ------------------------------------------------------------------------------------------------
# The build


def test_build_is_cached_and_complete(standins):
    assert standin_build.build() == standins
    for key in ("cudart", "nccl", "nccl_omit_allgather"):
        assert Path(standins[key]).is_file()
    assert Path(standins["nccl_omit_allgather"]).parent.name == "omit_allgather"
    assert Path(standins["nccl_omit_allgather"]).name == "libnccl.so.2"



def test_cache_key_covers_every_source():
    """Every C source and header next to build.py is compiled or included, so it is hashed."""
    here = Path(standin_build.__file__).resolve().parent
    on_disk = {p.name for p in here.iterdir() if p.suffix in (".c", ".h")}
    assert set(standin_build.SOURCES) == on_disk
    assert set(standin_build.CUDART_SOURCES) | set(standin_build.NCCL_SOURCES) == {
        name for name in on_disk if name.endswith(".c")}


def test_concurrent_builds_share_one_folder(tmp_path, monkeypatch):
    """Callers at once: one compiles (in a temporary folder renamed into place), the others
    wait and reuse it. The compiler is faked here; the `standins` fixture runs the real one."""
    import tempfile
    import threading
    compiled = []

    def fake_compile(folder, key):
        compiled.append(folder)
        time.sleep(0.2)
        (Path(folder) / standin_build.OMIT_DIR).mkdir()
        for name in ("libcudart.so.12", "libnccl.so.2", "omit_allgather/libnccl.so.2"):
            (Path(folder) / name).write_text("")
        (Path(folder) / standin_build.STAMP).write_text(key)

    monkeypatch.setattr(standin_build, "_compile_into", fake_compile)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    for out_dir in (None, tmp_path / "explicit"):
        compiled.clear()
        results = []
        threads = [threading.Thread(target=lambda: results.append(standin_build.build(out_dir)))
                   for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert len(results) == 4 and all(r == results[0] for r in results)
        assert len(compiled) == 1 and Path(compiled[0]) != Path(results[0]["dir"])
        folder = Path(results[0]["dir"])
        assert all(Path(results[0][k]).is_file()
                   for k in ("cudart", "nccl", "nccl_omit_allgather"))
        for place in (folder, folder.parent):  # no temporary folder left behind
            assert not [p.name for p in place.iterdir() if p.name.startswith(".") and p.is_dir()]
        if out_dir is None:
            assert folder.parent.parent == tmp_path
        assert standin_build.build(out_dir) == results[0] and len(compiled) == 1



# ------------------------------------------------------------------------------------------------
# The CUDA runtime


def test_device_queries(cuda):
    assert cuda.device_count() == int(os.environ.get("HVDL_STANDIN_CUDA_DEVICES") or 1)
    assert cuda.get_device() == 0
    assert cuda.pci_bus_id(0) == "0000:01:00.0"
    assert cuda.runtime_version() == 12080 and cuda.driver_version() == 12080
    with pytest.raises(CudaError) as e:
        cuda.set_device(1)
    assert e.value.code == 101
    assert cuda.get_last_error() == 101 and cuda.get_last_error() == 0
    assert cuda.error_string(100) == "no CUDA-capable device is detected"
    assert cuda.error_name(600) == "cudaErrorNotReady"
    assert cuda.error_string(1) == "invalid argument"


def test_delayed_fill_then_copy_on_one_stream(cuda):
    cuda.log_clear()
    s = cuda.stream_create()
    sid = cuda.stream_id(s)
    data = np.arange(64, dtype=np.float32) * 1.5
    d = cuda.malloc(data.nbytes)
    out = np.zeros_like(data)
    start = time.monotonic()
    cuda.launch_fill(s, d, data, delay_ms=1000)
    cuda.memcpy_async(out.ctypes.data, d, data.nbytes, D2H, s)
    # Asynchronous: both calls returned before the fill could have run. The delay is long
    # beside two calls, so that a busy machine's scheduling does not reach it.
    assert time.monotonic() - start < 1.0
    cuda.stream_synchronize(s)
    np.testing.assert_array_equal(out, data)
    fill = seq(cuda, f"run stream={sid} fill dst=0x{d:x} n=256")
    copy = seq(cuda, f"run stream={sid} memcpy kind=2 dst=0x{out.ctypes.data:x} src=0x{d:x} n=256")
    sync = seq(cuda, f"call stream_synchronize stream={sid}")
    assert fill < copy and sync < copy
    cuda.stream_destroy(s)
    cuda.free(d)


def test_cross_stream_wait_on_event(cuda):
    cuda.log_clear()
    s1, s2 = cuda.stream_create(NON_BLOCKING), cuda.stream_create(NON_BLOCKING)
    sid1, sid2 = cuda.stream_id(s1), cuda.stream_id(s2)
    assert 0 < sid1 < sid2
    e = cuda.event_create()
    eid = cuda.event_id(e)
    assert eid >= 1
    assert cuda.event_query(e) == 0  # never recorded
    data = np.arange(32, dtype=np.int64) - 7
    d1, d2 = cuda.malloc(data.nbytes), cuda.malloc(data.nbytes)
    out = np.zeros_like(data)
    cuda.launch_fill(s1, d1, data, delay_ms=250)
    cuda.event_record(e, s1)
    assert cuda.event_query(e) == NOT_READY
    cuda.stream_wait_event(s2, e)
    cuda.memcpy_async(d2, d1, data.nbytes, D2D, s2)
    cuda.launch_read(s2, out, d2)
    cuda.stream_synchronize(s2)
    np.testing.assert_array_equal(out, data)
    assert cuda.event_query(e) == 0
    fill = seq(cuda, f"run stream={sid1} fill dst=0x{d1:x} n=256")
    record = seq(cuda, f"run stream={sid1} record event={eid}")
    wait = seq(cuda, f"run stream={sid2} wait event={eid} done")
    copy = seq(cuda, f"run stream={sid2} memcpy kind=3 dst=0x{d2:x} src=0x{d1:x} n=256")
    read = seq(cuda, f"run stream={sid2} read src=0x{d2:x} n=256")
    call_record = seq(cuda, f"call event_record stream={sid1} event={eid}")
    call_wait = seq(cuda, f"call stream_wait stream={sid2} event={eid}")
    assert call_record < call_wait < wait
    assert fill < record < wait < copy < read

    # A wait takes the record current at the call: a later record does not hold it back.
    cuda.event_record(e, s1)
    cuda.stream_wait_event(s2, e)
    cuda.launch_fill(s1, d1, data, delay_ms=2000)
    cuda.event_record(e, s1)
    after = cuda.event_create()
    cuda.event_record(after, s2)
    # `after` completed while the later record was still waiting for the fill: it was not held
    # back by it (had it been, `e` would have completed first).
    assert cuda.wait_event(after)
    assert cuda.event_query(e) == NOT_READY
    cuda.event_synchronize(e)
    assert cuda.event_query(e) == 0
    assert lines(cuda, f"call event_synchronize event={eid}")

    # A never-recorded event: the call is logged, no wait is queued.
    fresh = cuda.event_create()
    fid = cuda.event_id(fresh)
    cuda.stream_wait_event(s2, fresh)
    cuda.event_synchronize(fresh)
    cuda.stream_synchronize(s2)
    assert lines(cuda, f"call stream_wait stream={sid2} event={fid}")
    assert not lines(cuda, f"run stream=\\d+ wait event={fid} done")
    for h in (e, after, fresh):
        cuda.event_destroy(h)
    cuda.free(d1)
    cuda.free(d2)


def test_legacy_default_stream_orders_with_blocking_streams(cuda):
    blocking, free_running = cuda.stream_create(0), cuda.stream_create(NON_BLOCKING)
    data = np.arange(16, dtype=np.float32)
    d = cuda.malloc(data.nbytes)
    out = np.zeros_like(data)
    cuda.launch_fill(blocking, d, data, delay_ms=150)
    cuda.memcpy_async(out.ctypes.data, d, data.nbytes, D2H, 0)  # waits for `blocking`
    cuda.stream_synchronize(0)
    np.testing.assert_array_equal(out, data)
    # A non-blocking stream does not hold the default stream back.
    slow = cuda.event_create()
    cuda.launch_fill(free_running, d, data, delay_ms=2000)
    cuda.event_record(slow, free_running)
    quick = cuda.event_create()
    cuda.event_record(quick, 0)
    assert cuda.wait_event(quick)
    assert cuda.event_query(slow) == NOT_READY  # `quick` did not wait for the slow stream
    # cudaFree waits for the device, as the real one does: the fill, still running before the
    # call, is done when it returns.
    cuda.free(d)
    assert cuda.event_query(slow) == 0


def test_memcpy_kind_checks(cuda):
    cuda.log_clear()
    d = cuda.malloc(64)
    pinned = cuda.host_alloc(64)
    host = np.zeros(16, dtype=np.float32)
    h = host.ctypes.data
    good = [(d, h, H2D), (d + 8, h, H2D), (h, d, D2H), (h, d + 60, D2H), (d, d + 32, D2D),
            (h, pinned, H2H), (pinned, h, H2H), (d, pinned, H2D), (pinned, d, D2H),
            (d, d, DEFAULT), (h, pinned, DEFAULT), (d, h, DEFAULT)]
    for dst, src, kind in good:
        cuda.memcpy_async(dst, src, 4, kind, 0)
    cuda.stream_synchronize(0)
    assert len(lines(cuda, r"run stream=0 memcpy .*")) == len(good)
    cuda.log_clear()
    bad = [(h, h, H2D), (d, d, H2D), (h, pinned, H2D), (d, d, D2H), (h, h, D2H),
           (d, h, D2D), (h, d, D2D), (pinned, d, D2D), (d, h, H2H), (h, d + 4, H2H)]
    for dst, src, kind in bad:
        with pytest.raises(CudaError) as e:
            cuda.memcpy_async(dst, src, 4, kind, 0)
        assert e.value.code == 1, (dst, src, kind)
    with pytest.raises(CudaError) as e:  # runs past the end of the allocation
        cuda.memcpy_async(h, d + 32, 64, D2H, 0)
    assert e.value.code == 1
    with pytest.raises(CudaError) as e:
        cuda.memcpy_async(d, h, 4, 7, 0)
    assert e.value.code == 21
    assert cuda.get_last_error() == 21 and cuda.get_last_error() == 0
    cuda.stream_synchronize(0)
    assert not lines(cuda, r"run stream=\d+ memcpy .*")  # nothing was queued
    with pytest.raises(CudaError) as e:
        cuda.free(h)
    assert e.value.code == 1
    cuda.free(d)
    cuda.free_host(pinned)


def test_log_format(cuda):
    cuda.log_clear()
    s = cuda.stream_create()
    e = cuda.event_create()
    d = cuda.malloc(16)
    out = np.zeros(4, dtype=np.float32)
    cuda.launch_fill(s, d, np.ones(4, dtype=np.float32))
    cuda.event_record(e, s)
    cuda.stream_wait_event(0, e)
    cuda.memcpy_async(out.ctypes.data, d, 16, D2H, 0)
    cuda.launch_read(0, out, d)
    cuda.stream_synchronize(0)
    cuda.event_synchronize(e)
    line = re.compile(
        r"\d+ (run stream=\d+ (memcpy kind=\d dst=0x[0-9a-f]+ src=0x[0-9a-f]+ n=\d+"
        r"|record event=\d+|wait event=\d+ done|fill dst=0x[0-9a-f]+ n=\d+"
        r"|read src=0x[0-9a-f]+ n=\d+|host_func)"
        r"|call (stream_wait stream=\d+ event=\d+|event_record stream=\d+ event=\d+"
        r"|event_synchronize event=\d+|stream_synchronize stream=\d+))")
    log = cuda.log()
    assert len(log) == 9, log
    assert all(line.fullmatch(x) for x in log), log
    seqs = [int(x.split()[0]) for x in log]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    cuda.free(d)
