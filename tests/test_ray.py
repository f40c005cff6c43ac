"""horovodlike.ray on a real local Ray cluster that this module starts (2 CPUs, its own temp
folder) and stops: training equal to NumPy and to the launcher, results in rank order, failures
named, nothing left behind (no process, actor or CPU), a clear error when the cluster is too
small, and elastic training with a worker killed, added, removed, and the reset limit."""

import os
import shutil
import sys
import tempfile
import time

import numpy as np
import pytest

from conftest import PACKAGE_PARENT, WORKERS, job_env

import ray  # noqa: E402  (CI installs it: .[ray])

sys.path.insert(0, str(WORKERS))
import cluster_jobs  # noqa: E402
from cluster_reference import launcher_weights  # noqa: E402
from test_elastic import check_report  # noqa: E402

from horovodlike.ray import ElasticRayExecutor, RayExecutor  # noqa: E402
from horovodlike.common.rendezvous_client import RendezvousClient, RendezvousError  # noqa: E402


def start_local_ray(num_cpus, **kwargs):
    """A private Ray instance: its own temp folder, no dashboard; the actors import this tree
    and the job functions (the raylet passes this process's environment to them)."""
    os.environ.update(job_env({"PYTHONPATH": os.pathsep.join(
        [str(PACKAGE_PARENT), str(WORKERS), os.environ.get("PYTHONPATH", "")])}))
    temp_dir = tempfile.mkdtemp(prefix="hvdl-ray-")
    for attempt in range(3):
        try:
            ray.init(address="local", num_cpus=num_cpus, include_dashboard=False,
                     _temp_dir=temp_dir, log_to_driver=True, **kwargs)
            return temp_dir
        except Exception as error:  # Ray gives its node 30 s to start, too few on a busy host
            if "timed out during startup" not in str(error) or attempt == 2:
                raise
            ray.shutdown()


def local_cluster(num_cpus, **environ):
    """A local Ray cluster for one module's tests (a fixture's body), started with `environ`
    set; the environment is restored afterwards."""
    saved = dict(os.environ)
    os.environ.update(environ)
    temp_dir = start_local_ray(num_cpus)
    try:
        yield
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(scope="module")
def local_ray():
    yield from local_cluster(2)


@pytest.fixture
def executor(local_ray):
    executor = RayExecutor(RayExecutor.create_settings(timeout_s=30), num_workers=2)
    yield executor
    executor.shutdown()


def live_actors():
    """The ids of the Ray actors that are not dead, from Ray's control store (Ray's public
    state API needs the dashboard, which these tests do not start)."""
    from ray._private import state
    return {actor_id for actor_id, actor in state.actors().items() if actor["State"] != "DEAD"}


def wait_until_freed(pids, actors_before, seconds=30):
    """Waits until the worker processes `pids` are gone, no actor beyond `actors_before` lives
    and both CPUs are free; fails naming what is left."""
    deadline = time.monotonic() + seconds
    while True:
        left = {"processes": [pid for pid in pids if _process_exists(pid)],
                "actors": sorted(live_actors() - actors_before),
                "busy CPUs": 2 - ray.available_resources().get("CPU", 0)}
        if not any(left.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert not any(left.values()), f"left behind: {left}"


@pytest.fixture(scope="class")
def job(local_ray):
    """TestOneJob's job, started once for the class (a module-level function: pytest deprecates
    class-scoped fixtures defined as instance methods)."""
    actors_before = live_actors()
    executor = RayExecutor(RayExecutor.create_settings(timeout_s=30), num_workers=2)
    executor.start(executable_cls=cluster_jobs.Counter, executable_args=[10],
                   extra_env_vars={"HVDL_TEST_GREETING": "hi"})
    executor.actors_before = actors_before
    yield executor
    executor.shutdown()


class TestOneJob:
    """The tests that leave their job working share one (what costs is starting actors that
    import torch); the last one shuts it down. The job's workers hold both CPUs until then."""

    def test_training_equals_numpy_and_the_launcher(self, job, tmp_path):
        results = job.run(cluster_jobs.train_linear)
        assert [r["rank"] for r in results] == [0, 1]
        assert [r["size"] for r in results] == [2, 2]
        expected = cluster_jobs.numpy_linear_weights(2)
        for result in results:
            np.testing.assert_allclose(result["weights"], expected, rtol=1e-10)
        for ray_weights, launched in zip((r["weights"] for r in results),
                                         launcher_weights(tmp_path)):
            np.testing.assert_allclose(ray_weights, launched, rtol=1e-6)

    def test_execute_execute_single_and_run_remote_in_rank_order(self, job):
        # A lambda: os.environ.get itself would carry this process's environment along.
        assert job.run(lambda name: os.environ.get(name),
                       args=["HVDL_TEST_GREETING"]) == ["hi", "hi"]
        # The job's rendezvous server runs here, in the driver, guarded by a secret of its
        # own that every worker got and a stranger does not have.
        rendezvous = job.run(lambda: [os.environ[f"HOROVOD_{name}"] for name in
                                      ("RENDEZVOUS_ADDR", "RENDEZVOUS_PORT", "SECRET_KEY")])
        assert rendezvous[0] == rendezvous[1], rendezvous
        address, port, secret = rendezvous[0]
        assert int(port) == job._server.port and len(secret) == 64, rendezvous
        RendezvousClient(address, int(port), secret, timeout=10).close()
        with pytest.raises(RendezvousError, match="refused this job's secret"):
            RendezvousClient(address, int(port), "0" * 64, timeout=10)
        # Each worker holds a Counter(10); add(amount) adds amount * (rank + 1).
        assert job.execute(lambda counter: counter.value) == [10, 10]
        assert job.execute(lambda counter: counter.add(1)) == [(0, 11), (1, 12)]
        assert job.execute(lambda counter: counter.add(2)) == [(0, 13), (1, 16)]
        assert job.execute_single(lambda counter: counter.value) == 13
        futures = job.run_remote(cluster_jobs.placement)
        results = ray.get(futures)
        assert [r["rank"] for r in results] == [0, 1]
        assert all(r["sum"] == 3.0 and r["local_size"] == 2 and r["cross_size"] == 1
                   for r in results), results
        assert job.run(lambda a, b=0: a * 10 + b, args=[4], kwargs={"b": 2}) == [42, 42]

    def test_callbacks_get_the_logged_values_while_the_workers_run(self, job, tmp_path):
        marker = tmp_path / "seen"
        first, second = [], []

        def note(value):
            first.append(value)
            marker.touch()

        results = job.run(cluster_jobs.logged_sums, args=[str(marker)],
                          callbacks=[note, second.append])
        assert results == [True, None]  # rank 0 saw the callback act before it returned
        assert first == second == expected_sums([0])  # rank 0's values only, in order
        everyone = []
        job.execute(lambda _: cluster_jobs.logged_sums(str(marker), chief_only=False),
                    callbacks=[everyone.append])
        assert sorted(everyone, key=lambda v: (v["rank"], v["step"])) == expected_sums([0, 1])
        with pytest.raises(TypeError, match=r"callbacks\[1\] is a str"):
            job.run(cluster_jobs.placement, callbacks=[print, "print"])
        # Each call's queue actor is gone with the call: only the two workers live.
        assert len(live_actors() - job.actors_before) == 2

    def test_shutdown_leaves_no_actor_process_or_cpu_behind(self, job):
        pids = [node["pid"] for node in job.nodes]
        assert [r["rank"] for r in job.run(cluster_jobs.placement)] == [0, 1]
        job.shutdown()
        wait_until_freed(pids, job.actors_before)
        with pytest.raises(RuntimeError, match=r"not started; call start\(\) first"):
            job.run(cluster_jobs.placement)


def expected_sums(ranks, size=2):
    return [{"rank": rank, "step": step, "sum": float(sum((r + 1) * (step + 1)
                                                          for r in range(size)))}
            for rank in ranks for step in range(3)]


@pytest.mark.parametrize("how", ["raise", "kill"])
def test_failed_worker_is_named_and_the_others_raise(executor, tmp_path, how):
    actors_before = live_actors()
    executor.start()
    pids = [node["pid"] for node in executor.nodes]
    with pytest.raises(RuntimeError) as failure:
        executor.run(cluster_jobs.fail_on_rank, args=[1, how, str(tmp_path)])
    # Timed from the failure itself (rank 1 wrote when): the start-up before it takes any time
    # on a busy machine. Seconds, where a silent peer would take the peer timeout (300 s).
    since_failure = time.time() - float((tmp_path / "failed_at").read_text())
    message = str(failure.value)
    if how == "raise":
        assert message.startswith("rank 1 (on ") and "raised ValueError: rank 1 gives up" in \
            message, message
    else:
        assert message.startswith("rank 1 (on ") and "died" in message, message
    outcome, seconds = (tmp_path / "rank0.txt").read_text().split()
    assert outcome == "HorovodInternalError" and 0 <= float(seconds) < 10, (outcome, seconds)
    assert since_failure < 30
    with pytest.raises(RuntimeError, match="this job failed .*call shutdown"):
        executor.run(cluster_jobs.placement)
    # A failed job's shutdown leaves nothing behind either.
    executor.shutdown()
    wait_until_freed(pids, actors_before)


def test_too_few_cpus_is_a_clear_error_within_the_placement_timeout(local_ray):
    settings = RayExecutor.create_settings(placement_group_timeout_s=3)
    executor = RayExecutor(settings, num_workers=3, cpus_per_worker=1)
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"could not place 3 workers with 1 CPU each .*"
                                           r"the cluster has 2 CPUs"):
        executor.start()
    # Its 3 s, not for ever (the bound leaves room for a busy machine).
    assert time.monotonic() - started < 30
    assert executor.workers == []


def test_use_current_placement_group_places_the_workers_in_the_drivers_group(local_ray):
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    def drive_in_the_current_placement_group(use_current):
        """A driver that is itself a Ray task inside a placement group (as under Ray Tune);
        defined here so that Ray ships it by value."""
        # Short where no group can be placed; long where the actors only have to start.
        settings = RayExecutor.create_settings(placement_group_timeout_s=60 if use_current
                                               else 5)
        executor = RayExecutor(settings, num_workers=2, use_current_placement_group=use_current)
        try:
            executor.start()
            return executor.run(cluster_jobs.placement)
        except TimeoutError as error:
            return str(error)
        finally:
            executor.shutdown()

    group = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="PACK")
    ray.get(group.ready(), timeout=60)
    drive = ray.remote(num_cpus=0)(drive_in_the_current_placement_group).options(
        scheduling_strategy=PlacementGroupSchedulingStrategy(
            group, placement_group_capture_child_tasks=True))
    try:
        # The group holds both CPUs: the workers fit only in it.
        results = ray.get(drive.remote(True), timeout=120)
        assert [(r["rank"], r["sum"]) for r in results] == [(0, 3.0), (1, 3.0)], results
        assert "could not place 2 workers" in ray.get(drive.remote(False), timeout=120)
    finally:
        remove_placement_group(group)


def test_bad_arguments_are_refused_before_anything_starts():
    settings = RayExecutor.create_settings()
    with pytest.raises(ValueError, match="either num_workers, or num_hosts"):
        RayExecutor(settings)
    with pytest.raises(ValueError, match="either num_workers, or num_hosts"):
        RayExecutor(settings, num_workers=2, num_hosts=2)
    with pytest.raises(ValueError, match="num_workers must be a positive integer"):
        RayExecutor(settings, num_workers=0)
    with pytest.raises(ValueError, match="use_gpu"):
        RayExecutor(settings, num_workers=2, gpus_per_worker=1)
    with pytest.raises(ValueError, match="max_num_proc .* must be >= min_num_proc"):
        ElasticRayExecutor.create_settings(min_num_proc=3, max_num_proc=2)


class FileDiscovery:
    """The hosts a file lists, one `address:slots` a line (the test's workers edit it)."""

    def __init__(self, path):
        self.path = path

    def find_available_hosts_and_slots(self):
        hosts = {}
        for line in open(self.path).read().split():
            host, slots = line.split(":")
            hosts[host] = int(slots)
        return hosts


def run_elastic(tmp_path, scenario, settings, callbacks=None, **executor_args):
    """executor.run's results; whether it returns or raises, no actor of it is left after."""
    actors_before = live_actors()
    executor = ElasticRayExecutor(settings, cpus_per_slot=1, **executor_args)
    executor.start()
    try:
        hosts_file = str(tmp_path / "hosts.txt")
        return executor.run(lambda: cluster_jobs.elastic_train(
            str(tmp_path), scenario, hosts_file, log_steps=bool(callbacks)), callbacks)
    finally:
        executor.shutdown()
        wait_until_freed([], actors_before)


def test_elastic_worker_killed_the_job_finishes_with_the_other(local_ray, tmp_path, capfd):
    settings = ElasticRayExecutor.create_settings(min_num_proc=1, max_num_proc=2,
                                                  elastic_timeout=60)
    results = run_elastic(tmp_path, "kill", settings)
    assert len(results) == 1, results
    report = results[0]
    sizes = [len(per_rank) for _, per_rank in report["steps"]]
    assert sizes[0] == 2 and sizes[-1] == 1 and report["size"] == 1, sizes
    check_report(report)
    assert "/1: its Ray actor died" in capfd.readouterr().err


def slots_from_a_file(tmp_path, slots=1, **settings):
    """Settings whose discovery offers this node with `slots` slots, until the "grow" or
    "shrink" scenario's rank 0 changes that."""
    node = ray.util.get_node_ip_address()
    (tmp_path / "hosts.txt").write_text(f"{node}:{slots}\n")
    options = {"min_num_proc": 1, "max_num_proc": 2, "elastic_timeout": 60, **settings}
    return ElasticRayExecutor.create_settings(
        discovery=FileDiscovery(str(tmp_path / "hosts.txt")), **options)


def test_elastic_worker_added_by_discovery_joins(local_ray, tmp_path):
    settings = slots_from_a_file(tmp_path)
    logged = []
    results = run_elastic(tmp_path, "grow", settings, callbacks=[logged.append],
                          override_discovery=False)
    assert len(results) == 2 and results[1] is None, results
    report = results[0]
    sizes = [len(per_rank) for _, per_rank in report["steps"]]
    assert sizes[0] == 1 and sizes[-1] == 2 and report["size"] == 2, sizes
    check_report(report)
    # Rank 0 sent every step to the callback, before and after the worker joined.
    assert logged == report["steps"]


def test_elastic_worker_stopped_when_its_slot_leaves_the_discovery(local_ray, tmp_path, capfd):
    # Three slots offered, max_num_proc=2: two workers (a third would wait for a CPU for ever).
    settings = slots_from_a_file(tmp_path, slots=3)
    results = run_elastic(tmp_path, "shrink", settings, override_discovery=False)
    assert len(results) == 1, results
    report = results[0]
    sizes = [len(per_rank) for _, per_rank in report["steps"]]
    assert sizes[0] == 2 and sizes[-1] == 1 and report["size"] == 1, sizes
    check_report(report)
    # A node that leaves is no failure: its slot is not retired, no error is reported.
    err = capfd.readouterr().err
    assert "retired" not in err and "died" not in err, err


def test_elastic_fewer_workers_than_min_num_proc_stops_the_job(local_ray, tmp_path):
    # One slot offered, min_num_proc=2: the driver waits elastic_timeout for a second one.
    settings = slots_from_a_file(tmp_path, slots=1, min_num_proc=2, elastic_timeout=5)
    with pytest.raises(RuntimeError, match=r"the elastic Ray job failed: only 1 workers left, "
                                           r"fewer than min_num_proc 2, for 5 s"):
        run_elastic(tmp_path, "grow", settings, override_discovery=False)


def test_elastic_reset_limit_stops_the_job(local_ray, tmp_path):
    # The worker that joins needs a new round: one reset more than reset_limit=0 allows.
    settings = slots_from_a_file(tmp_path, reset_limit=0)
    with pytest.raises(RuntimeError, match=r"the elastic Ray job failed: the job was reset 1 "
                                           r"times, more than reset_limit 0"):
        run_elastic(tmp_path, "grow", settings, override_discovery=False)


def _process_exists(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie has exited; only its parent has not reaped it yet.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
