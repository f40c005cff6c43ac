"""horovodlike.spark.run: a horovodlike job whose ranks are the tasks of one Spark barrier stage,
with Horovod's signature. The Spark driver holds the rendezvous server and the job's secret."""

from __future__ import annotations

import os
import socket
import sys

from horovodlike.runner import network
from horovodlike.runner.cluster_job import start_rendezvous
from horovodlike.spark.output import OutputForwarder
from horovodlike.spark.start_watch import StartWatch
from horovodlike.spark.task import FAILURE_PREFIX, barrier_task, decode_failure

DEFAULT_START_TIMEOUT_S = 600.0


def active_spark_context():
    from pyspark import SparkContext
    context = SparkContext._active_spark_context
    if context is None:
        raise ValueError("horovodlike.spark needs an active SparkContext: create one first, "
                         "e.g. SparkSession.builder.master('local[2]').getOrCreate()")
    return context


def start_timeout_s(start_timeout) -> float:
    if start_timeout is None:
        start_timeout = os.environ.get("HOROVOD_SPARK_START_TIMEOUT", DEFAULT_START_TIMEOUT_S)
    try:
        value = float(start_timeout)
    except ValueError:
        raise ValueError(f"start_timeout (or HOROVOD_SPARK_START_TIMEOUT) must be a number of "
                         f"seconds, got {start_timeout!r}") from None
    if not value > 0:
        raise ValueError(f"start_timeout must be positive, got {value:g}")
    return value


def driver_address(context) -> str:
    """The address the executors reach this driver at: loopback for a local master on this
    machine, else spark.driver.host resolved."""
    host = context.getConf().get("spark.driver.host") or socket.gethostname()
    master = context.master or ""
    if master.startswith("local") and network.is_local_host(host):
        return "127.0.0.1"
    try:
        return socket.gethostbyname(host)
    except OSError:
        return host


def check_num_proc(num_proc, context) -> int:
    if num_proc is None:
        return context.defaultParallelism
    if not isinstance(num_proc, int) or num_proc < 1:
        raise ValueError(f"num_proc must be a positive integer, got {num_proc!r}")
    return num_proc


def check_options(use_mpi, extra_mpi_args, nics) -> str | None:
    """The one network interface the ranks use (nics), after refusing what needs mpirun."""
    if use_mpi or extra_mpi_args:
        raise ValueError("horovodlike.spark runs its ranks in Spark tasks without mpirun; "
                         "use_mpi and extra_mpi_args are not supported")
    nics = set(nics or ())
    if len(nics) > 1:
        raise ValueError(f"nics: give one network interface for the ranks, got {sorted(nics)}")
    return next(iter(nics), None)


def run(fn, args=(), kwargs={}, num_proc=None, start_timeout=None, use_mpi=None,
        use_gloo=None, extra_mpi_args=None, env=None, stdout=None, stderr=None, verbose=1,
        nics=None, prefix_output_with_timestamp=False, executable=None):
    """Runs fn(*args, **kwargs) as num_proc ranks (default: Spark's default parallelism), one
    Spark barrier-mode task each; ranks are grouped by executor host. Returns the results in
    rank order. Each rank's output (its process's stdout and stderr, the core's log lines
    included) is printed here while the job runs, each line prefixed with its rank and, with
    prefix_output_with_timestamp, its time (`stdout`/`stderr`: where to, default this
    process's). A rank that raises fails the job:
    RuntimeError names it. `env`: variables set for the ranks. `executable` is accepted for
    Horovod's signature; the ranks run in Spark's Python workers. Raises RuntimeError when
    the num_proc tasks are not all running within start_timeout (default
    HOROVOD_SPARK_START_TIMEOUT, else 600 s), which is also how long the ranks have to find
    each other in hvd.init()."""
    context = active_spark_context()
    num_proc = check_num_proc(num_proc, context)
    interface = check_options(use_mpi, extra_mpi_args, nics)
    timeout = start_timeout_s(start_timeout)
    server, job = start_rendezvous(driver_address(context), timeout,
                                   network_interface=interface,
                                   use_gloo=bool(use_gloo))
    try:
        if verbose >= 2:
            print(f"horovodlike.spark: {num_proc} ranks, rendezvous at "
                  f"{job.rendezvous_addr}:{job.rendezvous_port}", file=sys.stderr)
        task = barrier_task(fn, tuple(args), dict(kwargs), job, env,
                            prefix_output_with_timestamp)
        forwarder = OutputForwarder(server, stdout, stderr)
        forwarder.start()
        watch = StartWatch(context, server, num_proc, timeout,
                           f"horovodlike.spark.run ({num_proc} ranks)")
        try:
            with watch:
                ranks = (context.parallelize(range(num_proc), num_proc).barrier()
                         .mapPartitions(task).collect())
        except Exception as error:
            raise RuntimeError(watch.message or describe_failure(server, error)) from error
        finally:
            forwarder.stop()  # every task sent its last lines before it ended
    finally:
        server.stop()
    ranks.sort(key=lambda entry: entry[0])
    return [result for _, _, result in ranks]


def describe_failure(server, error: BaseException) -> str:
    """Names the rank that failed first in cause, from the failures the ranks reported to the
    job's rendezvous server (see describe_failures)."""
    failures = {}
    for key in server.keys():
        if key.startswith(FAILURE_PREFIX):
            failures[int(key[len(FAILURE_PREFIX):])] = decode_failure(server.get(key))
    if not failures:
        first = str(error).strip().splitlines()
        return (f"the Spark job of horovodlike.spark.run failed before any rank reported why: "
                f"{first[0] if first else type(error).__name__}")
    return describe_failures(failures)


def describe_failures(failures: dict[int, tuple[str, str, str]]) -> str:
    """{rank: (host, exception type name, message)} as one sentence naming the rank that failed
    first in cause: one that did not fail with HorovodInternalError (what its peers raise
    because of it), else the lowest failed rank."""
    primary = min((r for r, (_, kind, _) in failures.items() if kind != "HorovodInternalError"),
                  default=min(failures))
    host, kind, message = failures[primary]
    text = f"rank {primary} (on {host}) raised {kind}: {message.strip()}"
    others = sorted(set(failures) - {primary})
    if others:
        text += f"; then rank{'s' if len(others) > 1 else ''} {', '.join(map(str, others))} " \
                "failed too"
    return text
