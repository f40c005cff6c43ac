"""Failures through the launcher, with real processes: a rank killed (SIGKILL) during rendezvous,
during negotiation or in the middle of a large ring transfer, a rank that stops (SIGSTOP), a rank
that exits with an error code; stalled tensors (warning and shutdown); hosts that cannot be
reached or never join. In each case the other ranks raise HorovodInternalError within a bound,
the launcher names the rank that failed first in cause and how, and no process is left."""

import json
import os
import re
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from conftest import JOB_ENDED_WITHIN_S, NOTICED_WITHIN_S, WORKERS, job_env

REPO = Path(__file__).resolve().parents[1]
HELPERS = REPO / "tests" / "helpers"


def tagged_env(extra=None):
    """The job's environment, with a tag every process of the job inherits (see leftovers)."""
    env = job_env(extra)
    env["HOROVODLIKE_TEST_TAG"] = uuid.uuid4().hex
    return env


def leftovers(tag, timeout=30.0):
    """Processes whose environment carries `tag` (a scan of /proc), after waiting up to
    `timeout` for them to go."""
    needle = f"HOROVODLIKE_TEST_TAG={tag}".encode()
    deadline = time.monotonic() + timeout
    while True:
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                if needle in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                    state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
                    if state != "Z":
                        found.append(int(entry))
            except OSError:
                continue
        if not found or time.monotonic() >= deadline:
            return found
        time.sleep(0.1)


def run(np, args, env, timeout=60, launcher_args=()):
    command = [sys.executable, "-m", "horovodlike.runner.launch", "-np", str(np),
               *launcher_args, *args]
    started = time.monotonic()
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout,
                            cwd=REPO)
    result.elapsed = time.monotonic() - started
    result.output = result.stdout + result.stderr
    return result


def reports(directory, ranks):
    return {r: json.loads((directory / f"rank{r}.json").read_text()) for r in ranks}


def launcher_lines(result):
    return [line for line in result.stderr.splitlines() if line.startswith("horovodlikerun:")]


# ------------------------------------------------------------------------- SIGKILL, SIGSTOP

@pytest.mark.parametrize("moment", ["rendezvous", "negotiation", "transfer"])
def test_killed_rank_is_named_and_the_others_raise(tmp_path, moment):
    env = tagged_env()
    result = run(3, [sys.executable, str(WORKERS / "fault_worker.py"), f"kill-{moment}",
                     tmp_path], env)
    ended_at = time.time()
    lines = launcher_lines(result)
    assert result.returncode == 128 + 9, result.output[-4000:]
    assert lines[0] == ("horovodlikerun: rank 2 (on localhost) was killed by signal 9 (SIGKILL); "
                        "stopping the job"), result.output[-4000:]
    seen = reports(tmp_path, [0, 1])
    killed_at = json.loads((tmp_path / "victim.json").read_text())["time"]
    for rank, report in seen.items():
        assert report["outcome"] == "HorovodInternalError", report
        if moment == "rendezvous":
            # init() was waiting on rank 2: the launcher's verdict reaches it at once.
            assert "the launcher stopped the job: rank 2 (on localhost) was killed" in \
                report["message"], report
        else:
            assert "rank 2" in report["message"], report
            assert report["later"] == "HorovodInternalError", report
            assert report["at"] - killed_at < NOTICED_WITHIN_S, report  # no timeout
    assert ended_at - killed_at < JOB_ENDED_WITHIN_S
    assert leftovers(env["HOROVODLIKE_TEST_TAG"]) == []


def test_stopped_rank_times_out_but_idle_and_busy_ranks_do_not(tmp_path):
    timeout = 1.5
    env = tagged_env({"HOROVOD_PEER_TIMEOUT_SECONDS": str(timeout)})
    result = run(2, [sys.executable, str(WORKERS / "fault_worker.py"), "sigstop", tmp_path], env)
    lines = launcher_lines(result)
    assert result.returncode == 1, result.output[-4000:]
    # Rank 0 gave up on it, and rank 1 (stopped, never exiting) is the one named.
    assert lines[0].startswith("horovodlikerun: rank 1 (on localhost) stopped responding"), lines
    report = reports(tmp_path, [0])[0]
    assert report["outcome"] == "HorovodInternalError", report
    assert "rank 1" in report["message"] and "HOROVOD_PEER_TIMEOUT_SECONDS" in report["message"]
    stopped_at = json.loads((tmp_path / "victim.json").read_text())["time"]
    assert timeout * 0.8 < report["at"] - stopped_at < timeout + 10, report
    assert report["later"] == "HorovodInternalError"
    assert leftovers(env["HOROVODLIKE_TEST_TAG"]) == []


def test_exit_code_of_the_rank_that_failed_first_in_cause(tmp_path):
    """Rank 1 exits 3; rank 0 fails because of it (and may well exit first)."""
    env = tagged_env()
    result = run(3, [sys.executable, str(WORKERS / "fault_worker.py"), "exit3", tmp_path], env)
    lines = launcher_lines(result)
    assert result.returncode == 3, result.output[-4000:]
    assert lines[0] == "horovodlikerun: rank 1 (on localhost) exited with code 3; stopping the job"
    for rank, report in reports(tmp_path, [0, 2]).items():
        assert "shut down on rank 1" in report["message"], report
    assert leftovers(env["HOROVODLIKE_TEST_TAG"]) == []


def test_ranks_failing_because_of_another_are_let_finish_their_output(tmp_path):
    """Rank 1 exits 3; ranks 0 and 2 fail because of it and take a second to print their last
    words (a test runner's summary): the launcher names rank 1 and lets them finish instead of
    cutting them off with SIGTERM."""
    env = tagged_env()
    result = run(3, [sys.executable, str(WORKERS / "last_words_worker.py"), "1.0"], env)
    assert result.returncode == 3, result.output[-4000:]
    assert launcher_lines(result)[0] == \
        "horovodlikerun: rank 1 (on localhost) exited with code 3; stopping the job"
    for rank in (0, 2):
        assert f"[{rank}]<stdout>:rank {rank}: last words" in result.stdout, result.output[-4000:]
    assert leftovers(env["HOROVODLIKE_TEST_TAG"]) == []


# ------------------------------------------------------------------------- stalls

# Rank 1 is 2.5 s late in the first phase (tests/workers/stall_worker.py): well past the check
# time (1 s), well before the shutdown time on a busy machine too.
STALL_SHUTDOWN_S = 8


def test_stall_warning_then_stall_shutdown(tmp_path):
    env = tagged_env({"HOROVOD_STALL_CHECK_TIME_SECONDS": "1",
                      "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": str(STALL_SHUTDOWN_S)})
    result = run(2, [sys.executable, str(WORKERS / "stall_worker.py"), tmp_path], env)
    # Phase 1: late but not too late; the coordinator warns about both kinds of tensor, the
    # cached one (waited for in the bit vector) and the new one (at the coordinator).
    warnings = [line for line in result.stderr.splitlines() if "Stalled tensors" in line]
    assert warnings, result.output[-4000:]
    assert any("'cached' missing on rank 1" in w and "'fresh' missing on rank 1" in w
               for w in warnings), warnings
    seen = reports(tmp_path, [0, 1])
    assert seen[0]["phase1"] == seen[1]["phase1"] == "ok", seen
    # Phase 2: each rank waits for a tensor the other never submits; both stop.
    for rank, report in seen.items():
        message = report["phase2"]
        assert message.startswith("HorovodInternalError: horovodlike stopped on rank"), report
        assert "stall shutdown" in message and "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS" in message
        assert "'cached' missing on rank 1" in message and "'only1' missing on rank 0" in message
    # Stopped at the shutdown time: not before it from the first submission (a stall's clock
    # starts no earlier), nor long after the last.
    first = min(report["phase2_started"] for report in seen.values())
    last = max(report["phase2_started"] for report in seen.values())
    for rank, report in seen.items():
        assert report["phase2_ended"] - first > STALL_SHUTDOWN_S * 0.95, seen
        assert report["phase2_ended"] - last < STALL_SHUTDOWN_S + 15, seen
    assert result.returncode == 1, result.output[-4000:]
    assert "stall shutdown" in result.stderr
    assert leftovers(env["HOROVODLIKE_TEST_TAG"]) == []


# ------------------------------------------------------------------------- start-up

@pytest.fixture
def ssh_stub(tmp_path):
    """A fake `ssh` first on PATH that fails the way $FAKE_SSH_MODE says: `refused` (ssh's
    message and 255), `no-python` (the remote shell's message and 127), or `hang`."""
    bin_dir = tmp_path / "stub-bin"
    bin_dir.mkdir()
    ssh = bin_dir / "ssh"
    ssh.write_text("""#!/bin/sh
case "$FAKE_SSH_MODE" in
  refused) echo "ssh: connect to host b port 2222: Connection refused" >&2; exit 255;;
  no-python) echo "env: 'python3': No such file or directory" >&2; exit 127;;
  hang) exec sleep 600;;
esac
""")
    ssh.chmod(0o755)
    return f"{bin_dir}{os.pathsep}{os.environ['PATH']}"


RANK = [sys.executable, str(HELPERS / "rank.py")]
# The jobs below have ranks that sleep 120 s: a launcher that stopped them ends well before,
# however busy the machine is with start-ups.
STOPPED_WITHIN_S = 60


@pytest.mark.parametrize("mode, code, expected", [
    ("refused", 255, "rank 1 (on b) exited with code 255; stopping the job (255 is also ssh's "
                     "code for not reaching b"),
    ("no-python", 127, "rank 1 (on b) exited with code 127; stopping the job (127: the command "
                       "was not found or not executable on b)"),
])
def test_unreachable_host_or_missing_python_is_named(ssh_stub, mode, code, expected):
    env = tagged_env({"PATH": ssh_stub, "FAKE_SSH_MODE": mode})
    result = run(2, [*RANK, "--join", "--sleep", "120"], env, timeout=180,
                 launcher_args=["-H", "localhost:1,b:1"])
    assert result.returncode == code, result.output
    assert f"horovodlikerun: {expected}" in result.stderr
    assert "[1]<stderr>:" in result.stderr  # ssh's (or the remote shell's) own words
    assert result.elapsed < STOPPED_WITHIN_S
    assert leftovers(env["HOROVODLIKE_TEST_TAG"]) == []


def test_host_that_never_answers_is_named_at_the_start_timeout(ssh_stub):
    env = tagged_env({"PATH": ssh_stub, "FAKE_SSH_MODE": "hang"})
    result = run(3, [*RANK, "--join", "--sleep", "120"], env, timeout=180,
                 launcher_args=["-H", "localhost:1,b:2", "--start-timeout", "1.5"])
    assert result.returncode == 1, result.output
    assert "horovodlikerun: ranks 1, 2 (on b) did not join within 1.5 s" in result.stderr
    assert result.elapsed < STOPPED_WITHIN_S
    assert leftovers(env["HOROVODLIKE_TEST_TAG"]) == []


@pytest.mark.skipif(not any(Path(d, "ssh").exists() for d in os.environ["PATH"].split(":")),
                    reason="needs an ssh client")
@pytest.mark.parametrize("host", ["no-such-host.invalid", "0.0.0.0"])
def test_real_ssh_failures_are_named_quickly(host):
    """A name that does not resolve, and a port where nothing listens (0.0.0.0 is this machine
    to ssh, but not a name the launcher treats as local)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free_port = probe.getsockname()[1]
    env = tagged_env()
    result = run(2, [*RANK, "--join", "--sleep", "120"], env, timeout=180,
                 launcher_args=["-H", f"localhost:1,{host}:1", "-p", str(free_port)])
    assert result.returncode == 255, result.output
    assert f"horovodlikerun: rank 1 (on {host}) exited with code 255" in result.stderr
    assert re.search(r"\[1\]<stderr>:.*(resolve|refused)", result.stderr), result.stderr
    assert result.elapsed < STOPPED_WITHIN_S
    assert leftovers(env["HOROVODLIKE_TEST_TAG"]) == []


def test_choosing_the_rank_that_failed_first_in_cause():
    from horovodlike.runner.failures import (FailureRecord, parse_record, primary_failure,
                                             trace_cause)
    generation, record = parse_record("failure/0/2", "1:lost:lost%20connection%20to%20rank%201")
    assert (generation, record) == (0, FailureRecord(2, 1, "lost", "lost connection to rank 1"))
    assert parse_record("addr/0/2", "x:1") is None and parse_record("failure/0/x", "1:a:b") is None
    lost = {0: FailureRecord(0, 2, "lost", "r"), 1: FailureRecord(1, 2, "lost", "r")}
    # Ranks 0 and 1 failed because of rank 2, which exited later with its own code.
    assert primary_failure({0: 1, 1: 1, 2: -9}, lost) == 2
    assert primary_failure({0: 1, 1: 1}, lost) is None
    # Rank 2 stopped answering: still running, blamed by the first to fail.
    assert trace_cause(0, {0: 1, 1: 1}, lost, running={2}) == (2, lost[0])
    # Two ranks blaming each other (a timeout race): the silent, running one is named.
    cycle = {0: FailureRecord(0, 1, "timeout", "r"), 1: FailureRecord(1, 0, "lost", "r")}
    assert trace_cause(0, {0: 1, 1: 1}, cycle, running={2}) == (2, cycle[0])
    # The origin ended cleanly (it finished while rank 0 still needed it): rank 0 is named.
    done = {0: FailureRecord(0, 1, "shutdown", "r")}
    assert trace_cause(0, {0: 1, 1: 0}, done, running=set()) == (0, None)


def test_which_ranks_stopped_responding():
    """What the elastic driver reads from one round's reports: the rank the timeouts blame,
    following a rank that timed out on another that was itself waiting on a third."""
    from horovodlike.runner.failures import FailureRecord, stopped_responding
    chain = {0: FailureRecord(0, 2, "timeout", "r"), 1: FailureRecord(1, 0, "timeout", "r")}
    assert stopped_responding(chain) == {2: chain[0]}
    # A blamed rank that reported a failure of its own is running: not blamed.
    lost = {0: FailureRecord(0, 1, "timeout", "r"), 1: FailureRecord(1, 0, "lost", "r")}
    assert stopped_responding(lost) == {}
    # Only timeouts blame: a rank that shut down or was lost is not "stopped responding".
    assert stopped_responding({0: FailureRecord(0, 1, "shutdown", "r"),
                               2: FailureRecord(2, 1, "lost", "r")}) == {}
    assert stopped_responding({0: FailureRecord(0, 0, "timeout", "r")}) == {}
