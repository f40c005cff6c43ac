"""horovodlike.torch.plan: toy models whose best layout is known analytically (from given
layer profiles and a given link, so the answer does not depend on this machine's load), and a
real 2-rank job that profiles, measures the link and builds the chosen ProcessMesh."""

import dataclasses
import os
import subprocess
import sys

import pytest
import torch

from conftest import WORKERS, assert_all_ranks, job_env, launch
from horovodlike.torch.planner import (Calibration, LayerProfile, LinkProfile, fit_link, plan,
                                       profile_layers)
from horovodlike.torch.planner.calibration import layout_sizes
from horovodlike.torch.planner.calibration import shared_cores
from horovodlike.torch.planner.cost_model import (Contention, busy_fraction, layer_compute_s,
                                                  links_by_dimension, pipeline_sends, predict,
                                                  tp_skew_s)
from horovodlike.torch.planner.pipeline_sim import StageWork, simulate_1f1b
from horovodlike.torch.planner.profiling import linear_calls, slice_share

MB = 1 << 20
LINK = LinkProfile(latency_s=0.0, bus_bytes_per_s=1e9)


def layers(times, parameter_bytes, activation_bytes, tp_sizes=(), **kwargs):
    return [LayerProfile(name=f"{i}", forward_s=t / 3, backward_s=2 * t / 3,
                         activation_bytes=activation_bytes, parameter_bytes=parameter_bytes,
                         splittable=bool(tp_sizes), tp_sizes=tp_sizes, **kwargs)
            for i, t in enumerate(times)]


def layout(result, name):
    return {c.layout: c for c in result.candidates}[name]


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


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_calibrate_in_a_job(ranks):
    # 3 and 4 ranks on this machine's 2 cores measure the synchronisation cost (3: one rank
    # without a partner; 4: a tensor parallel collective's too); 2 have a core each.
    result = launch(ranks, "calibrate_worker.py")
    assert_all_ranks(result, ranks, "calibrate OK")


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


def test_tensor_parallel_divides_only_the_split_layers():
    # A split layer (3 ms, of which the Linears 2 ms) and a whole one (3 ms) on tp=2 with a
    # free link: 1 + 2 / 2 + 3 = 5 ms, not (3 + 3) / 2.
    profile = [LayerProfile("0", 0.001, 0.002, 1024, 1024, True, (6,), split_s=0.002),
               LayerProfile("1", 0.001, 0.002, 1024, 1024, False)]
    best = layout(run(profile, 2), "pp=1 dp=1 tp=2")
    assert best.step_s == pytest.approx(0.005)


def test_tensor_parallel_latency_is_paid_per_micro_batch():
    # pp=2 x tp=2, batch 8: 8 micro-batches of one row. Each layer (8 ms, all split) holds one
    # column/row pair's two messages of 1024 bytes for the whole batch. Per micro-batch and
    # stage: 8 / 8 / 2 = 0.5 ms of compute and two allreduces of 128 bytes over 2 ranks,
    # each 1 ms + 128 / 1e9 s; the boundary's 128 bytes sent forward and back, each
    # 0.5 ms + 128 / 1e9 s. 1F1B: (8 + 2 - 1) slots.
    link = LinkProfile(latency_s=1e-3, bus_bytes_per_s=1e9)
    profile = layers([0.008] * 2, 0, 1024, tp_sizes=(2,), tp_messages=(1024, 1024))
    result = plan(None, torch.zeros(8, 1), 4, link=link, layers=profile, verbose=False)
    piped = layout(result, "pp=2 dp=1 tp=2")
    # The layer's forward share is 0 (all backward): a stage's forward is its wait for the
    # forward message, its backward the compute and the backward message.
    tp_message = 1e-3 + 128e-9
    send = 0.5e-3 + 128e-9
    assert piped.micro_batches == 8
    assert piped.step_s == pytest.approx(
        one_f_one_b_by_hand([tp_message] * 2, [0.0005 + tp_message] * 2, [send], 8), rel=1e-9)


def one_f_one_b_by_hand(forward, backward, send, m):
    """Schedule1F1B's end with a core per rank, worked out action by action: each action
    starts when its stage's previous one ended and its input arrived."""
    pp = len(forward)
    order = []
    for s in range(pp):
        warmup = min(pp - 1 - s, m)
        acts = [("F", i) for i in range(warmup)]
        for i in range(m - warmup):
            acts += [("F", warmup + i), ("B", i)]
        order.append(acts + [("B", i) for i in range(m - warmup, m)])
    end = {}
    position, clock = [0] * pp, [0.0] * pp
    while any(position[s] < len(order[s]) for s in range(pp)):
        for s in range(pp):
            while position[s] < len(order[s]):
                kind, i = order[s][position[s]]
                if kind == "F":
                    need = end.get(("F", s - 1, i), None) if s else 0.0
                    ready = None if need is None else need + (send[s - 1] if s else 0.0)
                else:
                    need = end.get(("B", s + 1, i)) if s < pp - 1 else end[("F", s, i)]
                    ready = None if need is None else need + (
                        send[s] if s < pp - 1 else 0.0)
                if ready is None:
                    break
                clock[s] = max(clock[s], ready) + (forward[s] if kind == "F" else backward[s])
                end[(kind, s, i)] = clock[s]
                position[s] += 1
    return max(clock)


def test_pipeline_played_out_shares_the_cores():
    # Two stages on one core, forward and backward 1 s each, no send time, 2 micro-batches.
    # Alone on cores: F0 0-1; F1 (stage 0) and F0 (stage 1) 1-2; B0 (1) 2-3; B0 (0) and
    # F1 (1) 3-4; B1 (1) 4-5; B1 (0) 5-6. On one core the overlapping pairs run at half
    # speed: F1/F0 1-3, B0 (1) 3-4, B0 (0)/F1 (1) 4-6, B1 (1) 6-7, B1 (0) 7-8.
    work = [StageWork(1.0, 1.0), StageWork(1.0, 1.0)]
    assert simulate_1f1b(work, 2, [0.0]) == pytest.approx([6.0, 5.0])
    assert simulate_1f1b(work, 2, [0.0], cores=1) == pytest.approx([8.0, 7.0])
    # Two cores for the two: as alone; a hand-off's wake-up delays every hand-off.
    assert simulate_1f1b(work, 2, [0.0], cores=2) == pytest.approx([6.0, 5.0])
    # Neighbours on the other core slow each other by 1.5 while both compute: F1/F0 take
    # 1.5 s, B0 (0)/F1 (1) too.
    slow = simulate_1f1b(work, 2, [0.0], cores=2, slowdown=lambda k: 1.5 if k >= 2 else 1.0)
    assert slow == pytest.approx([7.0, 6.0])
    # Against the schedule worked out by hand, with sends and uneven stages.
    f, b, send = [0.3, 0.5, 0.2], [0.7, 0.4, 0.9], [0.05, 0.11]
    ends = simulate_1f1b([StageWork(x, y) for x, y in zip(f, b)], 5, send)
    assert max(ends) == pytest.approx(one_f_one_b_by_hand(f, b, send, 5))
    ends = simulate_1f1b([StageWork(x, y) for x, y in zip(f, b)], 5, send, wake_s=0.02)
    assert max(ends) == pytest.approx(one_f_one_b_by_hand(f, b, [x + 0.02 for x in send], 5))


def test_gradient_allreduce_overlaps_the_backward_as_the_optimizer_does():
    # dp=2, batch 8: each layer's backward takes 2 ms on the whole batch, 1 ms on a replica's
    # 4 rows; each allreduces 3 MB (3 ms at 1e9 B/s bus bandwidth over 2 ranks). The last
    # layer's allreduce starts at 1 ms and ends at 4, the first's runs 4..7: step 7 ms
    # (2 of compute, 5 left after it), where not overlapping would take 2 + 6.
    # Without a core to spare for the allreduce (overlap=False) it all follows the backward.
    profile = [LayerProfile(str(i), 0.0, 0.002, 1024, 3_000_000, False) for i in range(2)]
    replicated = layout(run(profile, 2, overlap=True), "pp=1 dp=2 tp=1")
    assert replicated.step_s == pytest.approx(0.007)
    assert replicated.compute_s == pytest.approx(0.002)
    serial = layout(run(profile, 2, overlap=False), "pp=1 dp=2 tp=1")
    assert serial.step_s == pytest.approx(0.008)


FREE = {"pp": LINK, "dp": LINK, "tp": LINK}
# 4 ranks on 2 cores, the layers profiled with all 4 busy: each ran at half a core.
CROWDED = Contention(cores=2, ranks=4, profiled_busy=4)


def played_on_two_cores():
    """pp=4 x 8 micro-batches of stages of 0.5 ms alone (a third forward) on 2 cores."""
    alone = [StageWork(0.0005 / 3, 0.001 / 3, host=0, ranks=1)] * 4
    return max(simulate_1f1b(alone, 8, [0.0] * 3, cores=2))


def test_pipeline_computes_faster_while_its_ranks_wait():
    # 4 layers of 8 ms on the batch of 8 (as profiled: all 4 ranks busy on 2 cores), no
    # activations to send. pp=4 runs 8 micro-batches of one row, 1 ms each as profiled, in
    # 8 + 3 = 11 slots: a stage is busy 8/11 of the step, so 4 x 8/11 = 32/11 ranks compute at
    # once on 2 cores, 16/11 times slower than alone instead of 2: a slot is 8/11 ms, the step
    # 11 x 8/11 = 8 ms (11 ms as profiled).
    profile = layers([0.008] * 4, 0, 0, batch=8)
    assert busy_fraction(4, 8) == pytest.approx(8 / 11)
    assert CROWDED.oversubscription(8 / 11) == pytest.approx(16 / 11)
    assert CROWDED.compute_scale(8 / 11) == pytest.approx(8 / 11)
    piped = predict(profile, FREE, 4, 1, 1, 8, contention=CROWDED)
    # Played out (pipeline_sim), the fill and drain crowd the cores less than the average:
    # between a core per rank (11 x 0.5 ms) and two ranks per core all along (11 ms), at
    # what the schedule on 2 cores gives with each stage's 0.5 ms alone (a third forward).
    played = played_on_two_cores()
    assert 0.0055 < played < 0.011
    assert piped.micro_batches == 8 and piped.step_s == pytest.approx(played)
    assert predict(profile, FREE, 4, 1, 1, 8).step_s == pytest.approx(0.011)
    # Data parallel keeps every rank busy, as profiled: 4 x 8 ms on 2 rows each, unchanged.
    assert predict(profile, FREE, 1, 4, 1, 8, contention=CROWDED).step_s == \
        pytest.approx(0.008)
    # A profile taken alone (profiled_busy 1) is slowed by the 2 ranks per core of dp=4.
    alone = Contention(cores=2, ranks=4, profiled_busy=1)
    assert predict(profile, FREE, 1, 4, 1, 8, contention=alone).step_s == \
        pytest.approx(0.016)
    # A core per rank: nothing to rescale.
    roomy = Contention(cores=4, ranks=4, profiled_busy=4)
    assert predict(profile, FREE, 4, 1, 1, 8, contention=roomy).step_s == \
        pytest.approx(0.011)
    with pytest.raises(ValueError, match="at least 1"):
        Contention(cores=0, ranks=4)


def test_tensor_parallel_waits_for_its_slowest_peer():
    # 3 ms between two collectives, measured with 2 busy ranks per core: 1.5 ms alone, each
    # peer waits uniformly 0 to 2 x 1.5 ms for its core (1.5 on average, in the 3 ms). The
    # last of 2 peers comes 1/3 of 1.5 ms after the average, the last of 4 3/5 of it.
    assert tp_skew_s(0.003, 2, 2.0) == pytest.approx(0.0005)
    assert tp_skew_s(0.003, 4, 2.0) == pytest.approx(0.0009)
    assert tp_skew_s(0.003, 1, 2.0) == 0.0 and tp_skew_s(0.003, 4, 1.0) == 0.0
    # One layer of 6 ms on the batch, all of it split: tp=4 computes 1.5 ms (4 busy ranks on
    # 2 cores, as profiled), then waits 0.75 x 3/5 = 0.45 ms for its last peer; free link.
    profile = layers([0.006], 0, 0, tp_sizes=(4,), batch=8)
    split = predict(profile, FREE, 1, 1, 4, 8, contention=CROWDED)
    assert split.step_s == pytest.approx(0.0015 + 0.00045)
    assert split.compute_s == pytest.approx(0.0015)
    assert predict(profile, FREE, 1, 1, 4, 8).step_s == pytest.approx(0.0015)


def test_synchronisations_of_part_of_a_crowded_host_pay_the_measured_cost():
    # One layer of 6 ms alone on the batch of 8, all of it split, one column/row pair (two
    # messages), 1 MB of parameters; a free link; 4 ranks on 2 cores, every core computing
    # 1.5x slower than one alone; a synchronisation of a group smaller than the 4 ranks costs
    # 1 ms.
    profile = layers([0.006], 1_000_000, 0, tp_sizes=(4,), tp_messages=(1024, 1024), batch=8)
    crowded = Contention(cores=2, ranks=4, profiled_busy=1, slowdown=1.5, wake_s=0.001)
    # Every rank computes at once: 2 ranks per core, each 1.5x slower: x3.
    compute = 3.0
    # tp=4 is the whole host: its two allreduces (1 KiB, 2 x 3/4 x 1024 ns each) wait for
    # nobody outside.
    tp4 = predict(profile, FREE, 1, 1, 4, 8, contention=crowded, overlap=False)
    assert tp4.step_s == pytest.approx(0.006 / 4 * compute + 2 * 1.5 * 1024e-9)
    # dp=4 likewise (1.5 ms of the batch's 6 per rank, its allreduce of 1 MB: 2 x 3/4 ms);
    # tp=1 has no tensor parallel messages to charge.
    dp4 = predict(profile, FREE, 1, 4, 1, 8, contention=crowded, overlap=False)
    assert dp4.step_s == pytest.approx(0.006 / 4 * compute + 2 * 0.75 * 1_000_000 / 1e9)
    # dp=2 x tp=2: pairs, with two other ranks on the host: each tp message (512 bytes on
    # a replica's 4 rows: 2 x 1/2 x 512 ns) pays 1 ms, the gradient allreduce of 0.5 MB per
    # rank (2 x 1/2 x 0.5 ms) another.
    messages = 2 * 512e-9
    mixed = predict(profile, FREE, 1, 2, 2, 8, contention=crowded, overlap=False)
    assert mixed.step_s == pytest.approx(0.006 / 4 * compute + messages + 2 * 0.001
                                         + 2 * 0.5 * 500_000 / 1e9 + 0.001)
    # With a core per rank nothing is charged.
    roomy = Contention(cores=4, ranks=4, profiled_busy=1, slowdown=1.0, wake_s=0.001)
    assert predict(profile, FREE, 1, 2, 2, 8, contention=roomy, overlap=False).step_s == \
        pytest.approx(0.006 / 4 + messages + 2 * 0.5 * 500_000 / 1e9)


def test_the_step_ends_with_the_optimizer_and_the_exchange_costs_beyond_its_link():
    # One layer of 6 ms alone on the batch of 8, all of it split, 1 MB of parameters whose
    # optimizer step takes 2 ms; a free link, no contention.
    profile = layers([0.006], 1_000_000, 0, tp_sizes=(4,), batch=8, update_s=0.002)
    exchange = 2 * 0.75 * 1_000_000 / 1e9       # dp=4's allreduce of 1 MB on the link
    # dp=4: each rank steps on all the parameters after the allreduce.
    dp4 = predict(profile, FREE, 1, 4, 1, 8, overlap=False)
    assert dp4.step_s == pytest.approx(0.006 / 4 + exchange + 0.002)
    # tp=4: a quarter of them each; fully_shard over dp=4: a quarter too.
    assert predict(profile, FREE, 1, 1, 4, 8, overlap=False).step_s == \
        pytest.approx(0.006 / 4 + 0.002 / 4)
    assert predict(profile, FREE, 1, 4, 1, 8, overlap=False, fsdp=True).step_s == \
        pytest.approx(0.006 / 4 + 3 * 0.75 * 1_000_000 / 1e9 + 0.002 / 4)
    # DistributedOptimizer's exchange costing 1 ns per byte beyond the link: 1 ms more.
    slower = predict(profile, FREE, 1, 4, 1, 8, overlap=False, exchange_s_per_byte=1e-9)
    assert slower.step_s == pytest.approx(dp4.step_s + 0.001)
    # On a crowded host the step is computed at the layout's sharing, as the rest (x3).
    crowded = Contention(cores=2, ranks=4, profiled_busy=1, slowdown=1.5)
    assert predict(profile, FREE, 1, 4, 1, 8, overlap=False, contention=crowded).step_s == \
        pytest.approx(3 * 0.006 / 4 + exchange + 3 * 0.002)


def test_a_pipeline_action_pays_the_schedules_own_work():
    # Two layers of 6 ms on the batch of 8, a stage each: 8 micro-batches of one row, each
    # layer's forward 0.25 ms and backward 0.5 ms a micro-batch; the schedule's own work adds
    # 0.1 ms to every forward and every backward, played out as compute (free link).
    profile = layers([0.006] * 2, 0, 0, batch=8)
    plain = predict(profile, FREE, 2, 1, 1, 8)
    assert plain.micro_batches == 8
    assert plain.step_s == pytest.approx(max(simulate_1f1b(
        [StageWork(0.00025, 0.0005)] * 2, 8, [0.0])))
    busy = predict(profile, FREE, 2, 1, 1, 8, pipeline_action_s=0.0001)
    assert busy.step_s == pytest.approx(max(simulate_1f1b(
        [StageWork(0.00035, 0.0006)] * 2, 8, [0.0])))
    # 8 forwards and 8 backwards a stage, one more of each on the other stage's way in and out.
    assert busy.step_s - plain.step_s == pytest.approx(18 * 0.0001)
    # Without a pipeline there is no schedule to pay.
    assert predict(profile, FREE, 1, 2, 1, 8, pipeline_action_s=0.0001).step_s == \
        pytest.approx(predict(profile, FREE, 1, 2, 1, 8).step_s)


def test_a_tensor_parallel_collective_pays_its_own_measured_meeting():
    # As test_synchronisations_of_part_of_a_crowded_host_pay_the_measured_cost, with a tensor
    # parallel collective measured at 3 ms a meeting: dp=2 x tp=2's two messages pay 3 ms
    # each, the gradient allreduce (not a tensor parallel collective) still 1 ms.
    profile = layers([0.006], 1_000_000, 0, tp_sizes=(4,), tp_messages=(1024, 1024), batch=8)
    crowded = Contention(cores=2, ranks=4, profiled_busy=1, slowdown=1.5, wake_s=0.001,
                         collective_wake_s=0.003)
    assert crowded.sync_s(2, collective=True) == 0.003 and crowded.sync_s(2) == 0.001
    assert crowded.sync_s(4, collective=True) == 0.0     # the whole host: nobody outside
    mixed = predict(profile, FREE, 1, 2, 2, 8, contention=crowded, overlap=False)
    assert mixed.step_s == pytest.approx(0.006 / 4 * 3.0 + 2 * 512e-9 + 2 * 0.003
                                         + 2 * 0.5 * 500_000 / 1e9 + 0.001)


def test_a_groups_collective_under_a_pipeline_pays_its_meeting_on_a_crowded_host():
    # Hosts of two ranks on one core: a tensor parallel group of a host's two ranks has nobody
    # of the host outside it, so without a pipeline its collectives pay no wake; under a
    # pipeline each waits for the other stages' ranks too (every round negotiates the global
    # set), as a meeting on a crowded host does: collective_wake_s (3 ms) per message, and
    # wake_s (1 ms) for a gradient allreduce. On hosts with a core per rank, nothing.
    profile = layers([0.006] * 2, 0, 0, tp_sizes=(4,), tp_messages=(512,), batch=8)
    crowded = Contention(cores=1, ranks=2, profiled_busy=1, wake_s=0.001,
                         collective_wake_s=0.003)
    assert crowded.sync_s(2, collective=True) == 0.0          # the host's whole group
    assert crowded.sync_s(2, collective=True, apart=False) == 0.0
    assert crowded.sync_s(2, collective=True, apart=True) == 0.003
    assert crowded.sync_s(2, apart=True) == 0.001
    roomy = Contention(cores=2, ranks=2, profiled_busy=1, wake_s=0.001,
                       collective_wake_s=0.003)
    assert roomy.sync_s(2, collective=True, apart=True) == 0.0
    piped = predict(profile, FREE, 2, 1, 2, 8, contention=crowded)
    free = predict(profile, FREE, 2, 1, 2, 8,
                   contention=dataclasses.replace(crowded, collective_wake_s=0.0))
    # 8 micro-batches, each stage's one message a micro-batch 3 ms later: the played-out
    # schedule holds a stage's 8 x 3 ms at least.
    assert piped.micro_batches == 8
    assert piped.step_s - free.step_s >= 8 * 0.003 - 1e-9

def test_calibration_records_the_cores_its_ranks_shared(tmp_path):
    # Outside a job: this process alone on the CPUs it may run on.
    cores, sharing = shared_cores()
    assert sharing == 1 and cores == len(os.sched_getaffinity(0))
    # plan() rescales from what a calibration recorded: 4 ranks on 2 cores, as in
    # test_pipeline_computes_faster_while_its_ranks_wait.
    calibration = Calibration(layers=layers([0.008] * 4, 0, 0, batch=8),
                              links={"inside": LINK}, world_size=4, batch=8,
                              conditions={"cores": 2, "ranks_sharing_cores": 4})
    path = tmp_path / "calibration.json"
    calibration.save(path)
    result = plan(None, torch.zeros(8, 1), 4, calibration=str(path), fsdp=False,
                  verbose=False)
    assert layout(result, "pp=4 dp=1 tp=1").step_s == pytest.approx(played_on_two_cores())
    # Profiled alone (calibrate() now does), the same figures are twice the compute.
    calibration.conditions["profiled_busy"] = 1
    result = plan(None, torch.zeros(8, 1), 4, calibration=calibration, fsdp=False,
                  verbose=False)
    assert layout(result, "pp=4 dp=1 tp=1").step_s == pytest.approx(2 * played_on_two_cores())
    # One written before the cores were recorded is taken as profiled.
    calibration.conditions = {}
    result = plan(None, torch.zeros(8, 1), 4, calibration=calibration, fsdp=False,
                  verbose=False)
    assert layout(result, "pp=4 dp=1 tp=1").step_s == pytest.approx(0.011)


def test_lines_leaving_a_host_share_its_wire():
    # 2 hosts x 2 ranks, the link between them measured by both of a host's ranks at once
    # (sharing 2): 1e8 B/s each. dp=4 (ranks 0-3, one line) has the wire alone: 2e8; dp=2 x
    # tp=2 has two dp lines ({0, 2} and {1, 3}) through it: 1e8 each; tp stays inside.
    inside = LinkProfile(1e-5, 1e10)
    between = LinkProfile(1e-4, 1e8, sharing=2)
    alone = links_by_dimension(inside, between, 2, 1, 4, 1)
    assert alone["dp"].bus_bytes_per_s == pytest.approx(2e8) and alone["pp"] is inside
    pairs = links_by_dimension(inside, between, 2, 1, 2, 2)
    assert pairs["dp"].bus_bytes_per_s == pytest.approx(1e8) and pairs["tp"] is inside
    piped = links_by_dimension(inside, between, 2, 2, 2, 1)
    assert piped["pp"].bus_bytes_per_s == pytest.approx(1e8) and piped["dp"] is inside
    assert piped["pp"].latency_s == 1e-4
    # Measured over every rank (2 per host): a line with several ranks on each host takes it
    # (tp=4, dp=4); lines with one rank per host keep the link between hosts.
    across = LinkProfile(5e-4, 3e8, ranks=4)
    whole = links_by_dimension(inside, between, 2, 1, 1, 4, across_link=across)
    assert whole["tp"] is not across and whole["tp"].latency_s == 5e-4
    assert whole["tp"].bus_bytes_per_s == pytest.approx(3e8)
    assert links_by_dimension(inside, between, 2, 1, 4, 1, across_link=across)["dp"] \
        .bus_bytes_per_s == pytest.approx(3e8)
    pairs = links_by_dimension(inside, between, 2, 1, 2, 2, across_link=across)
    assert pairs["dp"].bus_bytes_per_s == pytest.approx(1e8) and pairs["tp"] is inside


def test_pipeline_hand_offs_take_the_point_to_point_link_of_their_boundary():
    inside = LinkProfile(latency_s=20e-6, bus_bytes_per_s=5e9)
    between = LinkProfile(latency_s=100e-6, bus_bytes_per_s=1e8)
    # Two hosts of two ranks: pp=4 crosses between stages 1 and 2 only, one rank a stage;
    # pp=2 x dp=2 crosses at its one boundary, the host's two ranks sharing the wire.
    assert pipeline_sends(2, 4, 1, 1, inside, between) == [inside, between, inside]
    assert pipeline_sends(2, 2, 2, 1, inside, between) == [between.shared_by(2)]
    assert pipeline_sends(None, 4, 1, 1, inside, None) == [inside] * 3   # one host
    assert pipeline_sends(2, 4, 1, 1, inside, None) is None              # not measured
    assert pipeline_sends(None, 4, 1, 1, None, None) is None
    # links_by_dimension gives them beside the dimensions' links when it has them.
    assert links_by_dimension(between, between, 2, 4, 1, 1, sends=(inside, between))[
        "pp_sends"] == [inside, between, inside]
    assert "pp_sends" not in links_by_dimension(between, between, 2, 4, 1, 1)
    # Played out: each boundary's activation (1 KiB a micro-batch) on its own link.
    profile = layers([0.004] * 4, 0, 8 * 1024, batch=8)
    links = {"pp": between, "dp": between, "tp": between}
    apart = predict(profile, links, 4, 1, 1, 8)
    split = predict(profile, {**links, "pp_sends": pipeline_sends(2, 4, 1, 1, inside, between)},
                    4, 1, 1, 8)
    sends = [inside.send_s(1024), between.send_s(1024), inside.send_s(1024)]
    work = [StageWork(0.004 / 8 / 3, 0.008 / 8 / 3)] * 4   # a layer a stage, a row each
    assert split.step_s == pytest.approx(max(simulate_1f1b(work, 8, sends)))
    assert apart.step_s == pytest.approx(max(simulate_1f1b(work, 8, [sends[1]] * 3)))
    assert split.step_s < apart.step_s


class Pair(torch.nn.Module):
    """A block holding one column/row pair."""

    def __init__(self):
        super().__init__()
        self.up, self.down = torch.nn.Linear(4, 8), torch.nn.Linear(8, 4)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))


def test_profile_pairs_linears_column_then_row():
    # Linear, ReLU, Linear is one pair: one message each way of 2 x 4 floats (the row's output
    # forward, the column's input gradient backward), the ReLU between computes on the slice;
    # a block with a pair inside has both messages; the last Linear has no partner and stays
    # whole.
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4),
                                Pair(), torch.nn.Linear(4, 4))
    profile = profile_layers(model, torch.randn(2, 4), sizes=[(1, 2)], repeats=1)
    assert [p.tp_messages for p in profile] == [(32,), (), (32,), (32, 32), ()]
    assert [p.splittable for p in profile] == [True, True, True, True, False]
    assert [p.tp_sizes for p in profile] == [(8,), (), (), (8,), ()]
    assert profile[4].split_s == 0.0 and profile[4].timings["1/2"] > 0
    # Inside the block, the ReLU between its column and row computes on the slice: a share of
    # its forward above nothing and below the whole; a layer without a pair has none.
    calls = linear_calls(list(model.children()), torch.randn(2, 4))
    assert 0 < slice_share(model[3], calls, torch.randn(2, 4), repeats=3) < 1
    assert slice_share(model[1], calls, torch.randn(2, 4), repeats=3) == 0.0
    solo = profile_layers(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU()),
                          torch.randn(2, 4), repeats=1)
    assert [p.splittable for p in solo] == [False, False] and solo[0].split_s == 0.0
    assert all("1/2" in p.timings and p.batch == 2 for p in profile)
    assert profile[1].timings["1/2"] > 0


def test_compute_uses_the_size_it_was_measured_on():
    layer = LayerProfile("0", 0.002, 0.004, 1024, 1024, True, (8,), split_s=0.004,
                         timings={"2/2": 0.0035}, batch=8)
    assert layer_compute_s(layer, 2, 2) == 0.0035
    # Not measured at 4 rows: half the batch, the split half of it halved again.
    assert layer_compute_s(layer, 4, 2) == pytest.approx(0.003 - 0.002 + 0.001)
    assert layer_compute_s(layer, 4, 1) == pytest.approx(0.003)


def test_layout_sizes_and_link_fit():
    # Batch 64 on 4 ranks: pp=1 gives 64/tp4, 32/tp2, 16/tp1; pp=2 x tp=2 8 micro-batches of
    # 8; pp=2 x dp=2 8 of 4; pp=4 16 of 4.
    assert layout_sizes(4, 64) == [(4, 1), (8, 2), (16, 1), (32, 2), (64, 4)]
    sizes = [4096, 65536, 1 << 20, 1 << 22]
    seconds = [50e-6 + 2 * 3 / 4 * s / 2e9 for s in sizes]
    link = fit_link(sizes, seconds, ranks=4, kind="TCP")
    assert link.latency_s == pytest.approx(50e-6, rel=1e-6)
    assert link.bus_bytes_per_s == pytest.approx(2e9, rel=1e-6)


def test_calibration_file_round_trip(tmp_path):
    profile = layers([0.003] * 2, 1 * MB, 1024, batch=8)
    calibration = Calibration(layers=profile, links={
        "inside": LinkProfile(0.0, 1e10, kind="shared memory"),
        "between": LinkProfile(0.0, 1e8, kind="TCP between hosts")},
        world_size=4, batch=8, slots_per_host=2)
    path = tmp_path / "calibration.json"
    calibration.save(path)
    loaded = Calibration.load(path)
    assert loaded == calibration
    # The hosts come with it: two hosts of two keep dp inside a host.
    assert plan(None, torch.zeros(8, 1), 4, calibration=str(path),
                verbose=False).shape == (2, 2, 1)
    with pytest.raises(ValueError, match="measured on a batch of \\[8\\] rows but"):
        plan(None, torch.zeros(16, 1), 4, calibration=loaded, verbose=False)
    with pytest.raises(ValueError, match="calibration must be a Calibration"):
        plan(None, torch.zeros(8, 1), 4, calibration=123, verbose=False)
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="not a calibration file"):
        Calibration.load(tmp_path / "bad.json")


# The links benchmarks/whale.py calibrated on 2 emulated hosts x 2 ranks (2 cores, so the
# gradient allreduce cannot overlap the backward): shared memory inside a host, the 1 Gbit/s
# link between them measured by one line alone.
WHALE_INSIDE = LinkProfile(latency_s=254e-6, bus_bytes_per_s=841.9e6, kind="shared memory")
WHALE_BETWEEN = LinkProfile(latency_s=1654e-6, bus_bytes_per_s=122.1e6, kind="TCP")


def whale_plan(profile, batch):
    return plan(None, torch.zeros(batch, 1), 4, hosts="a:2,b:2", link=WHALE_INSIDE,
                inter_host_link=WHALE_BETWEEN, layers=profile, fsdp=False, overlap=False,
                verbose=False)


def test_whale_bert_small_pipelines_across_hosts():
    # whale.py's model: 4 blocks of attention (2,368,512 bytes of parameters) and MLP
    # (4,729,344), activations of 8 x 16 x 384 floats, each block's Linears one pair; about
    # 40 and 80 ms forward + backward on the batch of 8. Data parallel across the hosts sends
    # 1.5 x 28.4 MB each way over the slow link, about 0.33 s; pipeline stages across the
    # hosts send 2 x 24.6 KB per micro-batch and keep the allreduce in shared memory.
    profile = [LayerProfile(f"{i}", t / 3, 2 * t / 3, 196608, p, True, (f,),
                            tp_messages=(196608, 196608), batch=8)
               for i, (t, p, f) in enumerate([(0.040, 2368512, 1152),
                                              (0.080, 4729344, 1536)] * 4)]
    result = whale_plan(profile, 8)
    data_parallel = layout(result, "pp=1 dp=4 tp=1")
    pipelined = layout(result, "pp=2 dp=2 tp=1")
    # The best pipelines across the hosts (stage 0 on one host, stage 1 on the other) and
    # keeps its other dimension inside each; data parallel across them ranks last.
    assert result.best.pp == 2 and result.best.stages == [(0, 4), (4, 8)]
    assert pipelined.stages == [(0, 4), (4, 8)]
    assert data_parallel.step_s > 2 * pipelined.step_s
    assert result.candidates[-1] is data_parallel
    # Its gradient traffic per rank: 2 x 3/4 of 28.4 MB, against 2 x 1/2 of a stage's 14.2 MB.
    assert data_parallel.gradient_bytes == pytest.approx(1.5 * 4 * (2368512 + 4729344))
    assert pipelined.gradient_bytes == pytest.approx(2 * 0.5 * 2 * (2368512 + 4729344))


def test_whale_bert_large_keeps_the_gradient_allreduce_inside_a_host():
    # Whale's BERT-Large figures: 1.245 GB of gradients (24 layers), about 27 MB of
    # activations per step at a stage boundary (13.5 MB forward and its gradient back),
    # 30 ms of forward + backward per layer, on the links measured above.
    profile = layers([0.030] * 24, 1.245e9 / 24, 13.5e6, batch=32)
    result = plan(None, torch.zeros(32, 1), 4, hosts="a:2,b:2", link=WHALE_INSIDE,
                  inter_host_link=WHALE_BETWEEN, layers=profile, fsdp=False, overlap=False,
                  verbose=False)
    data_parallel = layout(result, "pp=1 dp=4 tp=1")
    pipelined = layout(result, "pp=2 dp=2 tp=1")
    # Across the hosts: 1.5 x 1.245 GB at 122.1 MB/s (about 15.3 s) against the activations.
    assert data_parallel.step_s > 1.5 * 1.245e9 / 122.1e6
    assert pipelined.step_s < data_parallel.step_s / 5
    assert result.best.dp == 1 or result.best.layout == "pp=2 dp=2 tp=1"
