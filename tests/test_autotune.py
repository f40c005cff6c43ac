"""Autotuning (HOROVOD_AUTOTUNE): the optimiser's decisions on synthetic scores, and real jobs in
which the parameters change under fused allreduces while every rank keeps in step."""

import csv
import json
import math

import pytest

from conftest import assert_all_ranks, launch
from horovodlike._core import _testing

# The space the tuner searches (csrc/core/parameter_manager.h), on a log scale.
FUSION_RANGE = (64 * 1024, 256 * 1024 * 1024)
CYCLE_RANGE = (0.5, 50.0)


def unit(value, low, high):
    return math.log(value / low) / math.log(high / low)


def smooth_score(fusion, cycle, cache, peak=(0.62, 0.2)):
    """A bump in the normalised space, 1e9 bytes/s at `peak`; the cache slightly hurts."""
    x, y = unit(fusion, *FUSION_RANGE), unit(cycle, *CYCLE_RANGE)
    bump = math.exp(-((x - peak[0]) ** 2 + (y - peak[1]) ** 2) / (2 * 0.15 ** 2))
    return 1e9 * bump * (0.95 if cache else 1.0)


def test_optimiser_finds_the_peak_of_a_smooth_score_deterministically():
    samples, chosen = _testing.autotune(smooth_score, max_samples=20, noise=0.8)
    again, chosen_again = _testing.autotune(smooth_score, max_samples=20, noise=0.8)
    assert (samples, chosen) == (again, chosen_again), "the tuner is not deterministic"
    # 20 samples of the optimisation, then one without the response cache.
    assert len(samples) == 21 and [s[2] for s in samples] == [True] * 20 + [False]
    best = max(samples, key=lambda s: s[3])
    assert chosen == (best[0], best[1], best[2], False), "the chosen point is not the best"
    x, y = unit(best[0], *FUSION_RANGE), unit(best[1], *CYCLE_RANGE)
    assert abs(x - 0.62) < 0.08 and abs(y - 0.2) < 0.08, f"best point {x:.3f}, {y:.3f}"
    assert best[3] > 0.9e9
    # The first point is the configured one (HOROVOD_FUSION_THRESHOLD/CYCLE_TIME defaults).
    assert samples[0][:3] == (128 * 1024 * 1024, 1.0, True)


def test_optimiser_holds_explicit_settings_constant():
    samples, chosen = _testing.autotune(
        lambda f, c, cache: smooth_score(f, c, cache, peak=(0.3, 0.9)), max_samples=12,
        noise=0.1, tune_cache=False, fixed_cycle=2.5)
    assert len(samples) == 12 and all(s[1] == 2.5 and s[2] for s in samples)
    best = max(samples, key=lambda s: s[3])
    assert chosen == (best[0], 2.5, True, False)
    assert abs(unit(best[0], *FUSION_RANGE) - 0.3) < 0.05


def read_log(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["sample", "cache_enabled", "cycle_time_ms", "tensor_fusion_threshold",
                       "score"], rows[0]
    return [(label, (int(fusion), float(cycle), cache == "1"), float(score))
            for label, cache, cycle, fusion, score in rows[1:]]


def dedupe(sequence):
    return [x for i, x in enumerate(sequence) if i == 0 or x != sequence[i - 1]]


@pytest.mark.parametrize("np_", [2, 3])
def test_autotuned_job_keeps_every_rank_in_step(np_, tmp_path):
    log = tmp_path / "autotune.csv"
    steps, max_samples = 40, 6
    if np_ == 2:  # through the launcher's flags
        env, launcher_args = {}, ["--autotune", "--autotune-log-file", str(log),
                                  "--autotune-warmup-samples", "1",
                                  "--autotune-steps-per-sample", "3",
                                  "--autotune-bayes-opt-max-samples", str(max_samples)]
    else:  # through the environment
        env, launcher_args = {"HOROVOD_AUTOTUNE": "1", "HOROVOD_AUTOTUNE_LOG": str(log),
                              "HOROVOD_AUTOTUNE_WARMUP_SAMPLES": "1",
                              "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": "3",
                              "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": str(max_samples)}, []
    result = launch(np_, "autotune_worker.py", steps, env=env, launcher_args=launcher_args)
    assert_all_ranks(result, np_, f"{steps} autotuned steps OK")  # every result matched NumPy

    records = {}
    for line in result.stdout.splitlines():
        for rank in range(np_):
            prefix = f"[{rank}]<stdout>:rank {rank}: records "
            if line.startswith(prefix):
                records[rank] = [tuple(r) for r in json.loads(line[len(prefix):])]
    assert sorted(records) == list(range(np_)) and all(len(r) == steps for r in records.values())
    # (round it took effect, fusion threshold, cycle time, cache, done): the same changes in
    # the same rounds on every rank.
    changes = dedupe(records[0])
    for rank in range(1, np_):
        assert dedupe(records[rank]) == changes, f"rank {rank} applied other parameters"

    rows = read_log(log)
    labels = [label for label, _, _ in rows]
    assert labels == [str(i) for i in range(1, max_samples + 2)] + ["best"], labels
    samples = rows[:-1]
    best = max(samples, key=lambda row: row[2])
    assert rows[-1][1:] == best[1:], "the final row is not the best-scoring sample"
    assert samples[-1][1][2] is False, "the last sample tries the response cache off"

    # What ran is what was logged, in order, then the best, fixed.
    tuning = dedupe([(f, c, cache) for _, f, c, cache, done in records[0] if not done])
    assert tuning == dedupe([params for _, params, _ in samples])
    assert len({params[:2] for params in tuning}) >= 3, "the parameters hardly changed"
    for rank in range(np_):
        _, fusion, cycle, cache, done = records[rank][-1]
        assert done and (fusion, cycle, cache) == best[1], f"rank {rank} did not keep the best"


@pytest.mark.parametrize("name,value", [
    ("HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", "0"),
    ("HOROVOD_AUTOTUNE_WARMUP_SAMPLES", "three"),
    ("HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", "2.5"),
    ("HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", "-1"),
    ("HOROVOD_AUTOTUNE_LOG", "/nonexistent-dir/autotune.csv"),
])
def test_bad_autotune_settings_fail_init_naming_the_variable(name, value):
    result = launch(1, "init_only_worker.py", env={"HOROVOD_AUTOTUNE": "1", name: value},
                    timeout=240)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    # The error (ValueError, as for every bad HOROVOD_* value) names the variable.
    assert any("Error" in line and name in line for line in output.splitlines()), output[-3000:]


def test_launcher_rejects_bad_autotune_flags():
    result = launch(1, "init_only_worker.py",
                    launcher_args=["--autotune", "--autotune-steps-per-sample", "0"], timeout=240)
    assert result.returncode != 0
    assert "--autotune-steps-per-sample must be >= 1" in result.stderr
