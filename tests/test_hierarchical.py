"""Hierarchical allreduce and allgather (HOROVOD_HIERARCHICAL_ALLREDUCE=1 and
HOROVOD_HIERARCHICAL_ALLGATHER=1, horovodlikerun --hierarchical-allreduce and
--hierarchical-allgather): inside each host, then across hosts.

Hosts are simulated on this machine: the launcher starts `localhost` and `127.0.0.1` ranks
without ssh, but as different hosts (their own HOROVOD_HOSTNAME, local ranks and shared-memory
group), so `-H localhost:2,127.0.0.1:2` is two hosts of two ranks. The jobs always use the
built-in transport, whatever HOROVODLIKE_TEST_TRANSPORT says: the hierarchy is its feature."""

import subprocess
import sys

import pytest

from conftest import (JOB_ENDED_WITHIN_S, REPO, WORKERS, assert_all_ranks,
                      assert_survivors_failed_fast, job_env, seconds_since_kill)
from horovodlike.runner import launch
from horovodlike.runner.environment import job_environment

TWO_BY_TWO = "localhost:2,127.0.0.1:2"
TWO_PLUS_ONE = "localhost:2,127.0.0.1:1"


def launch_on_hosts(np, hosts, script, *args, env=None, flags=(), timeout=120):
    command = [sys.executable, "-m", "horovodlike.runner.launch", "-np", str(np), "-H", hosts,
               *flags, sys.executable, str(WORKERS / script), *map(str, args)]
    return subprocess.run(command, env=job_env(env), capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


def test_equal_hosts_reduce_by_host_and_match_numpy():
    result = launch_on_hosts(4, TWO_BY_TWO, "hierarchical_worker.py", "hierarchical",
                             env={"HOROVOD_HIERARCHICAL_ALLREDUCE": "1"})
    assert_all_ranks(result, 4, "hierarchical OK")
    for rank, (local_rank, cross_rank) in enumerate([(0, 0), (1, 0), (0, 1), (1, 1)]):
        assert (f"rank {rank}: local_rank={local_rank} local_size=2 cross_rank={cross_rank} "
                f"cross_size=2" in result.stdout), result.stdout
    # The worker's last init() sets the variable on rank 0 only: rank 0 says why it goes flat.
    assert "set on this rank but not on ranks 1, 2, 3" in result.stderr, result.stderr


def test_uneven_hosts_reduce_through_the_local_roots():
    # Also the launcher flag: it sets the variable for every rank.
    result = launch_on_hosts(3, TWO_PLUS_ONE, "hierarchical_worker.py", "hierarchical",
                             flags=["--hierarchical-allreduce"])
    assert_all_ranks(result, 3, "hierarchical OK")
    assert "rank 2: local_rank=0 local_size=1 cross_rank=1 cross_size=2" in result.stdout


def test_without_the_variable_the_allreduce_stays_flat():
    result = launch_on_hosts(4, TWO_BY_TWO, "hierarchical_worker.py", "flat")
    assert_all_ranks(result, 4, "hierarchical=0 of")


def test_training_by_host_equals_a_single_process():
    result = launch_on_hosts(4, TWO_BY_TWO, "training_worker.py",
                             flags=["--hierarchical-allreduce"])
    assert_all_ranks(result, 4, "training OK")
    for line in result.stdout.splitlines():
        if "training OK" in line:
            count = int(line.split("hierarchical_allreduces=")[1].split(";")[0])
            assert count > 0, line


def test_killed_rank_during_a_hierarchical_allreduce_fails_the_others_quickly(tmp_path):
    result = launch_on_hosts(4, TWO_BY_TWO, "kill_worker.py", tmp_path,
                             flags=["--hierarchical-allreduce"], timeout=240)
    # Rank 0 shares memory with rank 1; ranks 2 and 3 are on the other host.
    assert_survivors_failed_fast(result, tmp_path, survivors=(0, 2, 3))
    assert seconds_since_kill(tmp_path) < JOB_ENDED_WITHIN_S


@pytest.mark.parametrize("flags, value", [([], None), (["--hierarchical-allreduce"], "1"),
                                          (["--no-hierarchical-allreduce"], "0")])
def test_launcher_flags_set_the_variable(flags, value):
    args = launch.make_parser().parse_args(["-np", "2", *flags, "python", "train.py"])
    env = job_environment(launch._job_settings(args, "127.0.0.1", 1234, "ab" * 32, 30.0))
    assert env.get("HOROVOD_HIERARCHICAL_ALLREDUCE") == value


def test_launcher_flags_exclude_each_other(capsys):
    with pytest.raises(SystemExit):
        launch.make_parser().parse_args(["-np", "2", "--hierarchical-allreduce",
                                         "--no-hierarchical-allreduce", "python", "train.py"])
    assert "not allowed with argument" in capsys.readouterr().err


def test_allgather_by_host_on_equal_hosts_matches_numpy():
    result = launch_on_hosts(4, TWO_BY_TWO, "hierarchical_allgather_worker.py", "hierarchical",
                             env={"HOROVOD_HIERARCHICAL_ALLGATHER": "1"})
    assert_all_ranks(result, 4, "hierarchical allgather OK")
    # The worker's last init() sets the variable on rank 0 only: rank 0 says why it goes flat.
    assert ("HOROVOD_HIERARCHICAL_ALLGATHER is set on this rank but not on ranks 1, 2, 3"
            in result.stderr), result.stderr


def test_allgather_by_host_on_uneven_hosts_matches_numpy():
    # A host with one rank; also the launcher flag, which sets the variable for every rank.
    result = launch_on_hosts(3, TWO_PLUS_ONE, "hierarchical_allgather_worker.py", "hierarchical",
                             flags=["--hierarchical-allgather"])
    assert_all_ranks(result, 3, "hierarchical allgather OK")


@pytest.mark.parametrize("np_", [4, 3])
def test_allgather_by_host_with_hosts_out_of_rank_order(np_):
    # Even and odd ranks on two hosts: {0, 2} and {1, 3} (or {1}), as mpirun may place them.
    result = launch_on_hosts(np_, f"localhost:{np_}", "hierarchical_allgather_worker.py",
                             "hierarchical", "interleaved",
                             env={"HOROVOD_HIERARCHICAL_ALLGATHER": "1"})
    assert_all_ranks(result, np_, "hierarchical allgather OK")


def test_without_the_variable_the_allgather_stays_flat():
    # The hierarchical allreduce alone does not take the allgather by host.
    result = launch_on_hosts(4, TWO_BY_TWO, "hierarchical_allgather_worker.py", "flat",
                             flags=["--hierarchical-allreduce"])
    assert_all_ranks(result, 4, "hierarchical_allgathers=0; hierarchical allgather OK")


@pytest.mark.parametrize("flags, value", [([], None), (["--hierarchical-allgather"], "1"),
                                          (["--no-hierarchical-allgather"], "0")])
def test_allgather_launcher_flags_set_the_variable(flags, value):
    args = launch.make_parser().parse_args(["-np", "2", *flags, "python", "train.py"])
    env = job_environment(launch._job_settings(args, "127.0.0.1", 1234, "ab" * 32, 30.0))
    assert env.get("HOROVOD_HIERARCHICAL_ALLGATHER") == value
    assert env.get("HOROVOD_HIERARCHICAL_ALLREDUCE") is None


def test_allgather_launcher_flags_exclude_each_other(capsys):
    with pytest.raises(SystemExit):
        launch.make_parser().parse_args(["-np", "2", "--hierarchical-allgather",
                                         "--no-hierarchical-allgather", "python", "train.py"])
    assert "not allowed with argument" in capsys.readouterr().err
