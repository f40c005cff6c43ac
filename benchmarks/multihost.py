"""Allreduce across emulated hosts: flat ring, hierarchical allreduce, MPI and Gloo over
rate-limited links, with the CPU time each rank spends.

    sudo python benchmarks/multihost.py --hosts 2,4 --rates 1gbit,10gbit --json out.json

Each "host" is a network namespace with one veth pair to a bridge in the root namespace; both
directions of every host's link are shaped with `tc qdisc ... tbf` to the given rate (full
duplex, as a NIC). Two ranks run in each namespace (--slots). Ranks of one namespace share
memory, as on a real host; ranks of different namespaces talk over their shaped link only.
The jobs start as on a cluster:
- horovodlike through its launcher run inside the first namespace, `-H ip0:2,ip1:2,...` and
  `--network-interface`: the first host's ranks start locally, the others through `ssh`, which
  here is a small script that enters the host's namespace (the launcher gives every rank its
  HOROVOD_HOSTNAME); "flat ring" is the default allreduce, "hierarchical" adds
  `--hierarchical-allreduce`;
- MPI_Allreduce (mpi4py) through `mpirun -H ...` with the same `ssh` as its remote agent and its
  TCP traffic kept on the shaped interface (`--bind-to none` and mpi_yield_when_idle: more
  ranks than cores);
- torch.distributed's Gloo ranks started in their namespaces with GLOO_SOCKET_IFNAME.
Every rank times each float32 Sum allreduce (in place, median of the timed calls, as
allreduce.py does) and measures its own process CPU time (all threads, user + system) over the
timed calls: "cpu/wall" is that CPU time over the elapsed time, summed over the ranks of the job
(8 ranks that each keep a core busy polling would show 8.0). The load average before and after
each job is kept in the JSON. Needs root (namespaces, tc), `ip`, `tc`, the `sch_tbf` qdisc.
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from allreduce import _check, format_size, iterations, own_session, parse_size  # noqa: E402
from provenance import command_line, header  # noqa: E402
from provenance import record as provenance_record  # noqa: E402  (main() has a `record`)
from source_tree import jobs_pythonpath  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALGORITHMS = ("flat-ring", "hierarchical", "MPI", "Gloo")
IFACE = "mh0"  # the host's end of its veth pair, the same name inside every namespace


# --------------------------------------------------------------------------------- workers

def _timed(allreduce, nbytes, scale):
    """Per-call seconds of the timed calls, and the process CPU seconds they used."""
    warmup, timed = iterations(nbytes, scale)
    for _ in range(warmup):
        allreduce()
    samples = []
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for _ in range(timed):
        start = time.perf_counter()
        allreduce()
        samples.append(time.perf_counter() - start)
    return samples, time.process_time() - cpu0, time.perf_counter() - wall0


def _run_sizes(args, rank, size, make_buffer, allreduce_of):
    results = {}
    for nbytes in args.sizes:
        buf = make_buffer(nbytes // 4, float(rank + 1))
        allreduce_of(buf)()
        expected = size * (size + 1) / 2
        _check(float(buf[0]), expected, f"{args.worker} {nbytes} B first element")
        _check(float(buf[-1]), expected, f"{args.worker} {nbytes} B last element")
        buf[:] = 0
        samples, cpu, wall = _timed(allreduce_of(buf), nbytes, args.iter_scale)
        results[str(nbytes)] = {"samples": samples, "cpu_s": cpu, "wall_s": wall}
    with open(f"{args.out}.{rank}", "w") as f:
        json.dump({"rank": rank, "size": size, "results": results}, f)


def worker_horovodlike(args):
    import torch
    import horovodlike.torch as hvd
    torch.set_num_threads(1)
    hvd.init()
    _run_sizes(args, hvd.rank(), hvd.size(), lambda n, v: torch.full((n,), v),
               lambda buf: (lambda: hvd.allreduce_(buf, op=hvd.Sum, name="bench")))
    hvd.shutdown()


def worker_mpi(args):
    import numpy as np
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    _run_sizes(args, comm.Get_rank(), comm.Get_size(),
               lambda n, v: np.full(n, v, dtype=np.float32),
               lambda buf: (lambda: comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)))


def worker_gloo(args):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    _run_sizes(args, dist.get_rank(), dist.get_world_size(), lambda n, v: torch.full((n,), v),
               lambda buf: (lambda: dist.all_reduce(buf)))
    dist.destroy_process_group()


WORKERS = {"horovodlike": worker_horovodlike, "mpi": worker_mpi, "gloo": worker_gloo}


# --------------------------------------------------------------------------------- hosts

def _sh(*words, check=True):
    return subprocess.run(list(words), check=check, capture_output=True, text=True)


def split_cpus(count: int, cpus: list[int]) -> list[list[int]]:
    """The CPUs of each of ``count`` hosts: ``cpus`` cut into equal consecutive shares (one
    CPU each, taken in turn, when there are fewer CPUs than hosts)."""
    if len(cpus) < count:
        return [[cpus[i % len(cpus)]] for i in range(count)]
    share = len(cpus) // count
    return [cpus[i * share:(i + 1) * share] for i in range(count)]


class EmulatedHosts:
    """Namespaces <prefix>0..N-1 with 10.<subnet>.0.(i+1) on their `mh0`, one bridge.
    ``own_cores``: each host's processes run on a share of this machine's CPUs of their own
    (split_cpus), as a real host's run on its own cores; otherwise every host's processes
    share all of them, and the scheduler's placement (say, both ranks of one pipeline stage on
    one core for a while, then one of each) changes a job's speed from step to step."""

    def __init__(self, count: int, subnet: int, own_cores: bool = False):
        self.count, self.subnet = count, subnet
        tag = f"{os.getpid() % 100000}"
        self.bridge = f"mhbr{tag}"
        self.namespaces = [f"hvdl-mh{tag}-{i}" for i in range(count)]
        self.outer = [f"mh{tag}x{i}" for i in range(count)]  # bridge side of each veth
        self.addresses = [f"10.{subnet}.0.{i + 1}" for i in range(count)]
        self.cpus = (split_cpus(count, sorted(os.sched_getaffinity(0))) if own_cores
                     else None)

    def create(self):
        _sh("ip", "link", "add", self.bridge, "type", "bridge")
        _sh("ip", "link", "set", self.bridge, "up")
        for ns, outer, address in zip(self.namespaces, self.outer, self.addresses):
            _sh("ip", "netns", "add", ns)
            _sh("ip", "link", "add", outer, "type", "veth", "peer", "name", IFACE, "netns", ns)
            _sh("ip", "link", "set", outer, "master", self.bridge)
            _sh("ip", "link", "set", outer, "up")
            _sh("ip", "-n", ns, "addr", "add", f"{address}/24", "dev", IFACE)
            _sh("ip", "-n", ns, "link", "set", IFACE, "up")
            _sh("ip", "-n", ns, "link", "set", "lo", "up")

    def shape(self, rate: str):
        """tbf on both ends of every veth: the host's egress and its ingress, `rate` each."""
        bits = parse_rate(rate)
        burst = max(64 * 1024, bits // 8 // 1000)  # one millisecond at the rate
        limit = 4 * burst
        for ns, outer in zip(self.namespaces, self.outer):
            for prefix, dev in ((["-n", ns], IFACE), ([], outer)):
                _sh("tc", *prefix, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate,
                    "burst", str(burst), "limit", str(limit))

    def qdiscs(self) -> list[str]:
        return [_sh("tc", "-n", ns, "qdisc", "show", "dev", IFACE).stdout.strip()
                for ns in self.namespaces]

    def destroy(self):
        # The veths first: a namespace's deletion frees its end later, and the next hosts of
        # this process take the same names.
        for outer in self.outer:
            _sh("ip", "link", "del", outer, check=False)
        for ns in self.namespaces:
            _sh("ip", "netns", "del", ns, check=False)
        _sh("ip", "link", "del", self.bridge, check=False)

    def exec_prefix(self, i: int) -> list[str]:
        return ["ip", "netns", "exec", self.namespaces[i]] + self.pin(i)

    def pin(self, i: int) -> list[str]:
        """The prefix that keeps a command on host ``i``'s own CPUs (none without own_cores)."""
        if self.cpus is None:
            return []
        return ["taskset", "-c", ",".join(map(str, self.cpus[i]))]


def parse_rate(text: str) -> int:
    units = {"kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "bit": 1}
    for unit, scale in units.items():
        if text.lower().endswith(unit):
            return int(float(text[:-len(unit)]) * scale)
    raise SystemExit(f"--rates: {text!r} is not a tc rate such as 1gbit or 500mbit")


FAKE_SSH = """#!/bin/sh
# ssh for emulated hosts: runs the remote command in the namespace that owns the host address.
while [ $# -gt 0 ]; do
  case "$1" in
    -o|-p|-i|-l) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
host="$1"; shift
case "$host" in
{cases}
  *) echo "no emulated host $host" >&2; exit 255 ;;
esac
# A temporary directory per host: the hosts share one kernel and one host name, and Open MPI
# names its session directory and shared-memory segments after the host name.
mkdir -p "$tmp" && export TMPDIR="$tmp" OMPI_MCA_btl_vader_backing_directory="$tmp"
exec ip netns exec "$ns" $pin sh -c "$*"
"""


def write_fake_ssh(directory: str, hosts: EmulatedHosts) -> str:
    cases = "\n".join(f"  {a}) ns={n}; tmp={os.path.join(directory, n)}; "
                      f"pin='{' '.join(hosts.pin(i))}' ;;"
                      for i, (a, n) in enumerate(zip(hosts.addresses, hosts.namespaces)))
    path = os.path.join(directory, "ssh")
    with open(path, "w") as f:
        f.write(FAKE_SSH.format(cases=cases))
    os.chmod(path, 0o755)
    return path


# --------------------------------------------------------------------------------- jobs

def _base_env(bin_dir: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOROVOD_", "OMPI_"))}
    env["OMP_NUM_THREADS"] = "1"
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = jobs_pythonpath()
    return env


def job_commands(algorithm, hosts: EmulatedHosts, used: int, slots: int, ssh: str,
                 tail: list[str]) -> list[tuple[list[str], dict]]:
    """(argv, extra environment) of each process to start for one job."""
    py, me = sys.executable, os.path.abspath(__file__)
    host_list = ",".join(f"{a}:{slots}" for a in hosts.addresses[:used])
    np_ = used * slots
    if algorithm in ("flat-ring", "hierarchical"):
        argv = hosts.exec_prefix(0) + [py, "-m", "horovodlike.runner.launch", "-np", str(np_),
                                       "-H", host_list, "--network-interface", IFACE]
        if algorithm == "hierarchical":
            argv.append("--hierarchical-allreduce")
        return [(argv + [py, me, "--worker", "horovodlike"] + tail, {})]
    if algorithm == "MPI":
        mpirun = shutil.which("mpirun") or "mpirun"
        argv = hosts.exec_prefix(0) + [
            mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
            "-np", str(np_), "-H", host_list, "--mca", "plm_rsh_agent", ssh,
            "--mca", "btl_tcp_if_include", IFACE,
            # more ranks than cores: a rank waiting in MPI gives the core up instead of spinning
            "--mca", "mpi_yield_when_idle", "1", "--mca", "oob_tcp_if_include", IFACE,
            "-x", "PYTHONPATH", "-x", "OMP_NUM_THREADS", "-x", "PATH",
            py, me, "--worker", "mpi"] + tail
        return [(argv, {})]
    port = _free_port()
    commands = []
    for rank in range(np_):
        host = rank // slots
        env = {"MASTER_ADDR": hosts.addresses[0], "MASTER_PORT": str(port),
               "WORLD_SIZE": str(np_), "RANK": str(rank), "LOCAL_RANK": str(rank % slots),
               "GLOO_SOCKET_IFNAME": IFACE}
        commands.append((hosts.exec_prefix(host) + [py, me, "--worker", "gloo"] + tail, env))
    return commands


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load_average() -> list[float]:
    return list(os.getloadavg())


def run_job(commands, env, out, np_, timeout):
    procs = [subprocess.Popen(argv, env={**env, **extra}, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, start_new_session=True)
             for argv, extra in commands]
    outputs, deadline = [], time.time() + timeout
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=max(1.0, deadline - time.time()))[0])
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"timed out after {timeout:.0f} s")
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait()
    files = [f"{out}.{r}" for r in range(np_)]
    if any(p.returncode != 0 for p in procs) or not all(os.path.exists(f) for f in files):
        raise RuntimeError("failed:\n" + "\n".join(outputs)[-3000:])
    ranks = []
    for f in files:
        with open(f) as handle:
            ranks.append(json.load(handle))
        os.unlink(f)
    return ranks


def summarize(ranks: list[dict], sizes: list[int]) -> dict:
    """Per size: rank 0's median call, the slowest rank's median, CPU seconds summed over ranks
    and cpu/wall (summed CPU over the timed span)."""
    out = {}
    for n in sizes:
        per = [r["results"][str(n)] for r in ranks]
        medians = [statistics.median(p["samples"]) for p in per]
        out[str(n)] = {"median_s": max(medians), "calls": len(per[0]["samples"]),
                       "cpu_s_per_call": sum(p["cpu_s"] for p in per) / len(per[0]["samples"]),
                       "cpu_over_wall": sum(p["cpu_s"] for p in per) / max(p["wall_s"]
                                                                          for p in per)}
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", default="2,4", help="host counts to run (default 2,4)")
    parser.add_argument("--slots", type=int, default=2, help="ranks per host (default 2)")
    parser.add_argument("--rates", default="1gbit,10gbit", help="link rates, tc syntax")
    parser.add_argument("--sizes", default="4K,64K,1M,16M")
    parser.add_argument("--repeat", type=int, default=2, help="rounds of every job")
    parser.add_argument("--iter-scale", type=float, default=0.1,
                        help="multiplies allreduce.py's number of timed calls (default 0.1)")
    parser.add_argument("--only", default="", help="comma-separated algorithms: "
                        + ",".join(ALGORITHMS))
    parser.add_argument("--subnet", type=int, default=231, help="10.<subnet>.0.0/24 (default 231)")
    parser.add_argument("--json", help="write every figure and the load to this file")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per job")
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    if args.worker:
        args.sizes = sizes
        own_session()
        WORKERS[args.worker](args)
        return
    host_counts = sorted({int(h) for h in args.hosts.split(",")})
    rates = [r.strip() for r in args.rates.split(",") if r.strip()]
    for r in rates:
        parse_rate(r)
    algorithms = [a for a in ALGORITHMS if not args.only or a in args.only.split(",")]
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("tc"):
        raise SystemExit("multihost.py needs root and the `ip` and `tc` commands (iproute2)")
    if not 1 <= args.subnet <= 254:
        raise SystemExit("--subnet must be 1..254")

    command = command_line()
    print(header(), flush=True)
    hosts = EmulatedHosts(max(host_counts), args.subnet)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        ssh = write_fake_ssh(tmp, hosts)
        env = _base_env(tmp)
        out = os.path.join(tmp, "rank.json")
        tail = ["--out", out, "--sizes", ",".join(map(str, sizes)),
                "--iter-scale", str(args.iter_scale)]
        try:
            hosts.create()
            for rate in rates:
                hosts.shape(rate)
                print(f"links shaped: {hosts.qdiscs()[0]}", flush=True)
                for used in host_counts:
                    for round_ in range(args.repeat):
                        for algorithm in algorithms:
                            np_ = used * args.slots
                            before, start = load_average(), time.time()
                            commands = job_commands(algorithm, hosts, used, args.slots, ssh,
                                                    tail)
                            try:
                                ranks = run_job(commands, env, out, np_, args.timeout)
                            except RuntimeError as error:
                                print(f"{rate} {used} hosts {algorithm}: {error}", flush=True)
                                continue
                            record = {"rate": rate, "hosts": used, "ranks": np_,
                                      "algorithm": algorithm, "round": round_ + 1,
                                      "load_before": before, "load_after": load_average(),
                                      "sizes": summarize(ranks, sizes)}
                            results.append(record)
                            print(f"{rate} {used} hosts x {args.slots} round {round_ + 1}: "
                                  f"{algorithm} done in {time.time() - start:.0f} s, load "
                                  f"{before[0]:.1f} -> {record['load_after'][0]:.1f}",
                                  flush=True)
        finally:
            hosts.destroy()
    print_tables(results, sizes, rates, host_counts, algorithms)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": command, "provenance": provenance_record(), "slots": args.slots,
                       "results": results}, f,
                      indent=1)


def median_over_rounds(results, rate, used, algorithm, n, key):
    values = [r["sizes"][str(n)][key] for r in results
              if r["rate"] == rate and r["hosts"] == used and r["algorithm"] == algorithm]
    return statistics.median(values) if values else None


def print_tables(results, sizes, rates, host_counts, algorithms):
    for rate in rates:
        for used in host_counts:
            np_ = next((r["ranks"] for r in results if r["hosts"] == used), None)
            if np_ is None:
                continue
            loads = [r["load_before"][0] for r in results
                     if r["rate"] == rate and r["hosts"] == used]
            print()
            print(f"{rate} links, {used} hosts, {np_} ranks: median time per allreduce "
                  f"(slowest rank), busbw, cpu/wall summed over ranks; load average "
                  f"{min(loads):.1f}..{max(loads):.1f}")
            rows = [["size"] + [f"{a} {col}" for a in algorithms
                                for col in ("time", "busbw", "cpu/wall")]]
            for n in sizes:
                row = [format_size(n)]
                for a in algorithms:
                    t = median_over_rounds(results, rate, used, a, n, "median_s")
                    c = median_over_rounds(results, rate, used, a, n, "cpu_over_wall")
                    if t is None:
                        row += ["-", "-", "-"]
                        continue
                    busbw = n / t * 2 * (np_ - 1) / np_
                    row += [f"{t * 1e6:.0f} us" if t < 1e-3 else f"{t * 1e3:.2f} ms",
                            f"{busbw / 1e9 * 8:.2f} Gbit/s", f"{c:.1f}"]
                rows.append(row)
            widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
            for i, row in enumerate(rows):
                print("| " + " | ".join(c.rjust(w) for c, w in zip(row, widths)) + " |")
                if i == 0:
                    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")


if __name__ == "__main__":
    main()
