"""start_timeout for horovodlike.spark.run: a barrier stage runs all its tasks at once or none,
and Spark retries one that needs more task slots than the application has for many minutes
before it gives up. The watch cancels the job when its tasks are not all running within
start_timeout, so that run() says so instead."""

from __future__ import annotations

import threading
import time
import uuid

from horovodlike.spark.task import STARTED_PREFIX

_POLL_S = 0.2
_JOB_GROUP_PROPERTIES = ("spark.jobGroup.id", "spark.job.description",
                         "spark.job.interruptOnCancel")


class StartWatch:
    """Use as a context manager around the Spark action: it runs the action in a job group of
    its own (the caller's group is restored after) and cancels that group if fewer than
    num_proc tasks have told the rendezvous server they run when timeout_s is over."""

    def __init__(self, context, server, num_proc: int, timeout_s: float, description: str):
        self._context = context
        self._server = server
        self._num_proc = num_proc
        self._timeout_s = timeout_s
        self._description = description
        self._group = f"horovodlike-{uuid.uuid4().hex}"
        self._done = threading.Event()
        self._saved: dict = {}
        self.message: str | None = None  # why the job was cancelled

    def __enter__(self) -> "StartWatch":
        self._saved = {key: self._context.getLocalProperty(key)
                       for key in _JOB_GROUP_PROPERTIES}
        self._context.setJobGroup(self._group, self._description, interruptOnCancel=True)
        threading.Thread(target=self._watch, daemon=True, name="spark-start-watch").start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._done.set()
        for key, value in self._saved.items():
            self._context.setLocalProperty(key, value)

    def _started(self) -> int:
        return sum(1 for key in self._server.keys() if key.startswith(STARTED_PREFIX))

    def _watch(self) -> None:
        deadline = time.monotonic() + self._timeout_s
        while not self._done.wait(_POLL_S):
            started = self._started()
            if started >= self._num_proc:
                return
            if time.monotonic() > deadline:
                self.message = (
                    f"only {started} of num_proc={self._num_proc} Spark tasks were running "
                    f"after start_timeout={self._timeout_s:g} s: a barrier stage needs all its "
                    f"tasks running at once; does the application have {self._num_proc} free "
                    f"task slots (its default parallelism is "
                    f"{self._context.defaultParallelism})? Use fewer processes, or a larger "
                    "start_timeout where executors start on demand")
                self._context.cancelJobGroup(self._group)
                return
