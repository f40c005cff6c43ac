"""horovodlike.torch.planner.search_layers: the per-layer search against brute force on small
chains (every style of every layer, every cut, every layout and ZeRO level), known optima
worked out by hand (Megatron's column/row pair, fully_shard forced by the memory limit,
pipelining forced by it), and its plans applied: parallelize_module and split_sequential on
2 ranks give what one process gives."""

import itertools
import random

import pytest
import torch

from conftest import assert_all_ranks, launch
from horovodlike.torch.planner import (Calibration, LayerProfile, LayerSpec, LinkProfile,
                                       search_layers)
from horovodlike.torch.planner.cost_model import factorisations, links_by_dimension
from horovodlike.torch.planner.layer_options import TAGGED, layer_options
from horovodlike.torch.planner.layer_search import Setting
from horovodlike.torch.planner.search import describe_layers, evaluate

MB = 1 << 20
LINK = LinkProfile(latency_s=20e-6, bus_bytes_per_s=1e9)


def brute_force(specs, world_size, batch, micro_batches, memory_limit, levels=(0, 1, 3),
                links_for=lambda pp, dp, tp: links_by_dimension(LINK, LINK, None, pp, dp, tp),
                **terms):
    """The fastest plan that fits, by trying every combination: (step, memory, layout).
    ``links_for(pp, dp, tp)``: each layout's links; ``terms``: the Settings'
    exchange_s_per_byte and pipeline_action_s."""
    best = None
    for pp, dp, tp in factorisations(world_size):
        if pp > len(specs) or batch % dp:
            continue
        links = links_for(pp, dp, tp)
        options = [layer_options(s, tp, dp, links["tp"]) for s in specs]
        for level in levels if dp > 1 else (0,):
            setting = Setting(pp, dp, tp, level, micro_batches, links, 2, memory_limit, **terms)
            for cuts in itertools.combinations(range(1, len(specs)), pp - 1):
                bounds = list(zip((0, *cuts), (*cuts, len(specs))))
                for chosen in _paths(options, set(cuts)):
                    step, memory, _ = evaluate(specs, chosen, bounds, setting)
                    if memory_limit is not None and memory > memory_limit:
                        continue
                    if best is None or (step, memory) < best[:2]:
                        best = (step, memory, (pp, dp, tp, level))
    return best


def _paths(options, cuts, state=0, i=0):
    """Every sequence of options whose layouts join up (a cut drops the tag)."""
    if i == len(options):
        if state % TAGGED == 0:
            yield []
        return
    if i in cuts:
        state %= TAGGED
    for option in options[i]:
        if option.source == state:
            for rest in _paths(options, cuts, option.target, i + 1):
                yield [option, *rest]


def random_chain(seed, length, kinds=("linear", "elementwise", "linear", "norm", "linear",
                                      "other")):
    rng = random.Random(seed)
    specs, width = [], rng.choice([512, 1024])
    for i in range(length):
        kind = kinds[(i + seed) % len(kinds)]
        params = {"linear": rng.choice([1, 4, 16]) * MB, "norm": 8 * 1024,
                  "other": rng.choice([0, 2, 8]) * MB, "elementwise": 0}[kind]
        out_bytes = rng.choice([1, 2, 4]) * MB
        specs.append(LayerSpec(
            name=str(i), kind=kind, compute_s=rng.uniform(0.5e-3, 4e-3), parameter_bytes=params,
            input_bytes=specs[-1].output_bytes if specs else 2 * MB, output_bytes=out_bytes,
            colwise_size=width if kind == "linear" else 0,
            rowwise_size=width if kind == "linear" else 0, sequence_size=64,
            update_s=rng.uniform(0.1e-3, 1e-3) if params else 0.0))
    return specs


def search(specs, **kwargs):
    return search_layers(layers=specs, batch=8, world_size=4, link=LINK, micro_batches=2,
                         **kwargs)


def halfway_limit(found):
    """A limit between the leanest layout's memory and the fastest plan's."""
    lean = min(m for *_, m in found.candidates if m is not None)
    assert lean < found.memory_bytes
    return (lean + found.memory_bytes) / 2


@pytest.mark.parametrize("seed", range(5))
def test_equals_brute_force(seed):
    specs = random_chain(seed, 4)
    found = search(specs)
    assert found.step_s == pytest.approx(brute_force(specs, 4, 8, 2, None)[0], rel=1e-9)
    # With the exchange's cost beyond the link and a pipeline action's as plan() prices them.
    terms = dict(exchange_s_per_byte=2e-9, pipeline_action_s=0.3e-3)
    found = search(specs, **terms)
    assert found.step_s == pytest.approx(brute_force(specs, 4, 8, 2, None, **terms)[0],
                                         rel=1e-9)


def test_the_optimizer_step_the_exchange_and_the_pipeline_actions():
    # Two layers of 4 and 12 MiB, 2 and 6 ms of compute, 1 and 3 ms of optimizer step.
    specs = [LayerSpec(str(i), "other", t, p, 1024, 1024, update_s=u)
             for i, (p, t, u) in enumerate(((4 * MB, 2e-3, 1e-3), (12 * MB, 6e-3, 3e-3)))]

    def step(layout, level=0, **terms):
        return search_layers(layers=specs, batch=8, link=LINK, layouts=[layout],
                             zero_levels=(level,), micro_batches=2, **terms)

    # One rank: the compute, then the optimizer's step on every parameter.
    assert step((1, 1, 1)).step_s == pytest.approx(8e-3 + 4e-3)
    # dp=2 replicated: half the compute, the allreduce of 16 MiB, each rank steps on all of
    # it; the exchange adds its cost per gradient byte.
    allreduce = LINK.latency_s + 16 * MB / LINK.bus_bytes_per_s
    assert step((1, 2, 1)).step_s == pytest.approx(4e-3 + allreduce + 4e-3)
    assert step((1, 2, 1), exchange_s_per_byte=1e-9).step_s == pytest.approx(
        4e-3 + allreduce + 16 * MB * 1e-9 + 4e-3)
    # ZeRO-1 over dp=2: each rank steps on its half of the optimizer state; no exchange term
    # (it is replicated data parallel's).
    gather = LINK.latency_s / 2 + 16 * MB / 2 / LINK.bus_bytes_per_s
    assert step((1, 2, 1), 1, exchange_s_per_byte=1e-9).step_s == pytest.approx(
        4e-3 + 2 * gather + 4e-3 / 2)
    # Two stages, 2 micro-batches: 3 slots of the dearer (last: it sends nothing on) stage's
    # 3 ms a micro-batch, then its update; with an action's cost, a forward and a backward
    # a slot more.
    pipelined = 3 * 6e-3 / 2 + 3e-3
    assert step((2, 1, 1)).step_s == pytest.approx(pipelined)
    assert step((2, 1, 1), pipeline_action_s=0.5e-3).step_s == pytest.approx(
        pipelined + 3 * 2 * 0.5e-3)
    assert step((1, 1, 1), pipeline_action_s=0.5e-3).step_s == pytest.approx(12e-3)


@pytest.mark.parametrize("seed", range(3))
def test_memory_limit_against_brute_force(seed):
    # Layers whose styles do not trade memory for time: the limit decides the layout, the
    # ZeRO level and the cuts, which the search covers exactly.
    specs = random_chain(seed, 5, kinds=("other", "elementwise", "other"))
    limit = halfway_limit(search(specs))
    expected = brute_force(specs, 4, 8, 2, limit)
    found = search(specs, memory_limit=limit)
    assert found.memory_bytes <= limit
    assert found.step_s == pytest.approx(expected[0], rel=1e-9)
    assert (found.pp, found.dp, found.tp, found.zero_level) == expected[2]
    # With every kind of layer the styles trade too: within a stage the search takes the
    # fastest styles when they fit, else the leanest, so it may miss the optimum (never by
    # claiming a plan over the limit or one faster than the optimum).
    specs = random_chain(seed, 4)
    limit = halfway_limit(search(specs))
    found = search(specs, memory_limit=limit)
    assert found.memory_bytes <= limit
    assert found.step_s >= brute_force(specs, 4, 8, 2, limit)[0] * (1 - 1e-9)


def test_a_calibration_gives_the_profiles_the_link_and_the_terms():
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(),
                                torch.nn.Linear(256, 64))
    sample = torch.zeros(8, 64)
    profiles = [LayerProfile(str(i), f, b, a, p, i != 1, update_s=u) for i, (f, b, a, p, u) in
                enumerate(((1e-3, 2e-3, 8192, 66560, 4e-4), (1e-4, 1e-4, 8192, 0, 0.0),
                           (1e-3, 2e-3, 2048, 65792, 4e-4)))]
    calibration = Calibration(layers=profiles, links={"inside": LINK}, world_size=4, batch=8,
                              conditions={"exchange_s_per_byte": 3e-9,
                                          "pipeline_action_s": 2e-4})
    found = search_layers(model, sample, 4, calibration=calibration)
    specs = describe_layers(model, sample, profiles=profiles)
    assert [s.update_s for s in specs] == [4e-4, 0.0, 4e-4]
    expected = search_layers(layers=specs, batch=8, world_size=4, link=LINK,
                             exchange_s_per_byte=3e-9, pipeline_action_s=2e-4)
    assert (found.shape, found.zero_level) == (expected.shape, expected.zero_level)
    assert found.step_s == pytest.approx(expected.step_s, rel=1e-12)
    # Given terms win over the calibration's.
    plain = search_layers(model, sample, 4, calibration=calibration, exchange_s_per_byte=0.0,
                          pipeline_action_s=0.0)
    assert plain.step_s == pytest.approx(
        search_layers(layers=specs, batch=8, world_size=4, link=LINK).step_s, rel=1e-12)


@pytest.mark.parametrize("seed", range(3))
def test_each_hand_off_takes_the_point_to_point_link_of_its_boundary(seed):
    """A calibration's point-to-point links (send_inside, send_between) price the pipeline's
    hand-offs, each boundary its own: on 2 hosts of 2 ranks pp=4's second hand-off crosses the
    hosts and its first and third do not. The search equals brute force over every cut with
    those links, and differs from pricing every hand-off on the pp dimension's link."""
    specs = random_chain(seed, 5)
    fast = LinkProfile(latency_s=5e-6, bus_bytes_per_s=5e9)
    slow = LinkProfile(latency_s=200e-6, bus_bytes_per_s=0.05e9)
    links = {"inside": LINK, "between": slow, "send_inside": fast, "send_between": slow}
    calibration = Calibration(layers=[], links=links, world_size=4, batch=8, slots_per_host=2)
    plan = lambda layouts=None, **given: search_layers(
        layers=specs, batch=8, world_size=4, layouts=layouts, micro_batches=2,
        calibration=calibration, **given)
    by_boundary = lambda pp, dp, tp: links_by_dimension(LINK, slow, 2, pp, dp, tp,
                                                        sends=(fast, slow))
    assert plan().step_s == pytest.approx(
        brute_force(specs, 4, 8, 2, None, links_for=by_boundary)[0], rel=1e-9)
    # Links given in the call replace the calibration's, its point-to-point ones too.
    on_pp = lambda pp, dp, tp: links_by_dimension(LINK, slow, 2, pp, dp, tp)
    assert plan(link=LINK, inter_host_link=slow).step_s == pytest.approx(
        brute_force(specs, 4, 8, 2, None, links_for=on_pp)[0], rel=1e-9)
    assert plan([(4, 1, 1)]).step_s < plan([(4, 1, 1)], link=LINK, inter_host_link=slow).step_s


def mlp(tp_link=LINK):
    """Linear(1024, 4096), GELU, Linear(4096, 1024) on 1 MiB of input."""
    return [LayerSpec("0", "linear", 8e-3, 16 * MB, 1 * MB, 4 * MB, colwise_size=4096,
                      rowwise_size=1024),
            LayerSpec("1", "elementwise", 0.4e-3, 0, 4 * MB, 4 * MB),
            LayerSpec("2", "linear", 8e-3, 16 * MB, 4 * MB, 1 * MB, colwise_size=1024,
                      rowwise_size=4096)]


def test_megatron_pair_for_an_mlp():
    found = search_layers(layers=mlp(), batch=8, link=LINK, layouts=[(1, 1, 2)])
    assert [(c.style, c.input_layout, c.output_layout) for c in found.layers] == [
        ("colwise", "R", "LAST"), ("replicate", "LAST", "LAST"), ("rowwise", "LAST", "R")]
    # Half the compute each; one allreduce of the 1 MiB input's gradient (the column
    # layer's backward) and one of the 1 MiB output (the row layer's forward).
    allreduce = LINK.latency_s + 2 * (2 - 1) / 2 * MB / LINK.bus_bytes_per_s
    assert found.step_s == pytest.approx((8e-3 + 0.4e-3 + 8e-3) / 2 + 2 * allreduce)
    # Half the parameters with their gradients and Adam's state, the activations kept.
    assert found.memory_bytes == 4 * 16 * MB + (4 * MB / 2 + 4 * MB / 2 + 1 * MB)
    plan = found.parallelize_plan()
    assert sorted(plan) == ["0", "2"] and not plan["0"].use_local_output
    assert type(plan["0"]).__name__ == "ColwiseParallel"
    assert type(plan["2"]).__name__ == "RowwiseParallel"
    # On four ranks the whole search still picks the pair, over tp=4.
    assert search_layers(layers=mlp(), batch=8, world_size=4, link=LINK).shape == (1, 1, 4)


def other_layers(parameter_bytes, times):
    return [LayerSpec(str(i), "other", t, p, 1024, 1024)
            for i, (p, t) in enumerate(zip(parameter_bytes, times))]


def test_memory_limit_forces_fully_shard():
    # 100 MiB and 10 MiB of parameters on 2 ranks, Adam: replicated 4 x 110 MiB per rank,
    # ZeRO-1 2 x 110 + 2 x 110 / 2 = 330 MiB, one layer per stage 400 MiB, fully_shard
    # 4 x 110 / 2 + 100 (the largest layer, gathered) = 320 MiB. Under 325 MiB only
    # fully_shard fits; without a limit it is not picked (it sends 3x, the others 2x).
    specs = other_layers([100 * MB, 10 * MB], [3e-3, 3e-3])
    free = search_layers(layers=specs, batch=8, world_size=2, link=LINK)
    assert not free.fsdp and free.memory_bytes > 325 * MB
    found = search_layers(layers=specs, batch=8, world_size=2, link=LINK,
                          memory_limit=325 * MB)
    assert (found.shape, found.zero_level, found.fsdp) == ((1, 2, 1), 3, True)
    params = 110 * MB
    assert found.memory_bytes == int(4 * params / 2 + 100 * MB + 2 * 1024 / 2)
    gather = LINK.latency_s / 2 + params / 2 / LINK.bus_bytes_per_s
    assert found.step_s == pytest.approx(6e-3 / 2 + 3 * gather)
    with pytest.raises(ValueError, match="no plan fits memory_limit"):
        search_layers(layers=specs, batch=8, world_size=2, link=LINK, memory_limit=300 * MB)


def test_memory_limit_moves_the_pipeline_cut():
    # Four layers of 50 MiB, times 1, 1, 1, 3 ms, two stages: the balanced cut (3 | 3 ms)
    # holds 150 MiB x 4 on the first stage; under 420 MiB only two layers a stage fit, so
    # the cut moves to 2 | 4 ms: 2 micro-batches, 3 slots of the second stage's 2 ms.
    specs = other_layers([50 * MB] * 4, [1e-3, 1e-3, 1e-3, 3e-3])
    free = search_layers(layers=specs, batch=8, link=LINK, layouts=[(2, 1, 1)],
                         micro_batches=2)
    assert free.stages == [(0, 3), (3, 4)] and free.balance == [3, 1]
    found = search_layers(layers=specs, batch=8, link=LINK, layouts=[(2, 1, 1)],
                          micro_batches=2, memory_limit=420 * MB)
    assert found.stages == [(0, 2), (2, 4)] and found.balance == [2, 2]
    assert found.step_s == pytest.approx(3 * 4e-3 / 2)
    assert found.memory_bytes == 4 * 100 * MB + 2 * 1024
    assert [c.stage for c in found.layers] == [0, 0, 1, 1]
    parts = found.split(torch.nn.Sequential(*[torch.nn.Linear(2, 2) for _ in range(4)]))
    assert [len(p) for p in parts] == [2, 2]


def test_bad_input():
    specs = mlp()
    with pytest.raises(ValueError, match="no link given"):
        search_layers(layers=specs, batch=8, world_size=2)
    with pytest.raises(ValueError, match="kind must be one of"):
        search_layers(layers=[LayerSpec("0", "conv", 1e-3, 0, 8, 8)], batch=8, world_size=2,
                      link=LINK)
    with pytest.raises(ValueError, match="batch must be a positive int"):
        search_layers(layers=specs, world_size=2, link=LINK)
    with pytest.raises(ValueError, match=r"layouts must be \(pp, dp, tp\)"):
        search_layers(layers=specs, batch=8, layouts=[(2, 1)], link=LINK)
    with pytest.raises(ValueError, match=r"layouts \[\(1, 1, 2\)\] do not have world_size=4"):
        search_layers(layers=specs, batch=8, world_size=4, layouts=[(1, 1, 2)], link=LINK)
    with pytest.raises(ValueError, match="torch.nn.Sequential"):
        search_layers(torch.nn.Linear(2, 2), torch.zeros(4, 2), 2, link=LINK)


def test_plans_applied_on_two_ranks():
    result = launch(2, "planner_search_worker.py", timeout=300)
    assert_all_ranks(result, 2, "search plans OK")
