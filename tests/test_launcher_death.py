"""A launcher killed outright (kill -9: what an OOM killer or a dropped ssh session does) leaves
nothing behind: its ranks and their children end within 10 s. Local ranks are stopped by the
launcher's guard process whatever they run; a rank on another host (over a stand-in ssh whose
remote command runs in a session of its own, as under sshd) stops itself when its connection to
the launcher's rendezvous server ends."""

import json
import os
import shlex
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from conftest import job_env

REPO = Path(__file__).resolve().parents[1]
HELPERS = REPO / "tests" / "helpers"
RANK = [sys.executable, str(HELPERS / "rank.py")]
# The ranks sleep 120 s: gone within this bound, they were ended, not left to finish (the
# margin is for a busy machine, where ending processes takes a while).
GONE_WITHIN_S = 60.0


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def tagged(pid: int, tag: str) -> bool:
    try:
        return f"HOROVODLIKE_TEST_TAG={tag}".encode() in \
            Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


def job_processes(tag: str) -> list[int]:
    """Every live process that inherited the job's tag: ranks, their children, the guard."""
    return [int(e) for e in os.listdir("/proc")
            if e.isdigit() and int(e) != os.getpid() and tagged(int(e), tag) and alive(int(e))]


@pytest.fixture
def job(tmp_path):
    """Starts `horovodlikerun ARGS` (in the background) with a tagged environment; afterwards,
    whatever carries the tag is killed, so that a failing test leaves nothing either."""
    tag = uuid.uuid4().hex
    started = []

    def start(args, extra_env=None):
        env = job_env({"HOROVODLIKE_TEST_TAG": tag, **(extra_env or {})})
        with open(tmp_path / "launcher.out", "wb") as out, \
                open(tmp_path / "launcher.err", "wb") as err:
            launcher = subprocess.Popen(
                [sys.executable, "-m", "horovodlike.runner.launch", *args], env=env,
                stdout=out, stderr=err, cwd=REPO)
        started.append(launcher)
        return launcher, tag

    yield start
    for launcher in started:
        if launcher.poll() is None:
            launcher.kill()
        launcher.wait()
    for pid in job_processes(tag):
        os.kill(pid, signal.SIGKILL)


def wait_for_ranks(tmp_path, launcher, size, timeout=120.0) -> list[dict]:
    deadline = time.monotonic() + timeout
    while not all((tmp_path / f"rank.{r}.json").exists() for r in range(size)):
        assert launcher.poll() is None, (tmp_path / "launcher.err").read_text()[-3000:]
        assert time.monotonic() < deadline, (tmp_path / "launcher.err").read_text()[-3000:]
        time.sleep(0.05)
    return [json.loads((tmp_path / f"rank.{r}.json").read_text()) for r in range(size)]


def kill_launcher_and_wait(launcher, pids, tag) -> float:
    """SIGKILLs the launcher; returns how long its ranks, their children and every other
    process of the job took to go (at most GONE_WITHIN_S: then the test fails)."""
    assert all(alive(pid) for pid in pids)
    launcher.send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    launcher.wait()
    while time.monotonic() - killed_at < GONE_WITHIN_S:
        if not any(alive(pid) for pid in pids) and not job_processes(tag):
            return time.monotonic() - killed_at
        time.sleep(0.05)
    left = [pid for pid in pids if alive(pid)]
    raise AssertionError(f"{GONE_WITHIN_S:g} s after kill -9 of the launcher, still there: "
                         f"{left} of the ranks and children {pids}, and job processes "
                         f"{job_processes(tag)}")


def test_killed_launcher_leaves_no_rank_and_no_child(tmp_path, job):
    """Plain processes as ranks (no horovodlike in them), each with a child of its own."""
    launcher, tag = job(["-np", "2", *RANK, "--record", str(tmp_path), "--child",
                         "--sleep", "120"])
    ranks = wait_for_ranks(tmp_path, launcher, 2)
    pids = [r["pid"] for r in ranks] + [r["child_pid"] for r in ranks]
    kill_launcher_and_wait(launcher, pids, tag)
    assert "the launcher (pid " in (tmp_path / "launcher.err").read_text()


def test_remote_rank_ends_when_its_launcher_is_killed(tmp_path, job):
    """Rank 1 runs on "host b" through a stand-in ssh that, like sshd, gives the remote command a
    session of its own: neither the launcher nor its guard can signal it. Both ranks called
    init(), and started a child."""
    bin_dir, ssh_log = tmp_path / "fakebin", tmp_path / "ssh-log"
    bin_dir.mkdir()
    ssh_log.mkdir()
    ssh = bin_dir / "ssh"
    ssh.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} "
                   f"{shlex.quote(str(HELPERS / 'fake_ssh.py'))} \"$@\"\n")
    ssh.chmod(0o755)
    launcher, tag = job(["-np", "2", "-H", "localhost:1,b:1", "--start-timeout", "100", *RANK,
                         "--init", "--record", str(tmp_path), "--child", "--sleep", "120"],
                        {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
                         "FAKE_SSH_LOG": str(ssh_log), "FAKE_SSH_DETACH": "1"})
    ranks = wait_for_ranks(tmp_path, launcher, 2)
    remote = ranks[1]
    ssh_clients = [int(p.stem) for p in ssh_log.iterdir()]
    assert len(ssh_clients) == 1 and remote["pgid"] != ssh_clients[0], \
        "the remote rank must not be in a process group the launcher started"
    pids = [r["pid"] for r in ranks] + [r["child_pid"] for r in ranks]
    kill_launcher_and_wait(launcher, pids, tag)
