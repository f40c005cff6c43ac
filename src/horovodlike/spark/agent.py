"""The Spark side of horovodlike.spark.run_elastic: each Spark task is an agent that offers its
executor as one slot and, when the driver's elastic driver says so, starts an elastic worker
process there, stops it, and reports how it ended; the worker's output goes to the driver.

Agent <-> driver, through the job's rendezvous server (values without whitespace):
    spark/agent/<partition>            = <host>            the agent is up (its slot)
    spark/agent/<partition>/cmd/<k>    = start:<worker>:<env, base64 JSON> | stop:<worker> | done
    spark/agent/<partition>/exit/<worker> = <exit code>    (negative: killed by that signal)
    spark/agents/done                  = 1                 the job is over
Run as `python -m horovodlike.spark.agent FUNCTION_FILE RESULT_FILE`, this module is the
worker process: it calls the pickled function and pickles what it returns.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile

from horovodlike.common.rendezvous_client import RendezvousClient
from horovodlike.spark.output import OutputSender, PipeReader

AGENT_PREFIX = "spark/agent/"
DONE_KEY = "spark/agents/done"  # the job is over: agents still waiting, or starting late, end
_POLL_S = 0.2


def agent_key(partition: int, *parts) -> str:
    return AGENT_PREFIX + "/".join(map(str, (partition, *parts)))


def encode_env(env: dict[str, str]) -> str:
    return base64.urlsafe_b64encode(json.dumps(env).encode()).decode("ascii")


def decode_env(text: str) -> dict[str, str]:
    return json.loads(base64.urlsafe_b64decode(text.encode()).decode())


class WorkerProcess:
    """A worker process an agent started, with its stdout and stderr on their way to the
    driver (output.py), labelled with the worker's rank."""

    def __init__(self, command: list[str], env: dict, job, sender: str, rank: str,
                 with_timestamps: bool):
        self.process = subprocess.Popen(command, env=env, start_new_session=True,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self._sender = OutputSender(job, sender, rank, with_timestamps)
        self._readers = [PipeReader(self.process.stdout, "stdout", self._sender),
                         PipeReader(self.process.stderr, "stderr", self._sender)]
        for reader in self._readers:
            reader.start()

    def finish_output(self) -> None:
        """Once the process has ended: sends its last lines (the driver shows them before it
        learns the exit code)."""
        for reader in self._readers:
            reader.join(5.0)  # a child of the worker may still hold the pipes open
        self._sender.close()


def agent_task(payload: bytes, job, user_env: dict | None, with_timestamps: bool = False):
    """The function each partition of the agents' Spark job runs (Spark pickles it). It yields
    (worker, exit code, result) for each worker it ran."""

    def run_agent(_):
        from pyspark import TaskContext
        partition = TaskContext.get().partitionId()
        client = RendezvousClient(job.rendezvous_addr, job.rendezvous_port, job.secret_key)
        workdir = tempfile.mkdtemp(prefix="hvdl-agent-")
        function_file = os.path.join(workdir, "function.pkl")
        with open(function_file, "wb") as f:
            f.write(payload)
        running: dict[int, tuple[WorkerProcess, str]] = {}
        finished = []
        try:
            if client.get(DONE_KEY, 0) is not None:
                return
            client.put(agent_key(partition), socket.gethostname())
            command_number = 0
            while True:
                for worker, (process, result_file) in list(running.items()):
                    code = process.process.poll()
                    if code is not None:
                        process.finish_output()
                        finished.append((worker, code, _load_result(result_file, code)))
                        client.put(agent_key(partition, "exit", worker), str(code))
                        del running[worker]
                command = client.get(agent_key(partition, "cmd", command_number), _POLL_S)
                if command is None:
                    if client.get(DONE_KEY, 0) is not None:
                        break
                    continue
                command_number += 1
                kind, _, rest = command.partition(":")
                if kind == "start":
                    worker, env_text = rest.split(":", 1)
                    result_file = os.path.join(workdir, f"result.{worker}.pkl")
                    env = {**os.environ, **decode_env(env_text), **(user_env or {})}
                    running[int(worker)] = (WorkerProcess(
                        [sys.executable, "-m", "horovodlike.spark.agent", function_file,
                         result_file], env, job, f"{partition}.{command_number}", worker,
                        with_timestamps), result_file)
                elif kind == "stop" and int(rest) in running:
                    _kill(running[int(rest)][0].process)
                elif kind == "done":
                    break
        finally:
            for process, _ in running.values():
                _kill(process.process)
                process.finish_output()
            client.close()
            shutil.rmtree(workdir, ignore_errors=True)
        yield from finished

    return run_agent


def _kill(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    process.wait()


def _load_result(path: str, code: int):
    if code != 0 or not os.path.exists(path):
        return None
    import cloudpickle
    with open(path, "rb") as f:
        return cloudpickle.load(f)


def _worker_main(function_file: str, result_file: str) -> None:
    import cloudpickle
    with open(function_file, "rb") as f:
        fn, args, kwargs = cloudpickle.load(f)
    result = fn(*args, **kwargs)
    with open(result_file, "wb") as f:
        cloudpickle.dump(result, f)


if __name__ == "__main__":
    _worker_main(sys.argv[1], sys.argv[2])
