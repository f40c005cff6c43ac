"""horovodlike.spark on a real Spark session (local[2], started and stopped by this module):
training equal to NumPy and to the launcher, results and output in rank order, a failed task
naming its rank."""

import io
import os
import shutil
import sys
import tempfile

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


def test_results_and_output_in_rank_order_again_and_again(spark):
    for _ in range(2):  # Spark reuses its Python workers: a second job must form anew
        out = io.StringIO()
        results = horovodlike.spark.run(cluster_jobs.greet, args=("hello",),
                                        kwargs={"punctuation": "!"}, num_proc=2, stdout=out)
        assert results == [(0, [0, 10]), (1, [0, 10])]
        assert out.getvalue().splitlines() == ["[0]<stdout>:hello from 0!",
                                               "[1]<stdout>:hello from 1!"]


def test_a_failing_task_fails_run_naming_its_rank(spark, tmp_path):
    with pytest.raises(RuntimeError) as failure:
        horovodlike.spark.run(cluster_jobs.fail_on_rank, args=(1, "raise", str(tmp_path)),
                              num_proc=2, start_timeout=60)
    message = str(failure.value)
    assert message.startswith("rank 1 (on ") and "raised ValueError: rank 1 gives up" in \
        message, message
    # The job after a failed one works.
    results = horovodlike.spark.run(cluster_jobs.greet, args=("again",), num_proc=2,
                                    stdout=io.StringIO())
    assert [rank for rank, _ in results] == [0, 1]


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
