"""The hot path allocates nothing: once every tensor has been negotiated, a training step costs
the background thread no heap allocation, whether its collectives are fused or not, over shared
memory, TCP or both (hierarchical). Counted per thread by tests/native/malloc_counter.c, preloaded into the job."""

import json
import shutil
import subprocess

import pytest

from conftest import REPO, launch

STEPS = 30


@pytest.fixture(scope="module")
def counter_library(tmp_path_factory):
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.fail("needs a C compiler (cc) to build tests/native/malloc_counter.c")
    library = tmp_path_factory.mktemp("malloc_counter") / "libmalloc_counter.so"
    subprocess.run([compiler, "-O2", "-shared", "-fPIC",
                    str(REPO / "tests" / "native" / "malloc_counter.c"), "-o", str(library)],
                   check=True, capture_output=True, text=True)
    return library


@pytest.mark.parametrize("np_, extra, hosts", [
    (2, {}, None),
    (3, {"HOROVOD_SHM_DISABLE": "1"}, None),
    # Two hosts of two ranks: inside each over shared memory, across them over TCP.
    (4, {"HOROVOD_HIERARCHICAL_ALLREDUCE": "1"}, "localhost:2,127.0.0.1:2"),
], ids=["shm-2", "tcp-3", "hierarchical-2x2"])
def test_steps_after_the_first_allocate_nothing(counter_library, np_, extra, hosts):
    env = {"LD_PRELOAD": str(counter_library),
           # The stall inspection (once a second by default) builds its report on the heap.
           "HOROVOD_STALL_CHECK_DISABLE": "1",
           # Every round on the background thread, the one counted: a waiting caller runs the
           # same rounds (Runtime::RunRoundLocked), but on a thread that Python allocates on.
           "HOROVOD_CALLER_ROUNDS": "0", **extra}
    # The built-in transports: Gloo and MPI allocate inside their own libraries.
    result = launch(np_, "allocation_worker.py", counter_library, STEPS, env=env,
                    launcher_args=["-H", hosts] if hosts else [], transport="tcp")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    reports = [json.loads(line.split("ALLOCATIONS ", 1)[1])
               for line in result.stdout.splitlines() if "ALLOCATIONS " in line]
    assert sorted(r["rank"] for r in reports) == list(range(np_)), output[-6000:]
    for report in reports:
        for kind in ("fused", "training"):
            r = report[kind]
            # The counter sees this process: the Python main thread allocates all the time,
            # and the loop thread does while it negotiates new tensors.
            assert r["main"] > STEPS, (report["rank"], kind, r)
            assert r["warmup"] > 60, (report["rank"], kind, r)
            # Afterwards nothing, however the rounds happen to group the tensors: the per-round
            # storage and the fusion buffer are sized when tensors are negotiated. The small
            # allowance is a margin, not an expectation.
            steps = r["steps"]
            assert len(steps) == STEPS
            assert sum(steps) <= 6 and sum(1 for c in steps if c) <= 3, \
                (f"rank {report['rank']}, {kind}: the background thread allocated "
                 f"{sum(steps)} times in {STEPS} steps: {steps}")
