"""horovodlike.spark on a real Spark session (local[2], started and stopped by this module):
training equal to NumPy and to the launcher, results in rank order, the ranks' output (the core's
log lines too) on the driver, a failed task naming its rank, elastic training with a worker
killed and a worker added."""

import functools
import io
import os
import re
import shutil
import sys
import tempfile
import threading
import time

import numpy as np
import pytest

from conftest import PACKAGE_PARENT, WORKERS, job_env

import pyspark  # noqa: F401  (CI installs it: .[spark], and Java)

sys.path.insert(0, str(WORKERS))
import cluster_jobs  # noqa: E402
from cluster_reference import launcher_weights  # noqa: E402

import horovodlike.spark  # noqa: E402


def start_local_spark(cores):
    """A private local Spark session: loopback only, no UI, its own scratch folder; the Python
    workers import this tree and the job functions."""
    from pyspark.sql import SparkSession
    os.environ.update(job_env({
        "PYTHONPATH": os.pathsep.join([str(PACKAGE_PARENT), str(WORKERS),
                                       os.environ.get("PYTHONPATH", "")]),
        "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable}))
    scratch = tempfile.mkdtemp(prefix="hvdl-spark-")
    session = (SparkSession.builder.master(f"local[{cores}]").appName("horovodlike-tests")
               .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
               .config("spark.local.dir", scratch)
               .config("spark.driver.extraJavaOptions", f"-Djava.io.tmpdir={scratch}")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    return session, scratch


def stop_spark_jvm():
    """Ends the JVM PySpark started (stopping the session keeps it for a next one), so that
    the rest of the suite gets its memory back."""
    from pyspark import SparkContext
    gateway = SparkContext._gateway
    if gateway is None:
        return
    gateway.shutdown()
    process = getattr(gateway, "proc", None)
    if process is not None:
        process.stdin.close()  # the launcher script exits when its stdin closes
        try:
            process.wait(timeout=20)
        except Exception:  # subprocess.TimeoutExpired: make sure it goes
            process.kill()
            process.wait()
    SparkContext._gateway, SparkContext._jvm = None, None


@pytest.fixture(scope="module")
def spark():
    saved = dict(os.environ)
    session, scratch = start_local_spark(2)
    yield session
    session.stop()
    stop_spark_jvm()
    shutil.rmtree(scratch, ignore_errors=True)
    os.environ.clear()
    os.environ.update(saved)


def test_run_trains_as_numpy_and_the_launcher(spark, tmp_path):
    results = horovodlike.spark.run(cluster_jobs.train_linear, num_proc=2)
    assert [r["rank"] for r in results] == [0, 1]
    assert [r["size"] for r in results] == [2, 2]
    assert [r["local_rank"] for r in results] == [0, 1]  # one executor host
    expected = cluster_jobs.numpy_linear_weights(2)
    for result in results:
        np.testing.assert_allclose(result["weights"], expected, rtol=1e-10)
    for spark_weights, launched in zip((r["weights"] for r in results),
                                       launcher_weights(tmp_path)):
        np.testing.assert_allclose(spark_weights, launched, rtol=1e-6)


STAMP = r"\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4}"  # time.asctime(), as horovodlikerun's


def test_results_and_output_with_the_cores_log_lines_again_and_again(spark, capsys):
    for _ in range(2):  # Spark reuses its Python workers: a second job must form anew
        out, err = io.StringIO(), io.StringIO()
        results = horovodlike.spark.run(cluster_jobs.greet, args=("hello",),
                                        kwargs={"punctuation": "!"}, num_proc=2, stdout=out,
                                        stderr=err, env={"HOROVOD_LOG_LEVEL": "debug"},
                                        prefix_output_with_timestamp=True)
        assert results == [(0, [0, 10]), (1, [0, 10])]
        for rank in range(2):
            for pattern, text in (
                    (rf"{STAMP}\[{rank}\]<stdout>:hello from {rank}!", out.getvalue()),
                    (rf"{STAMP}\[{rank}\]<stdout>:and from {rank}'s file descriptor 1",
                     out.getvalue()),
                    # Written by the core's C++ logger to file descriptor 2.
                    (rf"{STAMP}\[{rank}\]<stderr>:\[horovodlike DEBUG rank {rank}\] shared "
                     r"memory with ranks on this host: 2 of 2", err.getvalue())):
                assert re.search(rf"^{pattern}$", text, re.MULTILINE), (pattern, text)
    out = io.StringIO()
    capsys.readouterr()
    horovodlike.spark.run(cluster_jobs.greet, args=("plain",), num_proc=2, stdout=out,
                          verbose=2)
    assert sorted(line for line in out.getvalue().splitlines() if "plain" in line) == \
        ["[0]<stdout>:plain from 0.", "[1]<stdout>:plain from 1."]
    # verbose=2 says where the job's rendezvous is.
    assert re.search(r"^horovodlike.spark: 2 ranks, rendezvous at 127\.0\.0\.1:\d+$",
                     capsys.readouterr().err, re.MULTILINE)


def test_a_failing_task_fails_run_naming_its_rank(spark, tmp_path):
    err = io.StringIO()
    with pytest.raises(RuntimeError) as failure:
        horovodlike.spark.run(cluster_jobs.fail_on_rank, args=(1, "raise", str(tmp_path)),
                              num_proc=2, start_timeout=60, stderr=err)
    message = str(failure.value)
    assert message.startswith("rank 1 (on ") and "raised ValueError: rank 1 gives up" in \
        message, message
    # The failed rank's traceback reached the driver.
    assert "[1]<stderr>:ValueError: rank 1 gives up" in err.getvalue().splitlines(), \
        err.getvalue()
    # The job after a failed one works.
    results = horovodlike.spark.run(cluster_jobs.greet, args=("again",), num_proc=2,
                                    stdout=io.StringIO())
    assert [rank for rank, _ in results] == [0, 1]


def test_more_ranks_than_task_slots_fail_within_start_timeout(spark):
    context = spark.sparkContext
    context.setJobGroup("the-callers-group", "the caller's jobs")
    started = time.monotonic()
    # local[2] has two task slots; a barrier stage of 3 tasks never starts.
    with pytest.raises(RuntimeError, match=r"only 0 of num_proc=3 Spark tasks were running "
                                           r"after start_timeout=4 s.*default parallelism "
                                           r"is 2"):
        horovodlike.spark.run(cluster_jobs.greet, args=("x",), num_proc=3, start_timeout=4)
    assert time.monotonic() - started < 40
    assert context.getLocalProperty("spark.jobGroup.id") == "the-callers-group"
    context.setLocalProperty("spark.jobGroup.id", None)
    context.setLocalProperty("spark.job.description", None)
    assert context.getLocalProperty("spark.jobGroup.id") is None


def test_run_elastic_without_num_proc_task_slots_fails_at_start_timeout(spark):
    # local[2] runs two of the three agents' tasks at most (how many are up after 4 s depends
    # on how fast Spark starts them); the job never has num_proc=3 slots.
    with pytest.raises(RuntimeError, match=r"only [012] of num_proc=3 Spark tasks started "
                                           r"within start_timeout=4 s; does the application "
                                           r"have 3 free task slots"):
        horovodlike.spark.run_elastic(cluster_jobs.elastic_train, args=("unused", "kill"),
                                      num_proc=3, start_timeout=4)


def test_bad_arguments_are_refused_before_anything_starts(spark):
    with pytest.raises(ValueError, match="num_proc must be a positive integer"):
        horovodlike.spark.run(cluster_jobs.greet, num_proc=0)
    with pytest.raises(ValueError, match="use_mpi"):
        horovodlike.spark.run(cluster_jobs.greet, num_proc=2, use_mpi=True)
    with pytest.raises(ValueError, match="start_timeout must be positive"):
        horovodlike.spark.run(cluster_jobs.greet, num_proc=2, start_timeout=0)


def test_run_elastic_a_killed_worker_leaves_the_job_to_the_other(spark, tmp_path):
    from test_elastic import check_report
    results = horovodlike.spark.run_elastic(cluster_jobs.elastic_train,
                                            args=(str(tmp_path), "kill"), num_proc=2,
                                            min_num_proc=1, max_num_proc=2, elastic_timeout=60)
    assert len(results) == 1, results
    report = results[0]
    sizes = [len(per_rank) for _, per_rank in report["steps"]]
    assert sizes[0] == 2 and sizes[-1] == 1 and report["size"] == 1, sizes
    check_report(report)


def test_run_elastic_a_worker_joins_when_a_spark_slot_frees(spark, tmp_path):
    from test_elastic import check_report
    hosts_file, started = tmp_path / "hosts.txt", tmp_path / "held"
    hosts_file.write_text("spark:1\n")
    # Another Spark job holds one of the two cores until rank 0, training alone, asks for a
    # second slot; then the second agent's task starts, and its worker joins.
    holder = threading.Thread(target=spark.sparkContext.parallelize([0], 1).foreach, args=(
        functools.partial(cluster_jobs.hold_a_slot, str(hosts_file), str(started)),))
    holder.start()
    deadline = time.monotonic() + 60
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    out = io.StringIO()
    results = horovodlike.spark.run_elastic(
        cluster_jobs.elastic_train, args=(str(tmp_path), "grow", str(hosts_file)), num_proc=1,
        min_num_proc=1, max_num_proc=2, elastic_timeout=60, stdout=out)
    holder.join(timeout=60)
    assert len(results) == 2 and results[1] is None, results
    report = results[0]
    sizes = [len(per_rank) for _, per_rank in report["steps"]]
    assert sizes[0] == 1 and sizes[-1] == 2 and report["size"] == 2, sizes
    check_report(report)
    # The workers' output reached the driver, labelled with the rank each started as.
    lines = out.getvalue().splitlines()
    assert any(re.fullmatch(r"\[0\]<stdout>:worker \S+ finished as rank 0 of 2", line)
               for line in lines), lines
    assert any(re.fullmatch(r"\[1\]<stdout>:worker \S+ finished as rank 1 of 2", line)
               for line in lines), lines
