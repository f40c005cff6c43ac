"""horovodlike.spark.TorchDistributor: the interface of pyspark.ml.torch.distributor's
TorchDistributor, with horovodlike ranks instead of torchrun's processes.

`run(train_object, *args)` runs a function on every rank (hvd.init() inside it forms the job)
and returns rank 0's result, or runs a Python script with its command-line arguments as every
rank's program and returns None. With local_mode=True the ranks are processes on this (the
driver's) machine, started as `horovodlikerun -np N` starts them; with local_mode=False they are
the tasks of one Spark barrier stage (horovodlike.spark.run).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile

import horovodlike
from horovodlike.runner.environment import EXIT_WITH_LAUNCHER
from horovodlike.spark.rank_program import RESULT_FILE, read_failures
from horovodlike.spark.runner import active_spark_context, describe_failures, run as spark_run

TASK_GPU_AMOUNT = "spark.task.resource.gpu.amount"


class RankProgramError(RuntimeError):
    """A rank's program failed in its own process; carries that failure's type name, which
    the driver's report names (task.encode_failure)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.reported_type = kind


class TorchDistributor:
    """Runs distributed training on `num_processes` horovodlike ranks, as PySpark's
    TorchDistributor runs it on torchrun's processes.

    local_mode: True runs the ranks on the driver's machine, False as Spark tasks on the
    executors. use_gpu: each rank trains on a GPU; in local mode the machine must have at least
    num_processes of them (ranks pick theirs with hvd.local_rank()), on executors each task
    needs spark.task.resource.gpu.amount=1 and sees only the GPU Spark gave it
    (CUDA_VISIBLE_DEVICES). Needs an active SparkSession, as PySpark's does."""

    def __init__(self, num_processes: int = 1, local_mode: bool = True, use_gpu: bool = True):
        if isinstance(num_processes, bool) or not isinstance(num_processes, int) or \
                num_processes < 1:
            raise ValueError(f"TorchDistributor: num_processes must be a positive integer, got "
                             f"{num_processes!r}")
        self._context = active_spark_context()
        self.num_processes = num_processes
        self.local_mode = bool(local_mode)
        self.use_gpu = bool(use_gpu)
        if self.use_gpu:
            self._check_gpus()

    def _check_gpus(self) -> None:
        """Refuses use_gpu=True where the ranks would find no GPU of their own."""
        if not self.local_mode:
            amount = self._context.getConf().get(TASK_GPU_AMOUNT, "0")
            if float(amount) != 1:
                raise RuntimeError(
                    f"TorchDistributor(use_gpu=True, local_mode=False) gives each rank the GPU "
                    f"of its Spark task: set {TASK_GPU_AMOUNT}=1 (it is {amount}), or pass "
                    "use_gpu=False to train on CPUs")
            return
        count, reason = local_gpu_count()
        if count < self.num_processes:
            raise RuntimeError(
                f"TorchDistributor(use_gpu=True, local_mode=True): num_processes="
                f"{self.num_processes} ranks need a GPU each, but this machine has {count}"
                + (f" ({reason})" if reason else "")
                + "; lower num_processes, or pass use_gpu=False to train on CPUs")

    def run(self, train_object, *args, **kwargs):
        """Runs train_object on every rank. A function is called as train_object(*args,
        **kwargs) and rank 0's return value is returned; a path to a Python script runs as
        `python train_object args...` (args as strings, no kwargs) and None is returned. A
        failed rank raises RuntimeError naming it and its error."""
        if isinstance(train_object, (str, os.PathLike)):
            script = os.fspath(train_object)
            if kwargs:
                raise ValueError("TorchDistributor.run: a script takes command-line arguments "
                                 "only; pass them as strings in args, not as keyword arguments")
            if not os.path.isfile(script):
                raise FileNotFoundError(f"TorchDistributor.run: no script at {script!r}; give "
                                        "the path of a Python file")
            self._run_script(os.path.abspath(script), [str(a) for a in args])
            return None
        if not callable(train_object):
            raise TypeError(f"TorchDistributor.run: train_object must be a function or the "
                            f"path of a Python script, got {type(train_object).__name__}")
        return self._run_function(train_object, args, kwargs)

    def _run_function(self, fn, args, kwargs):
        if self.local_mode:
            return self._run_locally(["function"], (fn, args, kwargs))
        results = spark_run(_on_task(_rank_zero_result, self.use_gpu, fn), args=args,
                            kwargs=kwargs, num_proc=self.num_processes)
        return results[0]

    def _run_script(self, script: str, args: list[str]) -> None:
        if self.local_mode:
            self._run_locally(["script", script, *args], None)
        else:
            spark_run(_on_task(run_rank_program, self.use_gpu, ["script", script, *args]),
                      num_proc=self.num_processes)

    def _run_locally(self, program: list[str], payload):
        """The ranks as processes of this machine, started by the launcher; their output
        goes to this process's stdout and stderr."""
        report_dir = tempfile.mkdtemp(prefix="hvdl-distributor-")
        try:
            if payload is not None:
                program = [program[0], _pickle(payload, report_dir)]
            code = subprocess.call(
                [sys.executable, "-m", "horovodlike.runner.launch", "-np",
                 str(self.num_processes), sys.executable, "-m",
                 "horovodlike.spark.rank_program", report_dir, *program], env=_python_env())
            failures = read_failures(report_dir)
            if failures:
                raise RuntimeError(describe_failures(failures))
            if code != 0:
                raise RuntimeError(f"TorchDistributor: the ranks' launcher exited with code "
                                   f"{code} before any rank reported an error (see its output)")
            if payload is None:
                return None
            import cloudpickle
            with open(os.path.join(report_dir, RESULT_FILE), "rb") as f:
                return cloudpickle.load(f)
        finally:
            shutil.rmtree(report_dir, ignore_errors=True)


def _on_task(body, use_gpu: bool, target):
    """What each Spark task runs: body(target, ...) on the GPU Spark gave the task, if any."""

    def run_on_task(*args, **kwargs):
        if use_gpu:
            from pyspark import BarrierTaskContext
            gpus = BarrierTaskContext.get().resources()["gpu"].addresses
            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)  # the task restores it
        return body(target, *args, **kwargs)

    return run_on_task


def _rank_zero_result(fn, *args, **kwargs):
    """fn's result on rank 0; None from the others, which need not travel to the driver."""
    result = fn(*args, **kwargs)
    return result if os.environ.get("HOROVOD_RANK") == "0" else None


def run_rank_program(program: list[str]) -> None:
    """In a Spark task: the rank's program as a child process, with the rank's environment;
    its output goes where the task's goes (to the driver). Its failure is raised here. The
    child has a session of its own and ends, as a launcher's rank does, when the driver's
    rendezvous server goes (the job failed elsewhere and Spark gave up this task)."""
    report_dir = tempfile.mkdtemp(prefix="hvdl-rank-")
    env = {**_python_env(), EXIT_WITH_LAUNCHER: "1"}
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        child = subprocess.Popen([sys.executable, "-m", "horovodlike.spark.rank_program",
                                  report_dir, *program], env=env, start_new_session=True)
        try:
            code = child.wait()
        finally:
            if child.poll() is None:  # this task was interrupted
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
        failures = read_failures(report_dir)
        if failures:
            _, kind, message = next(iter(failures.values()))
            raise RankProgramError(kind, message)
        if code != 0:
            raise RuntimeError(f"the rank's program ended with exit code {code}")
    finally:
        shutil.rmtree(report_dir, ignore_errors=True)


def local_gpu_count() -> tuple[int, str]:
    """The GPUs a new process of this machine would see (CUDA_VISIBLE_DEVICES applies), and
    why none when there are none. Asked in a child so that this process keeps no CUDA state."""
    probe = ("from horovodlike import _core; cuda = dict(_core.gpu_info()).get('cuda') or {}; "
             "print(int(cuda.get('devices') or 0)); print(cuda.get('error') or '')")
    try:
        out = subprocess.run([sys.executable, "-c", probe], env=_python_env(), timeout=120,
                             capture_output=True, text=True, check=True).stdout.splitlines()
    except (subprocess.SubprocessError, OSError) as error:
        return 0, f"could not ask the CUDA runtime: {error}"
    return int(out[0]), (out[1] if len(out) > 1 else "")


def _pickle(payload, folder: str) -> str:
    import cloudpickle
    path = os.path.join(folder, "function.pkl")
    with open(path, "wb") as f:
        cloudpickle.dump(payload, f)
    return path


def _python_env() -> dict[str, str]:
    """This process's environment, with this horovodlike first on the children's path."""
    env = dict(os.environ)
    parent = os.path.dirname(os.path.dirname(os.path.abspath(horovodlike.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [parent, env.get("PYTHONPATH")]))
    return env
