"""Allreduce latency and bandwidth: horovodlike on each transport beside the libraries a user would
pick instead, measured in the same run on the same machine.

    python benchmarks/allreduce.py --np 2

launches every job itself (horovodlike through its launcher, MPI_Allreduce through mpirun and
mpi4py, torch.distributed with Gloo through its own rendezvous, Horovod through horovodrun when
it is installed), skips what is not installed, and prints one table: the median time of one
float32 allreduce (Sum, in place) per message size, algbw = bytes / time,
busbw = algbw x 2(N-1)/N, and each peer's time divided by horovodlike's (above 1: horovodlike is
faster). Libraries run in turns (--repeat rounds, each library once a round) and the median over
the rounds is reported, so that load from other processes on the machine hits all of them alike.
MPI runs twice, its ranks bound to cores and unbound (`--bind-to none`); the "MPI" column is the
better of the two at each size (both are printed; the JSON says which won where).
"mem-bound" is the time the machine's memory allows any in-place allreduce, measured in the same
run: every rank must read its input and write its output once (must_traffic), and as many
processes as ranks read and write a buffer of the size in place at once (a STREAM-style kernel)
to measure the bandwidth that leaves them (shown from 1 MiB: below that, latency and caches
decide). Every job's own median is kept: "--repeat
20" makes 20 jobs of each library, run in turns, and a per-job table gives each one's worst
and median job.
MPI runs in every configuration --mpi-configs names ("bindings": bound and unbound; "tuned":
also Open MPI's tuned allreduce algorithms and its shared-memory single-copy mechanism; or a
JSON list of {"label", "mca": {name: value}, "bind"}), and the "MPI" column is the best of them
at each size in each round. mpi4py and matplotlib come with `pip install 'horovodlike[bench]'`.

    python benchmarks/allreduce.py --np 2 --cuda

times the same allreduce of CUDA tensors instead (rank r on GPU r mod the GPUs visible; each
call followed by torch.cuda.synchronize()): horovodlike as configured (NCCL when each rank has
a GPU of its own) and with HOROVOD_GPU_OPERATIONS=staged (through host memory), beside
torch.distributed over NCCL (when each rank has a GPU of its own: NCCL refuses several ranks
on one GPU) and over Gloo with CUDA tensors (2 ranks or more).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from gpu_setup import bench_device, horovodlike_gpu_report, in_full, require_cuda, torch_peers
from provenance import cross_core_ns, footer, header, record
from source_tree import jobs_pythonpath

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_SIZES = "4K,16K,64K,256K,1M,4M,16M,64M"


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().rstrip("IB")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def format_size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def iterations(nbytes: int, scale: float) -> tuple[int, int]:
    """(warm-up, timed) iterations: many for small messages, at least 20 for large ones."""
    timed = max(20, min(2000, (1 << 30) // nbytes))
    timed = max(10, int(timed * scale))
    return max(3, timed // 10), timed


# --------------------------------------------------------------------------------- workers
# Each worker runs every size on its library and writes {size: [seconds per iteration...]} from
# rank 0 to --out. Every worker times the same thing: one in-place float32 Sum allreduce of an
# already allocated buffer, back to back, each iteration timed on its own.

def _time_loop(allreduce, warmup, timed):
    for _ in range(warmup):
        allreduce()
    samples = []
    clock = time.perf_counter
    for _ in range(timed):
        start = clock()
        allreduce()
        samples.append(clock() - start)
    return samples


def own_session():
    """Puts this rank in a session of its own. With the kernel's autogroup scheduling
    (/proc/sys/kernel/sched_autogroup_enabled), a loaded machine shares CPU time between
    sessions first: horovodlike's launcher starts each rank in a new session, so ranks left in
    the benchmark's session would share one session's part between them and lose to it."""
    try:
        os.setsid()
    except OSError:
        pass  # already the leader of a session or process group (the launcher's ranks)


def _check(value, expected, what):
    if abs(value - expected) > 1e-3 * max(1.0, abs(expected)):
        raise SystemExit(f"{what}: wrong result {value}, expected {expected}")


def worker_horovodlike(args):
    import torch
    import horovodlike.torch as hvd
    torch.set_num_threads(1)
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    device, finish = bench_device(args.cuda, hvd.local_rank())
    results = {}
    for nbytes in args.sizes:
        count = nbytes // 4
        buf = torch.full((count,), float(rank + 1), device=device)
        hvd.allreduce_(buf, op=hvd.Sum, name="bench.check")
        _check(float(buf[0]), size * (size + 1) / 2, f"horovodlike {nbytes} B first element")
        _check(float(buf[-1]), size * (size + 1) / 2, f"horovodlike {nbytes} B last element")
        buf.zero_()
        warmup, timed = iterations(nbytes, args.iter_scale)
        results[nbytes] = _time_loop(
            in_full(lambda: hvd.allreduce_(buf, op=hvd.Sum, name="bench"), finish),
            warmup, timed)
    info = {"transport": _horovodlike_transport()}
    if args.cuda:  # how the core ran them: "nccl" or "staged: <why>" (a core that says)
        from horovodlike import _core
        gpu_mode = getattr(_core, "gpu_mode", None)
        info["gpu_mode"] = gpu_mode(0) if gpu_mode else \
            os.environ.get("HOROVOD_GPU_OPERATIONS") or "default"
    if rank == 0:
        _write(args.out, results, info)
    hvd.shutdown()


def _horovodlike_transport():
    """The transport this rank runs on: the core's own word when it says (build_info's
    cpu_operations), else "shm" when the process maps a horovodlike shared segment, else the CPU
    operations asked for (or "tcp")."""
    from horovodlike import _core
    in_use = dict(_core.build_info()).get("cpu_operations")
    if in_use:
        return in_use
    try:
        with open("/proc/self/maps") as maps:
            if any("/hvdl-" in line for line in maps):
                return "shm"
    except OSError:
        pass
    return os.environ.get("HOROVOD_CPU_OPERATIONS") or "tcp"


def worker_mpi(args):
    import numpy as np
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    results = {}
    for nbytes in args.sizes:
        buf = np.full(nbytes // 4, rank + 1, dtype=np.float32)
        comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
        _check(float(buf[0]), size * (size + 1) / 2, f"MPI {nbytes} B")
        buf[:] = 0
        warmup, timed = iterations(nbytes, args.iter_scale)
        results[nbytes] = _time_loop(lambda: comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM),
                                     warmup, timed)
    if rank == 0:
        _write(args.out, results, {"library": MPI.Get_library_version().splitlines()[0]})


def worker_gloo(args, backend="gloo"):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    device, finish = bench_device(args.cuda, int(os.environ["LOCAL_RANK"]))
    dist.init_process_group(backend)
    rank, size = dist.get_rank(), dist.get_world_size()
    results = {}
    for nbytes in args.sizes:
        buf = torch.full((nbytes // 4,), float(rank + 1), device=device)
        dist.all_reduce(buf)
        _check(float(buf[0]), size * (size + 1) / 2, f"torch.distributed {backend} {nbytes} B")
        buf.zero_()
        warmup, timed = iterations(nbytes, args.iter_scale)
        results[nbytes] = _time_loop(in_full(lambda: dist.all_reduce(buf), finish), warmup,
                                     timed)
    if rank == 0:
        info = {"torch": torch.__version__}
        if backend == "nccl":
            info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        _write(args.out, results, info)
    dist.destroy_process_group()


def worker_nccl(args):
    worker_gloo(args, "nccl")


def worker_horovod(args):
    import torch
    import horovod.torch as hvd
    torch.set_num_threads(1)
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    results = {}
    for nbytes in args.sizes:
        buf = torch.full((nbytes // 4,), float(rank + 1))
        hvd.allreduce_(buf, op=hvd.Sum, name="bench.check")
        _check(float(buf[0]), size * (size + 1) / 2, f"Horovod {nbytes} B")
        buf.zero_()
        warmup, timed = iterations(nbytes, args.iter_scale)
        results[nbytes] = _time_loop(lambda: hvd.allreduce_(buf, op=hvd.Sum, name="bench"),
                                     warmup, timed)
    if rank == 0:
        _write(args.out, results, {})
    hvd.shutdown()


def must_traffic(nbytes: int) -> int:
    """Bytes of memory traffic every rank of any in-place allreduce must cause: read its input
    and write its output, once each (the other ranks' data can come through the shared cache,
    as horovodlike's shared-memory algorithm brings them, in chunks)."""
    return 2 * nbytes


def worker_stream(args):
    """The memory bound: every rank reads and writes a float32 buffer of the size in place
    (a += 1, a STREAM-style kernel without the write-allocate reads of a copy into another
    buffer), all ranks at once (they start together through marker files); the bound is
    must_traffic over the bandwidth this measures, i.e. that kernel's time. STREAM's copy
    (a = b) runs beside it, for the record: a copy into another buffer also reads the
    destination before writing it, so it moves 3 bytes for the 2 STREAM counts."""
    import numpy as np
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    folder = os.path.dirname(args.out)
    results, copy_bw = {}, {}
    for nbytes in [n for n in args.sizes if n >= 1 << 20]:
        a = np.full(nbytes // 4, rank + 1, dtype=np.float32)
        b = np.ones_like(a)
        np.add(a, 1.0, out=a)
        _check(float(a[-1]), rank + 2, f"stream {nbytes} B")
        marker = os.path.join(folder, f"ready.{nbytes}.{{}}")
        open(marker.format(rank), "w").close()
        while not all(os.path.exists(marker.format(r)) for r in range(size)):
            time.sleep(0.001)
        warmup, timed = iterations(nbytes, args.iter_scale)
        in_place = _time_loop(lambda: np.add(a, 1.0, out=a), warmup, timed)
        copies = _time_loop(lambda: np.copyto(b, a), warmup, timed)
        bandwidth = [must_traffic(nbytes) / t for t in in_place]
        results[nbytes] = [must_traffic(nbytes) / bw for bw in bandwidth]
        copy_bw[nbytes] = 2 * nbytes / statistics.median(copies) / 1e9
    if rank == 0:
        _write(args.out, results, {"what": "each rank reads and writes its buffer in place, all "
                                           "ranks at once (a += 1)",
                                   "stream_copy_GBps_per_rank": copy_bw})


WORKERS = {"horovodlike": worker_horovodlike, "mpi": worker_mpi, "gloo": worker_gloo,
           "nccl": worker_nccl, "stream": worker_stream,
           "horovod": worker_horovod}


def _write(path, results, info):
    with open(path, "w") as f:
        json.dump({"samples": {str(k): v for k, v in results.items()}, "info": info}, f)


# --------------------------------------------------------------------------------- the driver

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _base_env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOROVOD_")}
    env["OMP_NUM_THREADS"] = "1"
    # An explicit PYTHONPATH (another build of horovodlike) wins over this source tree.
    env["PYTHONPATH"] = jobs_pythonpath()
    return env


def env_settings(parser, items: list[str]) -> dict:
    """`--env NAME=VALUE` arguments as a dict (the benchmarks drop the caller's HOROVOD_*
    variables, so that a stray setting cannot change a measurement unseen)."""
    settings = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            parser.error(f"--env {item!r}: expected NAME=VALUE")
        settings[name] = value
    return settings


def format_settings(settings: dict) -> str:
    """`NAME=VALUE NAME=VALUE`, as the raw outputs record a job's settings."""
    return " ".join(f"{k}={v}" for k, v in settings.items())


def _module_available(name: str) -> bool:
    probe = subprocess.run([sys.executable, "-c", f"import {name}"], env=_base_env(),
                           capture_output=True)
    return probe.returncode == 0


def _horovodlike_build_info() -> dict:
    probe = subprocess.run([sys.executable, "-c",
                            "import json, horovodlike.common, horovodlike._core as c; "
                            "print(json.dumps(dict(c.build_info())))"],
                           env=_base_env(), capture_output=True, text=True)
    return json.loads(probe.stdout) if probe.returncode == 0 else {}


class Library:
    """One column of the table: how to start its job."""

    def __init__(self, label, worker, command, env=None):
        self.label, self.worker, self.command, self.env = label, worker, command, env or {}


def cuda_libraries(np_: int, gpus: int, launch: list[str], me: str
                   ) -> tuple[list[Library], list[str]]:
    """--cuda: horovodlike (as configured, and staged through the host) beside torch.distributed
    over NCCL and over Gloo with CUDA tensors (gpu_setup.torch_peers)."""
    py = sys.executable
    found, skipped = [], []
    if _horovodlike_build_info():
        found.append(Library("hvdl-cuda", "horovodlike", launch + [py, me]))
        found.append(Library("hvdl-cuda-staged", "horovodlike", launch + [py, me],
                             {"HOROVOD_GPU_OPERATIONS": "staged"}))
    else:
        skipped.append("horovodlike: the core does not load (build it first)")
    if not _module_available("torch.distributed"):
        return found, skipped + ["torch.distributed: torch is not installed"]
    peers, notes = torch_peers(np_, gpus)
    return found + [Library(label, backend, None) for label, backend in peers], skipped + notes


BIND_CORE = "core:overload-allowed"


def mpi_configurations(choice: str) -> list[dict]:
    """MPI's runs: "bindings" (ranks bound one to a core, which is MPI's usual best, and unbound,
    which on a machine shared with other work can move to an idle core), "tuned" (also each of
    Open MPI's tuned allreduce algorithms, and its shared-memory transport without the
    single-copy mechanism), or a JSON file with a list of {"label", "bind", "mca"}. Labels
    start with "MPI "; the "MPI" column is the best of them."""
    bindings = [{"label": "MPI bound", "bind": BIND_CORE}, {"label": "MPI unbound", "bind": "none"}]
    if choice == "bindings":
        return bindings
    if choice != "tuned":
        with open(choice) as f:
            return json.load(f)
    # Open MPI 4's coll/tuned: 1 basic linear, 2 nonoverlapping (reduce + bcast), 3 recursive
    # doubling, 4 ring, 5 segmented ring, 6 Rabenseifner (reduce-scatter + allgather).
    tuned = [{"label": f"MPI alg{k} {where}", "bind": bind,
              "mca": {"coll_tuned_use_dynamic_rules": 1, "coll_tuned_allreduce_algorithm": k}}
             for k in range(1, 7) for where, bind in (("bound", BIND_CORE), ("unbound", "none"))]
    copies = [{"label": f"MPI nosinglecopy {where}", "bind": bind,
               "mca": {"btl_vader_single_copy_mechanism": "none"}}
              for where, bind in (("bound", BIND_CORE), ("unbound", "none"))]
    return bindings + tuned + copies


def libraries(np_: int, wanted: set[str], gpus: int | None = None,
              mpi_configs: list[dict] = ()) -> tuple[list[Library], list[str]]:
    """The libraries to run, and a note for each one skipped; `gpus` (--cuda): the GPUs visible,
    and the CUDA set of libraries instead of the host's; `mpi_configs`: MPI's runs
    (mpi_configurations)."""
    py = sys.executable
    me = os.path.abspath(__file__)
    launch = [py, "-m", "horovodlike.runner.launch", "-np", str(np_)]
    if gpus is not None:
        found, skipped = cuda_libraries(np_, gpus, launch, me)
        return _only(found, wanted), skipped
    found, skipped = [], []
    info = _horovodlike_build_info()
    if not info:
        skipped.append("horovodlike: the core does not load (build it first)")
    else:
        # The default: shared memory between the ranks of this host (TCP if shm is not built).
        found.append(Library("hvdl-shm", "horovodlike", launch + [py, me]))
        found.append(Library("hvdl-tcp", "horovodlike", launch + [py, me],
                             {"HOROVOD_SHM_DISABLE": "1"}))
        # One way of writing the shared-memory allreduce's slots each, asked for by name (the
        # default learns which is faster while it runs: HOROVOD_SHM_STREAM_STORES).
        for label, value in (("hvdl-shm-ordinary", "off"), ("hvdl-shm-streaming", "on")):
            if label in wanted:
                found.append(Library(label, "horovodlike", launch + [py, me],
                                     {"HOROVOD_SHM_STREAM_STORES": value}))
        # The Gloo and MPI backends, when this build has them: the launcher's --gloo / --mpi.
        for backend in ("gloo", "mpi"):
            if info.get(backend):
                found.append(Library(f"hvdl-{backend}", "horovodlike",
                                     launch + [f"--{backend}", py, me]))
    mpirun = shutil.which("mpirun")
    if mpirun and _module_available("mpi4py"):
        for config in mpi_configs:
            mca = [arg for name, value in config.get("mca", {}).items()
                   for arg in ("--mca", name, str(value))]
            found.append(Library(config["label"], "mpi",
                                 [mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to",
                                  config.get("bind", "none"), *mca, "-np", str(np_), py, me]))
    else:
        skipped.append("MPI: needs mpirun and mpi4py (pip install 'horovodlike[bench]')")
    if _module_available("torch.distributed"):
        found.append(Library("torch-gloo", "gloo", None))
    else:
        skipped.append("torch.distributed Gloo: torch is not installed")
    # Started as torch-gloo's ranks are (RANK, WORLD_SIZE), but needs only NumPy.
    found.append(Library("mem-bound", "stream", None))
    if _module_available("horovod.torch") and shutil.which("horovodrun"):
        found.append(Library("Horovod", "horovod",
                             [shutil.which("horovodrun"), "-np", str(np_), py, me]))
    else:
        skipped.append("Horovod: not installed (`pip install horovod` does not build against "
                       "this PyTorch)")
    return _only(found, wanted), skipped


def _only(found: list[Library], wanted: set[str]) -> list[Library]:
    """--only: the libraries named by label, worker or the label's first word."""
    if not wanted:
        return found
    return [lib for lib in found if lib.label in wanted or lib.worker in wanted
            or lib.label.split()[0] in wanted]


def run_job(lib: Library, np_: int, worker_args: list[str], timeout: float,
            settings: dict | None = None) -> dict:
    """One job; `settings`: environment variables for horovodlike's jobs (--env)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        args = ["--worker", lib.worker, "--out", out] + worker_args
        env = _base_env()
        if lib.worker == "horovodlike":
            env.update(settings or {})
        env.update(lib.env)
        if lib.command is not None:
            procs = [subprocess.Popen(lib.command + args, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True)]
        else:  # torch.distributed: the ranks meet through TCPStore on a free port
            env.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()),
                        "WORLD_SIZE": str(np_)})
            procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__)] + args,
                                      env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True)
                     for r in range(np_)]
        outputs = []
        deadline = time.time() + timeout
        for p in procs:
            try:
                outputs.append(p.communicate(timeout=max(1.0, deadline - time.time()))[0])
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                raise RuntimeError(f"{lib.label}: timed out after {timeout:.0f} s")
        if any(p.returncode != 0 for p in procs) or not os.path.exists(out):
            raise RuntimeError(f"{lib.label} failed:\n" + "\n".join(outputs)[-3000:])
        with open(out) as f:
            return json.load(f)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--np", type=int, default=2, help="ranks (default 2)")
    parser.add_argument("--sizes", default=DEFAULT_SIZES,
                        help=f"message sizes in bytes, K/M/G suffixes (default {DEFAULT_SIZES})")
    parser.add_argument("--repeat", type=int, default=3,
                        help="rounds; each library runs once per round (default 3)")
    parser.add_argument("--iter-scale", type=float, default=1.0,
                        help="multiplies the number of timed iterations")
    parser.add_argument("--only", default="",
                        help="comma-separated labels or workers to run (e.g. hvdl-shm,MPI)")
    parser.add_argument("--json", help="also write all results to this file")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="a setting for horovodlike's jobs (repeatable), e.g. "
                        "HOROVOD_SHM_CHUNK_BYTES=4194304")
    parser.add_argument("--cuda", action="store_true",
                        help="allreduce CUDA tensors (rank r on GPU r mod the GPUs visible), "
                        "beside torch.distributed over NCCL and over Gloo")
    parser.add_argument("--mpi-configs", default="bindings",
                        help='MPI\'s runs: "bindings" (bound and unbound, the default), "tuned" '
                        "(also Open MPI's tuned allreduce algorithms and no single-copy), or a "
                        "JSON file of {label, bind, mca} entries")
    parser.add_argument("--alternate", action="store_true",
                        help="reverse the order of the libraries every other round")
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    settings = env_settings(parser, args.env)
    sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    if args.worker:
        args.sizes = sizes
        own_session()
        WORKERS[args.worker](args)
        return

    print(header(), flush=True)
    provenance = record()
    gpus = require_cuda(parser, _base_env()) if args.cuda else None
    wanted = {w.strip() for w in args.only.split(",") if w.strip()}
    libs, skipped = libraries(args.np, wanted, gpus, mpi_configurations(args.mpi_configs))
    for note in skipped:
        print(f"skipped: {note}", flush=True)
    if args.cuda:
        print(f"{gpus} GPU(s) visible\n{horovodlike_gpu_report(_base_env())}", flush=True)
    if settings:
        print(f"horovodlike's jobs with {format_settings(settings)}", flush=True)
    worker_args = ["--sizes", ",".join(map(str, sizes)), "--iter-scale", str(args.iter_scale)]
    worker_args += ["--cuda"] if args.cuda else []
    # medians[label][size] = per-round medians
    medians = {lib.label: {n: [] for n in sizes} for lib in libs}
    # probes[label]: per job, the machine probe just before and just after it (cross_core_ns)
    probes = {lib.label: [] for lib in libs}
    infos = {}
    for round_ in range(args.repeat):
        for lib in (libs[::-1] if args.alternate and round_ % 2 else libs):
            start = time.time()
            probe_before = cross_core_ns()
            try:
                result = run_job(lib, args.np, worker_args, args.timeout, settings)
            except RuntimeError as error:
                print(f"round {round_ + 1}: {error}", flush=True)
                continue
            probes[lib.label].append((probe_before, cross_core_ns()))
            infos[lib.label] = result["info"]
            # hvdl-<transport>[-<variant>]: the transport its job should have used.
            expected = lib.label.split("-")[1] if lib.label.startswith("hvdl-") and \
                not args.cuda else None
            if expected and result["info"].get("transport") not in (expected, None):
                print(f"note: {lib.label} ran on {result['info']['transport']}", flush=True)
            if round_ == 0 and result["info"].get("gpu_mode"):
                print(f"note: {lib.label} ran CUDA tensors as {result['info']['gpu_mode']}",
                      flush=True)
            for n in sizes:
                if str(n) in result["samples"]:
                    medians[lib.label][n].append(statistics.median(result["samples"][str(n)]))
            print(f"round {round_ + 1}/{args.repeat}: {lib.label} done in "
                  f"{time.time() - start:.1f} s", flush=True)
    table = {label: {n: statistics.median(v) for n, v in per.items() if v}
             for label, per in medians.items()}
    mpi_choice = best_mpi(table, medians, sizes)
    if mpi_choice:
        print("MPI: the configuration that was fastest in most rounds, per size: " + ", ".join(
            f"{format_size(n)} {mpi_choice[n]}" for n in sizes if n in mpi_choice), flush=True)
    print_table(table, sizes, args.np, " of CUDA tensors" if args.cuda else "")
    print_round_ratios(medians, sizes)
    print_jobs(medians, sizes, probes)
    print(footer(), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**provenance, "np": args.np, "cuda": args.cuda, "median_seconds": table,
                       "per_round": medians, "mpi_choice": mpi_choice,
                       "cross_core_ns": probes,
                       "load_average": os.getloadavg(), "settings": settings, "info": infos},
                      f, indent=1, default=str)


def best_mpi(table: dict, medians: dict, sizes: list[int]) -> dict:
    """Adds an "MPI" column: in each round, the fastest of MPI's configurations at each size
    (their own columns stay); returns, per size, the configuration that won most rounds."""
    runs = [label for label in table if label.startswith("MPI ") and table[label]]
    if not runs:
        return {}
    choice, best, rounds = {}, {}, {}
    for n in sizes:
        per_round = zip(*[medians[label][n] for label in runs if len(medians[label][n])])
        winners = []
        for times in per_round:
            fastest = min(range(len(times)), key=times.__getitem__)
            winners.append(runs[fastest])
            rounds.setdefault(n, []).append(times[fastest])
        if winners:
            choice[n] = max(set(winners), key=winners.count)
            best[n] = statistics.median(rounds[n])
    table["MPI"] = best
    medians["MPI"] = rounds
    return choice


def print_jobs(medians: dict, sizes: list[int], probes: dict | None = None) -> None:
    """Every job's median, per library and size, with the worst job over the median job (for
    times: the slowest over the median). With `probes` (cross_core_ns before and after each
    job), also each job's probes, and the worst over the median among the jobs that ran while
    the machine was in its usual phase: both probes within 1.5x of the run's median probe."""
    probes = probes or {}
    seen = [ns for per in probes.values() for pair in per for ns in pair if ns]
    usual = 1.5 * statistics.median(seen) if seen else None
    print()
    print("every job's median per call (one job per round), the median job, the worst job, "
          "and worst / median")
    for label, per in medians.items():
        if label.startswith("MPI ") or not any(per.values()):
            continue
        pairs = probes.get(label) or []
        for n in sizes:
            jobs = per.get(n) or []
            if not jobs:
                continue
            mid = statistics.median(jobs)
            print(f"{label:>12} {format_size(n):>8}: median {_fmt_time(mid)}, worst "
                  f"{_fmt_time(max(jobs))} ({max(jobs) / mid:.2f}x); jobs: "
                  + " ".join(_fmt_time(t) for t in jobs))
            if usual and len(pairs) == len(jobs):
                calm = [t for t, pair in zip(jobs, pairs) if all(p and p <= usual for p in pair)]
                if calm:
                    calm_mid = statistics.median(calm)
                    print(f"{'':>12} {'':>8}  in the usual phase ({len(calm)} of {len(jobs)} "
                          f"jobs): median {_fmt_time(calm_mid)}, worst {_fmt_time(max(calm))} "
                          f"({max(calm) / calm_mid:.2f}x)")
    if seen:
        print(f"\ncross-core round trip (a cache line between two CPUs, before / after each "
              f"job, ns; usual phase: up to {usual:.0f})")
        for label, pairs in probes.items():
            if pairs:
                print(f"{label:>12}: " + " ".join(
                    f"{a or 0:.0f}/{b or 0:.0f}" for a, b in pairs))


def print_round_ratios(medians: dict, sizes: list[int]) -> None:
    """Each peer's time over horovodlike's in the same round (min / median / max over rounds):
    on a shared machine, rounds differ more than the libraries within a round do."""
    ours = [label for label in medians if label.startswith("hvdl") and any(medians[label].values())]
    peers = [label for label in medians if not label.startswith(("hvdl", "MPI "))
             and any(medians[label].values())]
    if not ours or not peers:
        return
    reference = ours[0]
    print()
    print(f"per-round ratios, peer time / {reference} time in the same round: min / median / max")
    rows = [["size"] + peers]
    for n in sizes:
        row = [format_size(n)]
        for p in peers:
            pairs = [b / a for a, b in zip(medians[reference][n], medians[p][n]) if a and b]
            row.append(f"{min(pairs):.2f} / {statistics.median(pairs):.2f} / {max(pairs):.2f}"
                       if pairs else "-")
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for i, row in enumerate(rows):
        print("| " + " | ".join(c.rjust(w) for c, w in zip(row, widths)) + " |")
        if i == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")


def _fmt_time(seconds: float) -> str:
    us = seconds * 1e6
    if us < 1000:
        return f"{us:.1f} us"
    return f"{us / 1000:.2f} ms"


def print_table(table: dict, sizes: list[int], np_: int, what: str = "") -> None:
    labels = [label for label in table if table[label]]
    ours = [label for label in labels if label.startswith("hvdl")]
    peers = [label for label in labels if not label.startswith(("hvdl", "MPI "))]
    reference = ours[0] if ours else None
    print()
    print(f"float32 allreduce (Sum, in place){what}, {np_} ranks, median time per call; "
          f"busbw = size / time x 2(N-1)/N")
    header = ["size"] + labels
    if reference:
        header += [f"{reference} busbw"] + [f"{p}/{reference}" for p in peers + ours[1:]]
    rows = [header]
    for n in sizes:
        row = [format_size(n)]
        for label in labels:
            t = table[label].get(n)
            row.append(_fmt_time(t) if t else "-")
        if reference:
            t = table[reference].get(n)
            row.append(f"{n / t * 2 * (np_ - 1) / np_ / 1e9:.2f} GB/s" if t else "-")
            for p in peers + ours[1:]:
                tp = table[p].get(n)
                row.append(f"{tp / t:.2f}x" if t and tp else "-")
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for i, row in enumerate(rows):
        print("| " + " | ".join(c.rjust(w) for c, w in zip(row, widths)) + " |")
        if i == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")


if __name__ == "__main__":
    main()
