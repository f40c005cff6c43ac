"""horovodlikerun, with real processes: small Python ranks (tests/helpers/rank.py), a fake ssh
that runs the remote command here, and the rendezvous server spoken to over real sockets."""

import json
import os
import re
import select
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import horovodlike.runner
from horovodlike.runner.check_build import format_report
from horovodlike.runner.hosts import HostError, assign_ranks, parse_hostfile, parse_hosts
from horovodlike.runner.output import rank_output_dir
from horovodlike.runner.rendezvous import MAX_LINE_BYTES, RendezvousServer, answer_hello

REPO = Path(__file__).resolve().parents[1]
HELPERS = REPO / "tests" / "helpers"
# The launcher subprocesses import the same horovodlike as this process (installed or not).
PACKAGE_PARENT = Path(horovodlike.runner.__file__).resolve().parents[2]
RANK = str(HELPERS / "rank.py")
SECRET = "ab" * 32


def launcher_env(**extra) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGE_PARENT),
                                                      env.get("PYTHONPATH")]))
    env.pop("HOROVOD_START_TIMEOUT", None)
    env.update(extra)
    return env


def launch(args, env=None, cwd=None, timeout=240):
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "horovodlike.runner.launch", *args],
                            env=env or launcher_env(), cwd=cwd, capture_output=True, text=True,
                            timeout=timeout)
    result.elapsed = time.monotonic() - started
    return result


def records(directory: Path, size: int) -> list[dict]:
    return [json.loads((directory / f"rank.{r}.json").read_text()) for r in range(size)]


def pid_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"  # a zombie has ended; only its exit status is left


def wait_until_dead(pids, timeout=30.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(pid_alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if pid_alive(p)]


def topology(record: dict) -> tuple:
    env = record["env"]
    return tuple(int(env[f"HOROVOD_{name}"]) for name in
                 ("RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE"))


@pytest.fixture(autouse=True)
def kill_leftover_ranks(tmp_path):
    """When a test fails, the ranks it recorded must not outlive it."""
    yield
    for record_file in tmp_path.glob("rank.*.json"):
        record = json.loads(record_file.read_text())
        for pid in (record["pid"], record["child_pid"]):
            if pid and pid_alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def fake_ssh(tmp_path):
    """A directory to put first on PATH, whose `ssh` records argv into the returned log dir."""
    bin_dir, log_dir = tmp_path / "fakebin", tmp_path / "ssh-log"
    bin_dir.mkdir()
    log_dir.mkdir()
    ssh = bin_dir / "ssh"
    ssh.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} "
                   f"{shlex.quote(str(HELPERS / 'fake_ssh.py'))} \"$@\"\n")
    ssh.chmod(0o755)
    env = launcher_env(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
                       FAKE_SSH_LOG=str(log_dir))
    return env, log_dir


# ---------------------------------------------------------------- environment of the ranks

def test_local_ranks_get_their_environment(tmp_path):
    env = launcher_env(HOROVOD_START_TIMEOUT="25", FROM_LAUNCHER="kept")
    result = launch(["-np", "3", sys.executable, RANK, "--record", str(tmp_path), "--join"],
                    env=env)
    assert result.returncode == 0, result.stderr
    recs = records(tmp_path, 3)
    assert [topology(r) for r in recs] == [(0, 3, 0, 3, 0, 1), (1, 3, 1, 3, 0, 1),
                                           (2, 3, 2, 3, 0, 1)]
    secrets_seen = {r["env"]["HOROVOD_SECRET_KEY"] for r in recs}
    assert len(secrets_seen) == 1 and re.fullmatch(r"[0-9a-f]{64}", secrets_seen.pop())
    for r in recs:
        e = r["env"]
        assert e["HOROVOD_HOSTNAME"] == "localhost"
        assert e["HOROVOD_RENDEZVOUS_ADDR"] == "127.0.0.1"
        assert 0 < int(e["HOROVOD_RENDEZVOUS_PORT"]) < 65536
        assert e["HOROVOD_START_TIMEOUT"] == "25"  # from the launcher's environment
        assert e["PYTHONUNBUFFERED"] == "1"
        assert e["FROM_LAUNCHER"] == "kept"
        for unset in ("HOROVOD_FUSION_THRESHOLD", "HOROVOD_CYCLE_TIME", "HOROVOD_CACHE_CAPACITY",
                      "HOROVOD_LOG_LEVEL", "HOROVOD_GLOO_IFACE", "HOROVOD_AUTOTUNE",
                      "HOROVOD_AUTOTUNE_LOG"):
            assert unset not in e
    # a second job gets a new secret
    launch(["-np", "1", sys.executable, RANK, "--record", str(tmp_path)], env=env)
    assert records(tmp_path, 1)[0]["env"]["HOROVOD_SECRET_KEY"] != recs[0]["env"][
        "HOROVOD_SECRET_KEY"]


def test_flags_become_environment_and_verbose_prints_plan(tmp_path):
    env = launcher_env(HOROVOD_START_TIMEOUT="25")
    result = launch(["-np", "2", "--start-timeout", "20", "--fusion-threshold-mb", "2",
                     "--cycle-time-ms", "2.5", "--cache-capacity", "100", "--disable-cache",
                     "--log-level", "DEBUG", "--network-interface", "lo", "--verbose",
                     "--autotune", "--autotune-log-file", "tune.csv",
                     "--autotune-warmup-samples", "0", "--autotune-steps-per-sample", "4",
                     "--autotune-bayes-opt-max-samples", "9",
                     "--autotune-gaussian-process-noise", "0.25",
                     sys.executable, RANK, "--record", str(tmp_path), "--join"], env=env)
    assert result.returncode == 0, result.stderr
    for r in records(tmp_path, 2):
        e = r["env"]
        assert e["HOROVOD_START_TIMEOUT"] == "20"  # the flag wins over the environment
        assert e["HOROVOD_FUSION_THRESHOLD"] == str(2 * 1024 * 1024)
        assert e["HOROVOD_CYCLE_TIME"] == "2.5"
        assert e["HOROVOD_CACHE_CAPACITY"] == "0"  # --disable-cache wins
        assert e["HOROVOD_LOG_LEVEL"] == "DEBUG"
        assert e["HOROVOD_GLOO_IFACE"] == "lo"
        assert (e["HOROVOD_AUTOTUNE"], e["HOROVOD_AUTOTUNE_LOG"]) == ("1", "tune.csv")
        assert (e["HOROVOD_AUTOTUNE_WARMUP_SAMPLES"], e["HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE"],
                e["HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES"],
                e["HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE"]) == ("0", "4", "9", "0.25")
    port = records(tmp_path, 1)[0]["env"]["HOROVOD_RENDEZVOUS_PORT"]
    assert (f"horovodlikerun: rendezvous server listening on 127.0.0.1:{port}; "
            f"ranks connect to 127.0.0.1:{port}") in result.stdout
    assert ("horovodlikerun:   rank 1 on localhost (local): local rank 1 of 2, "
            "cross rank 0 of 1") in result.stdout


def test_local_aliases_run_without_ssh(tmp_path, fake_ssh):
    env, ssh_log = fake_ssh
    result = launch(["-np", "3", "-H", "localhost:2,127.0.0.1:2", sys.executable, RANK,
                     "--record", str(tmp_path), "--join"], env=env)
    assert result.returncode == 0, result.stderr
    assert list(ssh_log.iterdir()) == []
    recs = records(tmp_path, 3)
    assert [r["env"]["HOROVOD_HOSTNAME"] for r in recs] == ["localhost", "localhost", "127.0.0.1"]
    assert [topology(r) for r in recs] == [(0, 3, 0, 2, 0, 2), (1, 3, 1, 2, 0, 1),
                                           (2, 3, 0, 1, 1, 2)]


def test_remote_hosts_go_through_ssh(tmp_path, fake_ssh):
    env, ssh_log = fake_ssh
    env["FROM_LAUNCHER"] = "forwarded"
    workdir = tmp_path / "work dir"
    workdir.mkdir()
    key = tmp_path / "id_test"
    key.write_text("not a real key\n")
    result = launch(["-np", "3", "-H", "a:2,b:2", "-p", "2222", "--ssh-identity-file", str(key),
                     "--start-timeout", "20", sys.executable, RANK, "--record", str(tmp_path),
                     "--join", "--", "it's", "two words"], env=env, cwd=workdir)
    assert result.returncode == 0, result.stderr

    invocations = [json.loads(p.read_text()) for p in ssh_log.iterdir()]
    assert len(invocations) == 3
    for argv in invocations:
        assert argv[:10] == ["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
                             "-o", "ConnectTimeout=10", "-p", "2222", "-i", str(key)]
        assert len(argv) == 12
        assert argv[11].startswith(f"cd {shlex.quote(str(workdir))} && env ")
        words = shlex.split(argv[11])
        assert words[:3] == ["cd", str(workdir), "&&"] and words[3] == "env"
        assert words[-8:] == [sys.executable, RANK, "--record", str(tmp_path), "--join", "--",
                              "it's", "two words"]
        assignments = dict(w.split("=", 1) for w in words[4:-8])
        assert assignments["PYTHONPATH"] == env["PYTHONPATH"]
        assert assignments["FROM_LAUNCHER"] == "forwarded"
        assert not {"HOME", "PWD", "SHLVL"} & set(assignments)
    by_rank = {}
    for argv in invocations:
        words = shlex.split(argv[11])
        rank = next(w for w in words if w.startswith("HOROVOD_RANK=")).split("=")[1]
        by_rank[int(rank)] = argv[10]
    assert by_rank == {0: "a", 1: "a", 2: "b"}

    recs = records(tmp_path, 3)
    assert [r["env"]["HOROVOD_HOSTNAME"] for r in recs] == ["a", "a", "b"]
    assert [topology(r) for r in recs] == [(0, 3, 0, 2, 0, 2), (1, 3, 1, 2, 0, 1),
                                           (2, 3, 0, 1, 1, 2)]
    for r in recs:
        assert r["cwd"] == str(workdir)
        assert r["words"] == ["it's", "two words"]
        assert r["env"]["FROM_LAUNCHER"] == "forwarded"  # fake ssh clears the environment


# ---------------------------------------------------------------- output

def test_output_is_prefixed_and_lines_kept_whole(tmp_path):
    long_line = 200_000
    result = launch(["-np", "2", sys.executable, RANK, "--lines", "3",
                     "--long-line", str(long_line), "--partial", "tail"])
    assert result.returncode == 0, result.stderr
    out_lines = result.stdout.splitlines()
    assert all(re.match(r"^\[[01]\]<stdout>:", line) for line in out_lines), out_lines[:5]
    for rank in (0, 1):
        mine = [line[len(f"[{rank}]<stdout>:"):] for line in out_lines
                if line.startswith(f"[{rank}]<stdout>:")]
        assert mine == [f"line {i} of rank {rank}" for i in range(3)] + \
            [str(rank) * long_line, "tail"]
        errs = [line for line in result.stderr.splitlines()
                if line.startswith(f"[{rank}]<stderr>:")]
        assert errs == [f"[{rank}]<stderr>:err {i} of rank {rank}" for i in range(3)]


def test_output_filename_writes_raw_per_rank_files(tmp_path):
    out = tmp_path / "logs"
    result = launch(["-np", "2", "--output-filename", str(out), sys.executable, RANK,
                     "--lines", "2", "--partial", "tail"])
    assert result.returncode == 0, result.stderr
    for rank in (0, 1):
        assert (out / f"rank.{rank}" / "stdout").read_text() == \
            f"line 0 of rank {rank}\nline 1 of rank {rank}\ntail"
        assert (out / f"rank.{rank}" / "stderr").read_text() == \
            f"err 0 of rank {rank}\nerr 1 of rank {rank}\n"
    assert "[1]<stdout>:line 1 of rank 1\n" in result.stdout  # the console still gets them
    assert rank_output_dir(str(out), 3, 11) == out / "rank.03"
    assert rank_output_dir(str(out), 7, 8) == out / "rank.7"


# ---------------------------------------------------------------- failures and signals

# The jobs below have ranks that sleep 120 s: a launcher that stopped them ends well before,
# however busy the machine is with start-ups.
STOPPED_WITHIN_S = 60


def test_failing_rank_stops_the_job_with_its_code(tmp_path):
    result = launch(["-np", "3", sys.executable, RANK, "--record", str(tmp_path), "--join",
                     "--fail", "1:3", "--fail-delay", "0.5", "--sleep", "120"], timeout=180)
    assert result.returncode == 3
    assert result.elapsed < STOPPED_WITHIN_S  # not after the other ranks' sleep
    message = "horovodlikerun: rank 1 (on localhost) exited with code 3; stopping the job"
    assert message in result.stderr
    assert result.stderr.index("[1]<stderr>:rank 1 failing with 3") < result.stderr.index(message)
    assert wait_until_dead([r["pid"] for r in records(tmp_path, 3)]) == []


def test_rank_killed_by_signal(tmp_path):
    result = launch(["-np", "2", sys.executable, RANK, "--record", str(tmp_path), "--join",
                     "--sigkill", "0", "--fail-delay", "0.3", "--sleep", "120"], timeout=180)
    assert result.returncode == 128 + 9
    assert result.elapsed < STOPPED_WITHIN_S
    assert ("horovodlikerun: rank 0 (on localhost) was killed by signal 9 (SIGKILL); "
            "stopping the job") in result.stderr
    assert wait_until_dead([r["pid"] for r in records(tmp_path, 2)]) == []


def test_start_timeout_names_ranks_that_never_joined(tmp_path):
    result = launch(["-np", "4", "--start-timeout", "1.5", sys.executable, RANK,
                     "--record", str(tmp_path), "--join", "--no-join-ranks", "2,3",
                     "--sleep", "120"], timeout=180)
    assert result.returncode == 1
    assert 1.5 <= result.elapsed < STOPPED_WITHIN_S
    assert ("horovodlikerun: ranks 2, 3 (on localhost) did not join within 1.5 s"
            in result.stderr), result.stderr
    assert "rank 0" not in result.stderr and "rank 1 " not in result.stderr
    assert wait_until_dead([r["pid"] for r in records(tmp_path, 4)]) == []


def test_ranks_that_finish_without_joining_are_fine():
    result = launch(["-np", "2", "--start-timeout", "1", sys.executable, "-c", "print('done')"])
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == ["[0]<stdout>:done", "[1]<stdout>:done"]


@pytest.mark.parametrize("signum, stubborn_ranks", [(signal.SIGINT, "1"), (signal.SIGTERM, "")])
def test_signal_to_launcher_leaves_no_process_behind(tmp_path, signum, stubborn_ranks):
    """SIGINT with a rank that ignores SIGTERM (so SIGKILL must follow) and ranks that have
    children of their own."""
    launcher = subprocess.Popen(
        [sys.executable, "-m", "horovodlike.runner.launch", "-np", "2", sys.executable, RANK,
         "--record", str(tmp_path), "--join", "--child", "--ignore-term-ranks", stubborn_ranks,
         "--sleep", "60"],
        env=launcher_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not all((tmp_path / f"rank.{r}.json").exists() for r in range(2)):
            assert time.monotonic() < deadline and launcher.poll() is None
            time.sleep(0.05)
        recs = records(tmp_path, 2)
        pids = [r["pid"] for r in recs] + [r["child_pid"] for r in recs]
        assert all(pid_alive(p) for p in pids)
        launcher.send_signal(signum)
        _, stderr = launcher.communicate(timeout=60)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.communicate()
    assert launcher.returncode == 128 + signum
    assert f"horovodlikerun: received {signal.Signals(signum).name}; stopping the job" in stderr
    assert wait_until_dead(pids) == []


def test_missing_command_is_reported():
    result = launch(["-np", "2", sys.executable + "-no-such-binary"])
    assert result.returncode == 127
    assert "cannot start rank 0 (on localhost)" in result.stderr


def test_bin_script_runs_a_job(tmp_path):
    result = subprocess.run([sys.executable, str(REPO / "bin" / "horovodlikerun"), "-np", "2",
                             sys.executable, "-c", "import os; print(os.environ['HOROVOD_RANK'])"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == ["[0]<stdout>:0", "[1]<stdout>:1"]


# ---------------------------------------------------------------- hosts

def test_too_few_slots_is_a_clear_error():
    result = launch(["-np", "5", "-H", "localhost:2,b:2", "true"])
    assert result.returncode == 2
    assert "-np 5 needs 5 slots but the hosts localhost:2,b:2 have only 4" in result.stderr


def test_host_parsing(tmp_path):
    assert [(h.hostname, h.slots) for h in parse_hosts("a:2,b,10.0.0.3:4")] == \
        [("a", 2), ("b", 1), ("10.0.0.3", 4)]
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# workers\nnode1 slots=4\nnode2:2  # comment\n\nnode3\n")
    assert [(h.hostname, h.slots) for h in parse_hostfile(str(hostfile))] == \
        [("node1", 4), ("node2", 2), ("node3", 1)]
    hostfile.write_text("node1 slots=4\nnode2 cpus=2\n")
    with pytest.raises(HostError, match="line 2"):
        parse_hostfile(str(hostfile))
    for bad in ("a:0", "a:x", "a:2,a:2", "a b:2", ""):
        with pytest.raises(HostError):
            parse_hosts(bad)
    cross = [(a.hostname, a.local_rank, a.local_size, a.cross_rank, a.cross_size)
             for a in assign_ranks(parse_hosts("a:3,b:1,c:2,d:4"), 6)]
    assert cross == [("a", 0, 3, 0, 3), ("a", 1, 3, 0, 2), ("a", 2, 3, 0, 1),
                     ("b", 0, 1, 1, 3), ("c", 0, 2, 2, 3), ("c", 1, 2, 1, 2)]  # d gets none


def test_hostfile_flag(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost slots=1\n127.0.0.1 slots=1\n")
    result = launch(["-np", "2", "--hostfile", str(hostfile), sys.executable, RANK,
                     "--record", str(tmp_path)])
    assert result.returncode == 0, result.stderr
    assert [topology(r) for r in records(tmp_path, 2)] == [(0, 2, 0, 1, 0, 2),
                                                           (1, 2, 0, 1, 1, 2)]


# ---------------------------------------------------------------- --check-build

def test_check_build_reports_the_real_core():
    # The extension this checkout built, not a stand-in: what it reports must match what it is.
    from horovodlike import _core
    import horovodlike.common  # noqa: F401 (hands the core the wheels' folders first)
    info = _core.build_info()
    gpu = dict(_core.gpu_info()) if hasattr(_core, "gpu_info") else None
    nccl = info["nccl"] or bool(gpu and gpu["nccl"]["found"])
    result = launch(["--check-build"])
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"horovodlike v{info['version']}:"
    assert lines[2] == "Available Frameworks:"
    mark = lambda on: "X" if on else " "
    controllers = lines[lines.index("Available Controllers:") + 1:][:3]
    assert controllers == [f"    [X] TCP", f"    [{mark(info['mpi'])}] MPI",
                           f"    [{mark(info['gloo'])}] Gloo"]
    operations = lines[lines.index("Available Tensor Operations:") + 1:][:5]
    # Shared memory is always built in, and the report must say so.
    assert operations == ["    [X] TCP", "    [X] SHM", f"    [{mark(info['mpi'])}] MPI",
                          f"    [{mark(info['gloo'])}] Gloo", f"    [{mark(nccl)}] NCCL"]
    if gpu is not None:  # a core with GPU support says what it found, or why not
        libraries = lines[lines.index("GPU Libraries (loaded at run time):") + 1:][:2]
        assert libraries[0].startswith(f"    [{mark(gpu['cuda']['found'])}] CUDA runtime")
        assert libraries[1].startswith(f"    [{mark(gpu['nccl']['found'])}] NCCL")
    providers = lines[lines.index("Collective Providers (tried in order):") + 1:]
    assert providers[0].startswith("    allreduce: shm_allreduce"), providers
    assert providers[0].endswith("ring_allreduce"), providers
    assert ("mpi_allreduce" in providers[0]) == info["mpi"], providers



def test_check_build_without_core_fails_clearly():
    no_core = ("import sys; sys.modules['horovodlike._core'] = None; "
               "from horovodlike.runner.launch import main; sys.exit(main(['--check-build']))")
    result = subprocess.run([sys.executable, "-c", no_core], env=launcher_env(),
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 1
    assert "cannot load the horovodlike core (horovodlike._core)" in result.stderr


def test_check_build_report_format():
    report = format_report({"version": "9.9", "tcp": True, "cuda": True},
                           {"PyTorch": True, "TensorFlow": False, "Keras": False})
    assert report.startswith("horovodlike v9.9:\n\nAvailable Frameworks:\n    [X] PyTorch\n"
                             "    [ ] TensorFlow\n    [ ] Keras\n")
    assert report.endswith("Other Features:\n    [X] cuda\n")


def test_check_build_report_gpu_libraries():
    gpu_info = {"cuda": {"found": True, "path": "/w/nvidia/cuda_runtime/lib/libcudart.so.12",
                         "version": 12080, "devices": 2, "error": ""},
                "nccl": {"found": False, "path": "", "version": 0,
                         "error": "libnccl.so.2: cannot open shared object file"},
                "search": [["/w/nvidia/cuda_runtime/lib"], []]}
    report = format_report({"version": "9.9", "tcp": True, "nccl": False}, {}, gpu_info)
    assert "    [ ] NCCL\n\nGPU Libraries (loaded at run time):\n" \
           "    [X] CUDA runtime 12.8: /w/nvidia/cuda_runtime/lib/libcudart.so.12 (2 devices)\n" \
           "    [ ] NCCL: libnccl.so.2: cannot open shared object file\n" \
           "    searched for the CUDA runtime: /w/nvidia/cuda_runtime/lib\n" in report
    gpu_info["nccl"] = {"found": True, "path": "/w/libnccl.so.2", "version": 22305, "error": ""}
    report = format_report({"version": "9.9", "tcp": True, "nccl": False}, {}, gpu_info)
    gpu_info["search"] = ["/w/a", "/w/b"]  # the contract's flat list
    report = format_report({"version": "9.9", "tcp": True, "nccl": False}, {}, gpu_info)
    assert "    [X] NCCL\n" in report and "    [X] NCCL 2.23.5: /w/libnccl.so.2\n" in report
    assert report.endswith("    searched: /w/a, /w/b\n")


# ---------------------------------------------------------------- the rendezvous server

class Client:
    """A raw protocol client: send lines, read replies, see the server close. Reads the server's
    greeting (HELLO <nonce>) first."""

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.reader = self.sock.makefile("rb")
        self.hello = self.reply()
        assert re.fullmatch(r"HELLO [0-9a-f]{64}\n", self.hello), self.hello

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def ask(self, line: str) -> str:
        self.send(line.encode() + b"\n")
        return self.reply()

    def reply(self) -> str:
        return self.reader.readline().decode()

    def closed_by_server(self) -> bool:
        try:
            return self.reader.read() == b""
        except ConnectionResetError:
            return True

    def close(self):
        self.reader.close()
        self.sock.close()


@pytest.fixture
def server():
    rendezvous = RendezvousServer(SECRET, auth_timeout=1.0)
    rendezvous.start()
    yield rendezvous
    rendezvous.stop()


def authed(server) -> Client:
    client = Client(server.port)
    line, expected = answer_hello(SECRET, client.hello.rstrip("\n"))
    assert client.ask(line) == expected + "\n"
    return client


def until_a_get_waits():
    """Until a server thread of this process holds a GET: the request was read and waits."""
    waiting = RendezvousServer._wait_for.__code__
    deadline = time.monotonic() + 60

    def holds_get(frame):
        while frame is not None and frame.f_code is not waiting:
            frame = frame.f_back
        return frame is not None

    while not any(holds_get(frame) for frame in sys._current_frames().values()):
        assert time.monotonic() < deadline, "the server never took the GET"
        time.sleep(0.01)


def test_rendezvous_auth(server):
    client = authed(server)
    assert client.ask("PUT k v") == "OK\n"
    # The secret in clear (the old protocol), a proof made with another secret, a proof for
    # another connection's nonce, and lines that are no AUTH at all.
    other_hello = Client(server.port).hello.rstrip("\n")
    for first_line in (lambda hello: f"AUTH {SECRET}",
                       lambda hello: answer_hello("cd" * 32, hello)[0],
                       lambda hello: answer_hello(SECRET, other_hello)[0],
                       lambda hello: "PUT k v", lambda hello: f"AUTH  {SECRET}",
                       lambda hello: "AUTH", lambda hello: f"AUTH {'00' * 32} {'00' * 32}"):
        intruder = Client(server.port)
        assert intruder.ask(first_line(intruder.hello.rstrip("\n"))) == "ERROR bad secret\n"
        assert intruder.closed_by_server()
    assert server.keys() == {"k"}  # the refused "PUT k v" stored nothing new

    # The auth timeout (1 s here) bounds the whole first line, not each read of it: a client
    # that keeps sending a piece every 0.2 s is still dropped (the bound only stops a server
    # that never drops it), and not before the timeout.
    started = time.monotonic()
    dripping = Client(server.port)
    while not select.select([dripping.sock], [], [], 0.2)[0]:
        assert time.monotonic() - started < 60, "a client dripping its first line was kept"
        try:
            dripping.send(b"A")
        except OSError:  # the server closed it meanwhile
            break
    assert dripping.closed_by_server()
    assert time.monotonic() - started >= 1.0


def test_rendezvous_put_get_and_overwrite(server):
    client = authed(server)
    assert client.ask("PUT addr/0/1 10.0.0.1:5000") == "OK\n"
    assert client.ask("GET addr/0/1 0") == "VALUE 10.0.0.1:5000\n"
    assert client.ask("PUT addr/0/1 10.0.0.2:6000") == "OK\n"
    assert authed(server).ask("GET addr/0/1 100") == "VALUE 10.0.0.2:6000\n"
    server.put("from/launcher", "x")
    assert client.ask("GET from/launcher 0") == "VALUE x\n"
    assert server.keys() == {"addr/0/1", "from/launcher"}
    assert server.get("addr/0/1") == "10.0.0.2:6000"


def test_rendezvous_get_blocks_until_put_then_times_out(server):
    waiter, putter = authed(server), authed(server)
    replies = []
    thread = threading.Thread(target=lambda: replies.append(waiter.ask("GET late 60000")))
    thread.start()
    until_a_get_waits()
    assert replies == []  # still blocked
    assert putter.ask("PUT late here") == "OK\n"
    thread.join(timeout=5)
    assert replies == ["VALUE here\n"]

    started = time.monotonic()
    assert waiter.ask("GET never 300") == "TIMEOUT\n"
    # Not before its 300 ms; the upper bound, far above it, only says it was not forever.
    assert 0.28 <= time.monotonic() - started < 30
    assert waiter.ask("GET late 0") == "VALUE here\n"  # the connection is still usable


def test_rendezvous_rejects_garbage_and_keeps_serving_others(server):
    bystander = authed(server)
    blocked = authed(server)
    replies = []
    thread = threading.Thread(target=lambda: replies.append(blocked.ask("GET wanted 60000")))
    thread.start()

    silent = Client(server.port)  # never authenticates: dropped after auth_timeout
    for garbage in (b"HELLO there\n", b"PUT onlykey\n", b"GET k notanumber\n",
                    b"PUT k v extra\n", b"\xff\xfe\x00\x01 binary\n", b"\n", b"PUT a\tb c\n"):
        client = authed(server)
        client.send(garbage)
        assert client.reply() == "ERROR unknown request\n", garbage
        assert client.closed_by_server()

    too_long = authed(server)
    too_long.send(b"PUT k " + b"x" * 10_000)  # no newline, ever
    assert too_long.reply() == "ERROR line too long\n"
    assert too_long.closed_by_server()
    unauthed_long = Client(server.port)
    unauthed_long.send(b"A" * 5000 + b"\n")
    assert unauthed_long.reply() == "ERROR line too long\n"

    # The limit counts the newline: 4096 bytes in all is fine, 4097 is not.
    edge = authed(server)
    value = "v" * (MAX_LINE_BYTES - len("PUT edge \n"))
    assert edge.ask(f"PUT edge {value}") == "OK\n"
    assert edge.ask(f"PUT edge {value}w") == "ERROR line too long\n"

    assert bystander.ask("PUT wanted yes") == "OK\n"
    thread.join(timeout=5)
    assert replies == ["VALUE yes\n"]
    assert bystander.ask("GET edge 0") == f"VALUE {value}\n"
    assert silent.closed_by_server()  # auth timeout (1 s in this fixture)


def test_rendezvous_stop_releases_clients():
    rendezvous = RendezvousServer(SECRET)
    port = rendezvous.start()
    waiter = authed(rendezvous)
    replies = []
    thread = threading.Thread(target=lambda: replies.append(waiter.ask("GET never 60000")))
    thread.start()
    until_a_get_waits()
    rendezvous.stop()
    thread.join(timeout=5)
    assert not thread.is_alive()
    assert replies in (["TIMEOUT\n"], [""])
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1)
