"""The Gloo and MPI transports, asked for explicitly (`--gloo`, `--mpi`): the requested transport
is the one the ranks use; the collective and training workers pass over each; a failed or
killed rank ends the job loudly; and the digits example trains to the same weights over tcp,
gloo and mpi. (HOROVODLIKE_TEST_TRANSPORT runs the rest of the suite over one of them.)"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import (JOB_ENDED_WITHIN_S, NOTICED_WITHIN_S, REPO, assert_all_ranks,
                      assert_survivors_failed_fast, job_env, launch, seconds_since_kill)
from horovodlike import _core

BUILD = _core.build_info()
# Transports the environment installed and so must be built (CI sets it after installing Gloo
# and Open MPI): their tests then run, and fail, instead of being skipped.
REQUIRED = [name for name in os.environ.get("HOROVODLIKE_REQUIRE_TRANSPORTS", "").split(",")
            if name]
needs_gloo = pytest.mark.skipif(not BUILD["gloo"] and "gloo" not in REQUIRED,
                                reason="this build has no Gloo")
needs_mpi = pytest.mark.skipif((not BUILD["mpi"] or shutil.which("mpirun") is None)
                               and "mpi" not in REQUIRED,
                               reason="this build has no MPI, or mpirun is not installed")
GLOO = pytest.param("gloo", marks=needs_gloo)
MPI = pytest.param("mpi", marks=needs_mpi)
FLAGS = {"tcp": [], "gloo": ["--gloo"], "mpi": ["--mpi"]}


def processes_mentioning(text):
    """Live processes whose command line contains `text` (and that are not zombies)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if text in cmdline and state != "Z":
            found.append((int(entry.name), cmdline))
    return found


@pytest.mark.parametrize("transport", [GLOO, MPI])
def test_the_requested_transport_is_the_one_used(transport):
    result = launch(3, "transport_worker.py", "report", launcher_args=FLAGS[transport])
    assert_all_ranks(result, 3, "transport OK")
    lines = [line for line in result.stdout.splitlines() if "transport OK" in line]
    for rank in range(3):
        line = next(line for line in lines if line.startswith(f"[{rank}]<stdout>:"))
        assert f"transport={transport} " in line, line
        assert f"mpi_enabled={transport == 'mpi'} " in line, line
        assert f"gloo_enabled={transport == 'gloo'} " in line, line
        # One host: every rank is local, and the cross communicator is the rank alone.
        assert (f"size=3 local_rank={rank} local_size=3 cross_rank=0 cross_size=1"
                in line), line


def test_the_default_transport_is_tcp_or_shared_memory():
    # Not through launch(), which HOROVODLIKE_TEST_TRANSPORT may point at another transport.
    result = subprocess.run(
        [sys.executable, "-m", "horovodlike.runner.launch", "-np", "2", sys.executable,
         str(REPO / "tests" / "workers" / "transport_worker.py"), "report"],
        env=job_env(), capture_output=True, text=True, timeout=120, cwd=REPO)
    assert_all_ranks(result, 2, "mpi_enabled=False gloo_enabled=False")
    # Both ranks on this host: shared memory, not a silent fall-back to the loopback.
    assert re.search(r"transport=shm ", result.stdout), result.stdout


def installed_for_building(name):
    """What CMake would find here (CMakeLists.txt): Gloo's headers and its library, or MPI's
    compiler wrapper."""
    if name == "mpi":
        return shutil.which("mpicc") is not None
    prefixes = [Path("/usr"), Path("/usr/local")]
    headers = any((p / "include" / "gloo" / "allreduce_ring.h").is_file() for p in prefixes)
    libraries = any(any((p / lib).glob("**/libgloo.so")) for p in prefixes
                    for lib in ("lib", "lib64"))
    return headers and libraries


@pytest.mark.parametrize("name", ["gloo", "mpi"])
def test_the_transports_installed_or_required_are_built(name):
    # A build that silently left out a transport would skip that transport's tests: named in
    # HOROVODLIKE_REQUIRE_TRANSPORTS (CI), or installed where the tests run, it must be built.
    required = name in REQUIRED
    if not (required or installed_for_building(name)):
        pytest.skip(f"{name} is neither installed here nor in HOROVODLIKE_REQUIRE_TRANSPORTS")
    why = "HOROVODLIKE_REQUIRE_TRANSPORTS names it" if required else "it is installed here"
    assert BUILD.get(name) is True, (
        f"{why}, but this build of horovodlike has no {name} support (build_info: {BUILD}); "
        f"rebuild it where CMake finds {name}")
    if name == "mpi":
        assert shutil.which("mpirun") is not None, "MPI is required but mpirun is not installed"


# The providers that must carry a small allreduce, a large one and an allgather, by link: a
# silent fall-back (shared memory to TCP, MPI's own allreduce to the ring) fails here.
EXPECTED_PROVIDERS = {
    "shm": "SHM_ALLREDUCE,SHM_RING_ALLGATHER",
    "tcp": "TCP_RECURSIVE_DOUBLING_ALLREDUCE,TCP_RING_ALLGATHER,TCP_RING_ALLREDUCE",
    "gloo": "GLOO_RECURSIVE_DOUBLING_ALLREDUCE,GLOO_RING_ALLGATHER,GLOO_RING_ALLREDUCE",
    "mpi": "MPI_ALLREDUCE,MPI_RING_ALLGATHER,MPI_RING_ALLREDUCE",
}


@pytest.mark.parametrize("link,flags,env", [
    ("shm", [], {}),
    ("tcp", [], {"HOROVOD_SHM_DISABLE": "1"}),
    pytest.param("gloo", ["--gloo"], {}, marks=needs_gloo),
    pytest.param("mpi", ["--mpi"], {}, marks=needs_mpi),
])
def test_the_data_goes_over_the_expected_link(link, flags, env):
    result = launch(2, "transport_worker.py", "links", launcher_args=flags, env=env,
                    transport="tcp")
    assert_all_ranks(result, 2, "links OK")
    for line in result.stdout.splitlines():
        if "links OK" in line:
            assert f"transport={link} ran={EXPECTED_PROVIDERS[link]};" in line, line


@pytest.mark.parametrize("transport", [GLOO, MPI])
@pytest.mark.parametrize("np_", [2, 3])
def test_collectives_over(transport, np_):
    result = launch(np_, "collectives_worker.py", launcher_args=FLAGS[transport])
    assert_all_ranks(result, np_, "604 allreduce checks passed; collectives OK")


@pytest.mark.parametrize("np_", [3, 4])
def test_collectives_over_tcp_alone(np_):
    # Shared memory off: allreduces up to 32 KiB take the recursive doubling (3 ranks fold a
    # pair first), larger ones the ring.
    result = launch(np_, "collectives_worker.py", transport="tcp",
                    env={"HOROVOD_SHM_DISABLE": "1"})
    assert_all_ranks(result, np_, "604 allreduce checks passed; collectives OK")


@pytest.mark.parametrize("np_", [2, 3])
def test_collectives_over_shared_memory_with_streaming_slot_stores(np_):
    # Every large allreduce writes its staging slots with streaming stores (2 ranks: the fused
    # add-and-store of float32 and float64; 3 ranks and other types: the streaming copy); the
    # default (auto) takes both ways in its first runs.
    result = launch(np_, "collectives_worker.py", env={"HOROVOD_SHM_STREAM_STORES": "on"})
    assert_all_ranks(result, np_, "604 allreduce checks passed; collectives OK")


@pytest.mark.parametrize("transport", [GLOO, MPI])
def test_alltoall_reducescatter_process_sets_and_join_over(transport):
    result = launch(3, "api_worker.py", env={"HOROVOD_DYNAMIC_PROCESS_SETS": "1"},
                    launcher_args=FLAGS[transport])
    assert_all_ranks(result, 3, "api OK")


@pytest.mark.parametrize("transport", [GLOO, MPI])
@pytest.mark.parametrize("np_", [2, 3])
def test_training_over(transport, np_):
    result = launch(np_, "training_worker.py", launcher_args=FLAGS[transport])
    assert_all_ranks(result, np_, "training OK")


@pytest.mark.parametrize("transport", ["tcp", GLOO, MPI])
def test_a_rank_that_gives_up_fails_the_others_and_all_start_again(transport, tmp_path):
    """The last rank is stopped; the others time out on it (2 s), and it learns on waking (once
    they have) that they gave up (MPI: an abort notice; Gloo, TCP, shared memory: the closed
    connections) instead of waiting for ever. Then all shut down, init() again, and work."""
    result = launch(3, "transport_worker.py", "stall", tmp_path,
                    launcher_args=FLAGS[transport])
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    for rank in range(3):
        outcome, recovered = (tmp_path / f"rank{rank}.txt").read_text().splitlines()
        assert outcome.startswith("HorovodInternalError after"), (rank, outcome)
        # The peer timeout (2 s) and then seconds at most, not for ever.
        assert float(outcome.split()[2]) < NOTICED_WITHIN_S, (rank, outcome)
        # The default transport is tcp, with shared memory between the ranks of a host.
        names = ("tcp", "shm", "shm+tcp") if transport == "tcp" else (transport,)
        assert recovered in [f"recovered over {name}" for name in names], (rank, recovered)


@needs_gloo
def test_killed_rank_under_gloo_fails_the_others_quickly(tmp_path):
    result = launch(3, "kill_worker.py", tmp_path, launcher_args=["--gloo"])
    assert_survivors_failed_fast(result, tmp_path, survivors=(0, 2))
    assert seconds_since_kill(tmp_path) < JOB_ENDED_WITHIN_S
    assert not processes_mentioning(str(tmp_path))


@needs_mpi
def test_killed_rank_under_mpi_ends_the_job(tmp_path):
    """Open MPI ends the whole job when a rank dies (the survivors are killed by mpirun:
    SIGTERM, which kill_worker ignores, then SIGKILL), so they report nothing; the launcher
    names the rank with mpirun's verdict and exits at once with its code."""
    result = launch(3, "kill_worker.py", tmp_path, launcher_args=["--mpi"])
    assert result.returncode == 128 + 9, result.stdout + result.stderr
    assert re.search(r"horovodlikerun: rank 1 \(on \S+\) was killed by signal 9 \(SIGKILL\)",
                     result.stderr), result.stderr
    assert seconds_since_kill(tmp_path) < JOB_ENDED_WITHIN_S
    assert not processes_mentioning(str(tmp_path))


@needs_mpi
def test_mpi_output_is_tagged_like_ours(tmp_path):
    """mpirun's `[1,<rank>]<stdout>:` tags, even of a line written in pieces by two ranks at
    once, come out as `[<rank>]<stdout>:line`, and --output-filename gets the raw lines."""
    script = tmp_path / "pieces.py"
    script.write_text(
        "import os, sys, time\n"
        "rank = os.environ['OMPI_COMM_WORLD_RANK']\n"
        "for i in range(3):\n"
        "    sys.stdout.write(f'rank {rank} piece'); sys.stdout.flush(); time.sleep(0.05)\n"
        "    sys.stdout.write(f' {i} done\\n'); sys.stdout.flush()\n"
        "print(f'rank {rank} to stderr', file=sys.stderr)\n")
    out_dir = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-m", "horovodlike.runner.launch", "-np", "2", "--mpi",
         "--output-filename", str(out_dir), sys.executable, str(script)],
        env=job_env(), capture_output=True, text=True, timeout=240, cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    for rank in (0, 1):
        for i in range(3):
            assert f"[{rank}]<stdout>:rank {rank} piece {i} done" in result.stdout.splitlines()
        assert f"[{rank}]<stderr>:rank {rank} to stderr" in result.stderr.splitlines()
        raw = (out_dir / f"rank.{rank}" / "stdout").read_text()
        assert raw == "".join(f"rank {rank} piece {i} done\n" for i in range(3))
    assert "[1," not in result.stdout + result.stderr


def run_digits(transport, weights):
    command = [sys.executable, "-m", "horovodlike.runner.launch", "-np", "2",
               *FLAGS[transport], sys.executable, str(REPO / "examples" / "pytorch_digits.py"),
               "--epochs", "2", "--seed", "5", "--save-weights", str(weights)]
    result = subprocess.run(command, env=job_env(), capture_output=True, text=True,
                            timeout=300, cwd=REPO)
    assert result.returncode == 0, (transport, result.stdout[-3000:] + result.stderr[-3000:])
    with np.load(weights) as arrays:
        return {name: arrays[name] for name in arrays.files}


@pytest.fixture(scope="module")
def tcp_digits_weights(tmp_path_factory):
    return run_digits("tcp", tmp_path_factory.mktemp("digits") / "tcp.npz")


@pytest.mark.parametrize("transport", [GLOO, MPI])
def test_digits_example_trains_to_the_same_weights_as_over_tcp(transport, tcp_digits_weights,
                                                               tmp_path):
    expected = tcp_digits_weights
    got = run_digits(transport, tmp_path / f"{transport}.npz")
    assert sorted(got) == sorted(expected)
    for name in expected:
        assert np.allclose(got[name], expected[name], rtol=1e-5, atol=1e-7), \
            f"{name}: max difference {np.abs(got[name] - expected[name]).max()}"


def test_mpirun_command_line():
    from horovodlike.runner.hosts import HostSlots
    from horovodlike.runner.mpi_run import forwarded_names, mpirun_command

    launcher_env = {"PATH": "/bin", "PYTHONPATH": "/src", "HOME": "/root",
                    "OMPI_MCA_btl": "self", "HOROVOD_RANK": "3", "HOROVOD_FUSION_THRESHOLD": "0"}
    job = {"HOROVOD_SECRET_KEY": "s3cret", "HOROVOD_CONTROLLER": "mpi"}
    names = forwarded_names(launcher_env, job)
    # The login session's, MPI's own and one rank's variables stay behind.
    assert sorted(names) == ["HOROVOD_CONTROLLER", "HOROVOD_FUSION_THRESHOLD",
                             "HOROVOD_SECRET_KEY", "PATH", "PYTHONPATH", "PYTHONUNBUFFERED"]
    argv = mpirun_command("/usr/bin/mpirun", [HostSlots("a", 2), HostSlots("b", 2)], 3,
                          ["/usr/bin/python3", "train.py"], names, as_root=True,
                          oversubscribe=False, network_interface="eth1", ssh_port=2222,
                          mpi_args=["--mca", "btl", "^openib"])
    assert argv[:12] == ["/usr/bin/mpirun", "--allow-run-as-root", "--tag-output", "-np", "3",
                         "-H", "a:2,b:2", "--bind-to", "none", "--map-by", "slot", "-mca"]
    assert argv[-5:] == ["--mca", "btl", "^openib", "/usr/bin/python3", "train.py"]
    assert ["-mca", "btl_tcp_if_include", "eth1"] == argv[11:14]
    assert ["-mca", "plm_rsh_args", "-p 2222"] == argv[17:20]
    assert "--oversubscribe" not in argv
    assert ["-x", "HOROVOD_SECRET_KEY"] == argv[argv.index("HOROVOD_SECRET_KEY") - 1:][:2]
    assert "s3cret" not in " ".join(argv)  # values travel in mpirun's environment
    local = mpirun_command("mpirun", [HostSlots("localhost", 4)], 4, ["python3", "x.py"], [],
                           as_root=False, oversubscribe=True)
    assert "--allow-run-as-root" not in local and "--oversubscribe" in local


@needs_mpi
@pytest.mark.skipif(shutil.which("mpicxx") is None and "mpi" not in REQUIRED,
                    reason="needs MPI's C++ compiler wrapper")
def test_an_abandoned_mpi_collective_is_released_once_it_completes(tmp_path):
    # tests/native/mpi_abandon_selftest.cc: rank 0 gives up on an MPI_Iallreduce its peer joins
    # late; the request and its buffer are kept until MPI completes it, then released.
    binary = tmp_path / "mpi_abandon"
    sources = ["common/common.cc", "common/env_config.cc", "common/interrupt.cc",
               "common/logging.cc",
               "reduce/reduce.cc", "reduce/scale.cc", "links/link.cc", "links/mpi/mpi_link.cc",
               "links/mpi/mpi_tagged.cc", "collectives/mpi/mpi_allreduce.cc"]
    build = subprocess.run(["mpicxx", "-O1", "-std=c++17",
                            *[str(REPO / "csrc" / s) for s in sources],
                            str(REPO / "tests" / "native" / "mpi_abandon_selftest.cc"), "-o",
                            str(binary)], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-4000:]
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOROVOD_")}
    result = subprocess.run(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2",
                             str(binary)], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "rank 0: abandoned 1, left 0" in result.stdout, result.stdout
    assert "rank 1: abandoned" in result.stdout and result.stdout.count("0 failures") == 2


# HOROVOD_CPU_OPERATIONS edits the provider table: mpi runs MPI's own allreduce at every size
# (the 4 MiB allreduce too, which the default leaves to the ring), gloo runs the collectives
# over Gloo even without --gloo. The job's counts, and --check-build, show the providers chosen.
@pytest.mark.parametrize("operations,flags,ran,check_build", [
    pytest.param("mpi", ["--mpi"], "MPI_ALLREDUCE,MPI_RING_ALLGATHER",
                 "allreduce: mpi_allreduce (every size, HOROVOD_CPU_OPERATIONS=mpi), "
                 "recursive_doubling_allreduce (up to 32 KiB, over mpi), ring_allreduce (over mpi)",
                 marks=needs_mpi),
    pytest.param("gloo", [],
                 "GLOO_RECURSIVE_DOUBLING_ALLREDUCE,GLOO_RING_ALLGATHER,GLOO_RING_ALLREDUCE",
                 "allreduce: recursive_doubling_allreduce (up to 32 KiB, over gloo), "
                 "ring_allreduce (over gloo)", marks=needs_gloo),
])
def test_cpu_operations_choose_the_providers(operations, flags, ran, check_build):
    env = {"HOROVOD_CPU_OPERATIONS": operations.upper()}  # as Horovod's documentation writes it
    result = launch(2, "transport_worker.py", "links", launcher_args=flags, env=env,
                    transport="tcp")
    assert_all_ranks(result, 2, "links OK")
    for line in result.stdout.splitlines():
        if "links OK" in line:
            assert f"transport={operations} ran={ran};" in line, line
    report = subprocess.run([sys.executable, "-m", "horovodlike.runner.launch", "--check-build"],
                            env=job_env(env), capture_output=True, text=True, timeout=240)
    assert report.returncode == 0, report.stderr
    assert f"    {check_build}" in report.stdout.splitlines(), report.stdout


def test_cpu_operations_horovod_accepts_but_we_lack_fail_clearly():
    result = launch(2, "init_only_worker.py", env={"HOROVOD_CPU_OPERATIONS": "ccl"},
                    transport="tcp")
    assert result.returncode != 0
    assert "HOROVOD_CPU_OPERATIONS=ccl: horovodlike has no oneCCL support; use mpi, gloo or " \
           "tcp" in result.stdout + result.stderr, result.stdout + result.stderr


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to pin ranks apart")
@pytest.mark.parametrize("mode, cores, spins", [("own", 2, True), ("shared", 1, False)])
def test_ranks_pinned_to_cores_count_the_cores_they_share(mode, cores, spins):
    # A rank pinned to one core may still spin while its peer has a core of its own: the host's
    # ranks count the union of their masks, not each its own (which would make every pinned
    # job sleep and wake through the kernel on each wait). Pinned to one core together, they
    # must not spin.
    result = launch(2, "pinned_worker.py", mode, transport="tcp")
    assert_all_ranks(result, 2, f"spins={spins} host_cores={cores} ")
