"""horovodlike.torch.plan: toy models whose best layout is known analytically (from given
layer profiles and a given link, so the answer does not depend on this machine's load), and a
real 2-rank job that profiles, measures the link and builds the chosen ProcessMesh."""

import subprocess
import sys

import pytest
import torch

from conftest import WORKERS, assert_all_ranks, job_env, launch
from horovodlike.torch.planner import LayerProfile, LinkProfile, plan

MB = 1 << 20
LINK = LinkProfile(latency_s=0.0, bus_bytes_per_s=1e9)


def layers(times, parameter_bytes, activation_bytes, tp_sizes=()):
    return [LayerProfile(name=f"{i}", forward_s=t / 3, backward_s=2 * t / 3,
                         activation_bytes=activation_bytes, parameter_bytes=parameter_bytes,
                         splittable=bool(tp_sizes), tp_sizes=tp_sizes)
            for i, t in enumerate(times)]


def run(profile, world_size, batch=8, **kwargs):
    return plan(None, torch.zeros(batch, 1), world_size, link=LINK, layers=profile,
                verbose=False, **kwargs)


def test_large_gradients_small_activations_pipeline():
    # 4 x 100 MiB of gradients, 1 KiB activations: allreducing gradients costs ~0.6 s over
    # dp=4 while a 4-stage pipeline of 8 micro-batches costs (8 + 3) x 3 ms / 8.
    best = run(layers([0.003] * 4, 100 * MB, 1024), 4).best
    assert (best.pp, best.dp, best.tp) == (4, 1, 1)
    assert best.stages == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert best.step_s == pytest.approx(11 * 0.003 / 8, rel=0.01)


def test_small_gradients_data_parallel():
    # 1 KiB of gradients: dp=4 divides the compute with no pipeline bubble.
    result = run(layers([0.003] * 4, 1024, 1024), 4)
    assert result.shape == (1, 4, 1)
    assert result.best.step_s == pytest.approx(0.012 / 4, rel=0.01)
    # Without Linear layers tensor parallelism is not offered, with a reason.
    assert any("no Linear layer" in reason for _, reason in result.rejected)


def test_stages_balance_compute():
    # Times 1, 1, 1, 3: two stages cut after the third layer (3 against 3).
    best = run(layers([0.001, 0.001, 0.001, 0.003], 100 * MB, 1024), 2).best
    assert (best.pp, best.dp) == (2, 1) and best.stages == [(0, 3), (3, 4)]


def test_tensor_parallel_and_its_constraints():
    # Splittable layers with large gradients and small activations: tp=2 halves compute
    # and gradients; tp=4 is impossible because 6 features do not split in four.
    result = run(layers([0.004] * 2, 100 * MB, 1024, tp_sizes=(6,)), 4)
    assert any("tp=4" in layout and "[6]" in reason for layout, reason in result.rejected)
    assert all(c.tp != 4 for c in result.candidates)
    assert result.best.tp == 2


def test_hosts_keep_the_gradient_allreduce_inside_a_host():
    # 2 MiB of gradients: on one host dp=4 wins (no pipeline bubble); on two hosts of two
    # with a 100x slower link between them, dp=4's allreduce crosses hosts, so the planner
    # pipelines across the hosts and keeps dp=2 inside each (as Whale does).
    profile = layers([0.003] * 2, 1 * MB, 1024)
    fast = LinkProfile(latency_s=0.0, bus_bytes_per_s=1e10)
    slow = LinkProfile(latency_s=0.0, bus_bytes_per_s=1e8)
    one_host = plan(None, torch.zeros(8, 1), 4, link=fast, layers=profile, verbose=False)
    assert one_host.shape == (1, 4, 1)
    two_hosts = plan(None, torch.zeros(8, 1), 4, hosts="a:2,b:2", link=fast,
                     inter_host_link=slow, layers=profile, verbose=False)
    assert two_hosts.shape == (2, 2, 1)
    assert two_hosts.best.step_s < 0.1 * [c for c in two_hosts.candidates
                                          if c.layout == "pp=1 dp=4 tp=1"][0].step_s


def test_memory_limit_ranks_layouts_that_fit_first():
    profile = layers([0.003] * 4, 1024, 1024)
    unlimited = run(profile, 4)
    limited = run(profile, 4, memory_limit=unlimited.best.memory_bytes - 1)
    assert limited.best.fits and limited.best.layout != unlimited.best.layout
    assert not [c for c in limited.candidates if c.layout == unlimited.best.layout][0].fits


def test_bad_input():
    with pytest.raises(ValueError, match="torch.nn.Sequential"):
        plan(torch.nn.Linear(2, 2), torch.zeros(4, 2), 2, link=LINK, verbose=False)
    with pytest.raises(ValueError, match="no link given"):
        plan(torch.nn.Sequential(torch.nn.Linear(2, 2)), torch.zeros(4, 2), 2, verbose=False)
    profile = layers([0.001] * 2, 1024, 1024)
    with pytest.raises(ValueError, match="world_size must be a positive int, got 0"):
        run(profile, 0)
    with pytest.raises(ValueError, match="sample_input must be a tensor"):
        plan(None, [1, 2], 2, link=LINK, layers=profile, verbose=False)
    with pytest.raises(ValueError, match="hosts 'a:2,b:1' must give every host the same"):
        run(profile, 3, hosts="a:2,b:1")
    with pytest.raises(ValueError, match="hosts 'a:1,b:1' must give every host the same"):
        run(profile, 4, hosts="a:1,b:1")


def test_plan_in_a_job_builds_the_mesh():
    result = launch(2, "planner_worker.py")
    assert_all_ranks(result, 2, "planner OK")
    assert "layout" in result.stdout and "step ms" in result.stdout


def test_launcher_plan_entry():
    command = [sys.executable, "-m", "horovodlike.runner.launch", "-np", "2", "--plan",
               "plan_model:build"]
    result = subprocess.run(command, env=job_env(), capture_output=True, text=True,
                            timeout=120, cwd=WORKERS)
    assert result.returncode == 0, result.stdout + result.stderr
    table = [line for line in result.stdout.splitlines() if "pp=" in line]
    # (pp, dp, tp) = (1, 2, 1) twice (replicated and fsdp), (2, 1, 1), (1, 1, 2).
    assert len(table) == 4 and "plan for 2 ranks, batch 8" in result.stdout, result.stdout


def test_fully_shard_when_data_parallel_does_not_fit():
    # Two layers of 100 MiB and 10 MiB of parameters on 2 ranks, Adam (state 2x): replicated
    # they take 4 x 110 MiB per rank, one stage each 4 x 100 MiB; sharded over dp=2,
    # 4 x 110 / 2 + 100 (the largest layer gathered whole) = 320 MiB. Under 350 MiB only
    # fully_shard fits; without a limit it ranks after replicating (it sends 3x, not 2x).
    big, small, activations, batch = 100 * MB, 10 * MB, 1024, 8
    profile = [LayerProfile(name=str(i), forward_s=0.001, backward_s=0.002,
                            activation_bytes=activations, parameter_bytes=p, splittable=False)
               for i, p in enumerate([big, small])]
    free = {c.layout: c for c in run(profile, 2, batch=batch).candidates}
    assert free["pp=1 dp=2 tp=1"].step_s < free["pp=1 fsdp=2 tp=1"].step_s
    assert all(c.fits for c in free.values())
    limited = run(profile, 2, batch=batch, memory_limit=350 * MB)
    assert (limited.shape, limited.fsdp) == ((1, 2, 1), True) and limited.best.fits
    assert [c.layout for c in limited.candidates if c.fits] == ["pp=1 fsdp=2 tp=1"]
    by_layout = {c.layout: c for c in limited.candidates}
    # The formulas, computed here: memory (parameters + gradients + Adam's 2) / 2 + the
    # largest layer + the activations of half the batch; bytes 3 x parameters x (2-1)/2.
    params = big + small
    sharded = by_layout["pp=1 fsdp=2 tp=1"]
    assert sharded.memory_bytes == int(4 * params / 2 + big + 2 * activations / 2)
    assert sharded.gradient_bytes == pytest.approx(3 * params * 1 / 2)
    assert sharded.step_s == pytest.approx(0.006 / 2 + 3 * params / 2 / 1e9)
    replicated = by_layout["pp=1 dp=2 tp=1"]
    assert replicated.memory_bytes == int(4 * params + 2 * activations / 2)
    assert replicated.gradient_bytes == pytest.approx(2 * params / 2)
    assert not replicated.fits and not by_layout["pp=2 dp=1 tp=1"].fits
    assert "fsdp=2" in limited.table()
    # Pipelined (4 ranks: pp=2 x fsdp=2, stages of one layer, m=4 micro-batches of the 4 rows
    # a replica has): each micro-batch gathers for its forward and its backward, 2m + 1 = 9
    # collectives of the larger stage's parameters; half the activations kept (2 of 4 in flight).
    piped = {c.layout: c for c in run(profile, 4, batch=batch).candidates}["pp=2 fsdp=2 tp=1"]
    assert piped.micro_batches == 4 and piped.stages == [(0, 1), (1, 2)]
    assert piped.gradient_bytes == pytest.approx(9 * big / 2)
    assert piped.memory_bytes == int(4 * big / 2 + big + activations / 2 * 2 / 4)
