"""Pipelines: every schedule against a single-process replay of the same steps, pipeline x data
parallel against single-process training on the global batch, a stage that raises, a rank killed
mid-pipeline, and the schedules as data (every action once, in an order that cannot deadlock)."""

import pytest

from conftest import (JOB_ENDED_WITHIN_S, NOTICED_WITHIN_S, assert_all_ranks, launch,
                      seconds_since_kill)
from horovodlike.torch.pipelining.schedules import (BACKWARD, FORWARD, Schedule1F1B,
                                                     ScheduleGPipe, ScheduleInterleaved1F1B)


# Several schedules per job: each job pays torch's start-up once.
@pytest.mark.parametrize("np_, specs", [
    (2, ["gpipe:1", "1f1b:1", "interleaved:2", "interleaved:3"]), (3, ["1f1b:1", "gpipe:1"]),
    (4, ["1f1b:1", "gpipe:1", "interleaved:2"])])
def test_pipeline_equals_single_process(np_, specs):
    result = launch(np_, "pipeline_worker.py", "train", *specs)
    assert_all_ranks(result, np_, "pipelines OK")


def test_pipeline_times_data_parallel_equals_global_batch():
    # A plain DistributedOptimizer and one with backward_passes_per_step=n_microbatches.
    result = launch(4, "pipeline_worker.py", "ppdp", "gpipe", "1f1b", "interleaved:2")
    assert_all_ranks(result, 4, "pp x dp OK")


def test_stage_that_raises_fails_every_rank():
    result = launch(3, "pipeline_worker.py", "raise")
    assert_all_ranks(result, 3, "raised OK")


def test_rank_killed_mid_pipeline(tmp_path):
    result = launch(3, "pipeline_worker.py", "kill", tmp_path)
    assert result.returncode == 128 + 9, result.stdout + result.stderr
    for rank in (0, 2):
        report = (tmp_path / f"rank{rank}.txt").read_text()
        assert report.startswith("HorovodInternalError after"), report
        assert "rank 1" in report, report
        assert float(report.split()[2]) < NOTICED_WITHIN_S, report
    assert seconds_since_kill(tmp_path) < JOB_ENDED_WITHIN_S


def _schedule(cls, ranks, num_stages, n):
    """A schedule's action lists without a job (they depend on the layout only)."""
    schedule = object.__new__(cls)
    schedule.ranks, schedule.num_stages, schedule.n_microbatches = list(range(ranks)), \
        num_stages, n
    return [schedule.actions_for(position) for position in range(ranks)]


def _simulate(per_rank, ranks, num_stages, n):
    """Runs the action lists with sends that never block and receives that wait for their
    message; returns each stage's peak of micro-batches held. Fails on a deadlock."""
    done, cursor = set(), [0] * ranks
    held, peak = {}, [0] * num_stages
    while any(cursor[r] < len(per_rank[r]) for r in range(ranks)):
        progressed = False
        for r in range(ranks):
            while cursor[r] < len(per_rank[r]):
                kind, stage, m = per_rank[r][cursor[r]]
                assert stage % ranks == r
                needs = (FORWARD, stage - 1, m) if kind == FORWARD and stage > 0 else \
                    (BACKWARD, stage + 1, m) if kind == BACKWARD and stage < num_stages - 1 \
                    else (FORWARD, stage, m) if kind == BACKWARD else None
                if needs is not None and needs not in done:
                    break
                if kind == BACKWARD:
                    assert (FORWARD, stage, m) in done
                    held[stage] -= 1
                else:
                    held[stage] = held.get(stage, 0) + 1
                    peak[stage] = max(peak[stage], held[stage])
                done.add((kind, stage, m))
                cursor[r] += 1
                progressed = True
        assert progressed, f"deadlock at {cursor}"
    assert done == {(k, s, m) for k in (FORWARD, BACKWARD) for s in range(num_stages)
                    for m in range(n)}
    return peak


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
@pytest.mark.parametrize("n", [1, 4, 8])
def test_one_stage_per_rank_schedules(ranks, n):
    gpipe = _simulate(_schedule(ScheduleGPipe, ranks, ranks, n), ranks, ranks, n)
    assert gpipe == [n] * ranks
    peaks = _simulate(_schedule(Schedule1F1B, ranks, ranks, n), ranks, ranks, n)
    # 1F1B holds at most num_stages - stage micro-batches, whatever n is.
    assert peaks == [min(ranks - s, n) for s in range(ranks)]


@pytest.mark.parametrize("ranks, per_rank, n", [(1, 3, 2), (2, 2, 2), (2, 2, 6), (2, 3, 4),
                                                 (3, 2, 3), (4, 2, 8), (4, 3, 4)])
def test_interleaved_schedule(ranks, per_rank, n):
    stages = ranks * per_rank
    _simulate(_schedule(ScheduleInterleaved1F1B, ranks, stages, n), ranks, stages, n)
