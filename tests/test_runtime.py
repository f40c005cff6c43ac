"""The runtime's life cycle and memory, with real processes: init under threads, shutdown
racing a caller, the fusion buffer shrinking; who runs the negotiation rounds."""

import json

import pytest

from conftest import assert_all_ranks, launch


def test_runtime_lifecycle_under_threads_and_fusion_buffer_shrinks(tmp_path):
    result = launch(2, "runtime_worker.py", env={"RUNTIME_WORKER_DIR": str(tmp_path)},
                    timeout=120)
    assert_all_ranks(result, 2, "runtime OK")


# (launcher flags, environment, whether waiting callers run rounds): shared memory, TCP alone,
# MPI; Gloo's waits cannot be interrupted, so its rounds stay with the background loop.
CALLER_ROUNDS_JOBS = {
    "shm": ([], {}, True),
    "shm-loop-only": ([], {"HOROVOD_CALLER_ROUNDS": "0"}, False),
    "tcp": ([], {"HOROVOD_SHM_DISABLE": "1"}, True),
    "mpi": (["--mpi"], {}, True),
    "gloo": (["--gloo"], {}, False),
}


@pytest.mark.parametrize("job", list(CALLER_ROUNDS_JOBS))
def test_waiting_callers_run_the_rounds(job):
    flags, env, callers = CALLER_ROUNDS_JOBS[job]
    result = launch(2, "caller_rounds_worker.py", "results", env=env, launcher_args=flags,
                    timeout=120)
    assert_all_ranks(result, 2, "ROUNDS")
    for line in result.stdout.splitlines():
        if "ROUNDS " in line:
            rounds = json.loads(line.split("ROUNDS ", 1)[1])
            # Results were checked against NumPy in the worker either way.
            if callers:
                # Most of the 200 synchronous calls' rounds; a loaded machine hands some of
                # them to the loop (a peer that is late).
                assert rounds["caller_rounds"] >= 20, (job, rounds)
            else:
                assert rounds["caller_rounds"] == 0 and rounds["loop_rounds"] >= 200, (job, rounds)


@pytest.mark.parametrize("flags", [[], ["--gloo"]], ids=["shm", "gloo"])
def test_overlap_off_holds_asynchronous_work_for_a_waiting_caller(flags):
    # HOROVOD_OVERLAP=0: over shared memory the waiting caller runs the rounds; over Gloo
    # (whose waits cannot be interrupted) the loop runs them back to back while it waits.
    result = launch(2, "caller_rounds_worker.py", "deferred", launcher_args=flags,
                    env={"HOROVOD_OVERLAP": "0", "HOROVOD_CYCLE_TIME": "2000"}, timeout=120)
    assert_all_ranks(result, 2, "DEFERRED OK")


def test_a_signal_ends_a_round_the_caller_runs():
    # Rank 1 is stopped (SIGSTOP) while rank 0's calling thread waits for it inside a round;
    # the peer timeout is far away, and rank 0's SIGALRM handler must still end the wait. The
    # long cycle time keeps rank 0's background loop out of rounds (it would hold the round,
    # and the caller would wait on its handle instead, which was always interruptible).
    result = launch(2, "caller_rounds_worker.py", "interrupt",
                    env={"HOROVOD_PEER_TIMEOUT_SECONDS": "600", "HOROVOD_CYCLE_TIME": "600000"},
                    timeout=120)
    assert_all_ranks(result, 2, "INTERRUPT OK")


def test_a_process_set_does_not_wait_for_the_cycle_of_idle_ranks_outside_it():
    # Ranks 0 and 1 run 50 allreduces in their own set while rank 2 waits for a message; with
    # a cycle time of 3 s, which each of them would otherwise wait for, they finish within the
    # job's timeout only because their rounds ring rank 2's round bell. Over shared memory,
    # where the bell is.
    result = launch(3, "round_bell_worker.py", transport="tcp", timeout=60,
                    env={"HOROVOD_CYCLE_TIME": "3000", "HOROVOD_DYNAMIC_PROCESS_SETS": "1"})
    assert_all_ranks(result, 3, "BELLS")
    bells = {int(line.split("]")[0][1:]): int(line.rsplit(" ", 1)[1])
             for line in result.stdout.splitlines() if "BELLS " in line}
    assert bells[0] + bells[1] > 0, bells


def test_an_idle_job_rings_no_round_bells_and_slows_its_rounds():
    """Rounds with no work anywhere keep the ranks in step without waking each other (each
    rank's own cycle brings it); the build before this rang tens to thousands of bells a
    second in an idle job, each waking a peer for one more empty round. And an idle loop slows
    down: after two empty rounds its cycle doubles with each, up to 50 ms (it ran a round each
    1 ms cycle, about 900 a second, taking 5% of a core on each rank). Then a collective still
    completes, with the right sum (how fast is benchmarks/idle_cpu.py's and the worker's
    printout's, not an assertion here)."""
    result = launch(3, "idle_rounds_worker.py", timeout=60)
    assert_all_ranks(result, 3, "IDLE")
    for line in result.stdout.splitlines():
        if "IDLE " in line:
            words = line.split()
            rounds, bells = int(words[4]), int(words[6])
            # About 25 in the second: a few at full pace, then doubling, then every 50 ms.
            assert 5 <= rounds <= 60 and bells == 0, line
            assert float(words[10]) == 50, line  # the cycle, slowed all the way


def test_a_rank_outside_every_process_set_keeps_its_loops_pace():
    """The idle slowing above is for jobs without process sets: here ranks 0 and 1 allreduce in
    a set while rank 2 has nothing to do, and every one of the set's rounds needs rank 2 in a
    round of the global set, so rank 2's loop keeps its 1 ms cycle (slowed, a round bell that
    raced with its own idle round left the set's call waiting up to 50 ms for the next)."""
    result = launch(3, "idle_outsider_worker.py", timeout=60)
    assert_all_ranks(result, 3, "")
    outsider = [line for line in result.stdout.splitlines() if "OUTSIDER" in line]
    assert len(outsider) == 1, result.stdout[-3000:]
    assert float(outsider[0].split()[-1]) == 1, outsider[0]
    assert sum("PAIR" in line for line in result.stdout.splitlines()) == 2, result.stdout[-3000:]


@pytest.mark.parametrize("variable,value,advice", [
    ("HOROVOD_ROUND_BELL", "sometimes", "use auto (the default), off, host or all"),
    ("HOROVOD_SHM_STREAM_STORES", "maybe", "use auto (the default), on or off"),
])
def test_a_wrong_setting_of_the_core_is_named(variable, value, advice):
    result = launch(2, "init_only_worker.py", env={variable: value}, timeout=60)
    assert result.returncode != 0
    assert f"{variable}='{value}': {advice}" in result.stdout + result.stderr
