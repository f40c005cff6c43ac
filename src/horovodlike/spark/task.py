"""What one Spark task of horovodlike.spark.run does: it finds its rank from where Spark placed
the barrier stage's tasks, runs the user's function as that rank with its output going to the
driver (output.py), and reports a failure to the driver's rendezvous server before Spark stops
the others."""

from __future__ import annotations

import base64
import os
import random
import traceback

from horovodlike.common.rendezvous_client import RendezvousClient, RendezvousError
from horovodlike.runner.cluster_job import assign_by_host
from horovodlike.runner.environment import JobSettings, horovod_environment
from horovodlike.spark.output import CapturedOutput, OutputSender

FAILURE_PREFIX = "spark/failure/"
STARTED_PREFIX = "spark/started/"  # a task that runs: the driver's start_timeout check
_MAX_REPORT_CHARS = 1500  # the rendezvous protocol's lines are at most 4 KiB


def encode_failure(host: str, error: BaseException) -> str:
    """A failure record; an error that stands for one raised in a child process (it has
    `reported_type`) is recorded under that one's type name."""
    kind = getattr(error, "reported_type", None) or type(error).__name__
    text = f"{host}\n{kind}\n{error}"[:_MAX_REPORT_CHARS]
    return base64.urlsafe_b64encode(text.encode()).decode("ascii")


def decode_failure(value: str) -> tuple[str, str, str]:
    """(host, exception type name, message) of a failure record."""
    host, kind, message = (base64.urlsafe_b64decode(value.encode()).decode(errors="replace")
                           .split("\n", 2) + ["", ""])[:3]
    return host, kind, message


def barrier_task(fn, args, kwargs, job: JobSettings, env: dict | None,
                 with_timestamps: bool):
    """The function each partition of the barrier stage runs (Spark pickles it)."""

    def run_rank(_):
        from pyspark import BarrierTaskContext
        context = BarrierTaskContext.get()
        _put(job, f"{STARTED_PREFIX}{context.partitionId()}", "1")
        hosts = [info.address.rsplit(":", 1)[0] for info in context.getTaskInfos()]
        assignment = assign_by_host(hosts)[context.partitionId()]
        saved_env = dict(os.environ)
        os.environ.update(horovod_environment(assignment, job))
        # Spark reuses its Python workers across jobs, so the process's own count of init()
        # calls cannot name the rendezvous keys, and a stage Spark retries must not meet the
        # keys of the failed attempt: every task takes the number partition 0 drew.
        drawn = str(random.randrange(1, 1 << 30)) if context.partitionId() == 0 else ""
        os.environ["HOROVOD_ELASTIC_ROUND"] = context.allGather(drawn)[0]
        os.environ.update(env or {})
        rank = str(assignment.rank)
        try:
            with CapturedOutput(OutputSender(job, rank, rank, with_timestamps)):
                try:
                    result = fn(*args, **kwargs)
                except BaseException as error:
                    traceback.print_exc()
                    _report_failure(job, assignment.rank, assignment.hostname, error)
                    _stop_runtime()
                    raise
                # The worker process outlives the task: end this rank's runtime now, while
                # its last log lines still go to the driver.
                _stop_runtime()
        finally:
            os.environ.clear()
            os.environ.update(saved_env)
        yield assignment.rank, assignment.hostname, result

    return run_rank


def _stop_runtime() -> None:
    from horovodlike import _core  # deferred: the module imports without the core
    if _core.is_initialized():
        _core.shutdown()


def _report_failure(job: JobSettings, rank: int, host: str, error: BaseException) -> None:
    # If this fails, the driver still learns from Spark that the task failed.
    _put(job, f"{FAILURE_PREFIX}{rank}", encode_failure(host, error))


def _put(job: JobSettings, key: str, value: str) -> None:
    """Tells the driver's rendezvous server something, best effort."""
    try:
        client = RendezvousClient(job.rendezvous_addr, job.rendezvous_port, job.secret_key,
                                  timeout=10.0)
        client.put(key, value)
        client.close()
    except (RendezvousError, OSError):
        pass
