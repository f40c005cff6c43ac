"""search_layers' plans applied on 2 ranks against one process.

tp: for layer times drawn at random (so that the search picks many different plans: Megatron
pairs, sequence parallel norms, gathers before replicated layers, ...), the model split with
the plan's parallelize_plan gives the single-process output and input gradient.
pp: the plan's cuts through split_sequential and PipelineStage give the single-process losses
and gradients.
"""

import copy
import dataclasses
import random

import torch

import horovodlike.torch as hvd
from horovodlike.torch.parallel import parallelize_module
from horovodlike.torch.pipelining import PipelineStage, ScheduleGPipe
from horovodlike.torch.planner import LinkProfile, describe_layers, search_layers
from common import check

torch.set_default_dtype(torch.float64)
BATCH, SEQUENCE, WIDTH = 4, 8, 16


def build_model():
    torch.manual_seed(7)
    return torch.nn.Sequential(
        torch.nn.Linear(WIDTH, 32), torch.nn.GELU(), torch.nn.Linear(32, WIDTH),
        torch.nn.LayerNorm(WIDTH), torch.nn.Linear(WIDTH, 32), torch.nn.ReLU(),
        torch.nn.Linear(32, WIDTH))


def sample():
    return torch.randn(BATCH, SEQUENCE, WIDTH, generator=torch.Generator().manual_seed(3))


def build_embedding_model():
    torch.manual_seed(8)
    return torch.nn.Sequential(
        torch.nn.Embedding(32, WIDTH), torch.nn.LayerNorm(WIDTH), torch.nn.Linear(WIDTH, 32),
        torch.nn.GELU(), torch.nn.Linear(32, WIDTH))


def token_ids():
    return torch.randint(0, 32, (BATCH, SEQUENCE), generator=torch.Generator().manual_seed(4))


def distinct_plans(model, x, tries=40):
    """The different tp=2 plans the search picks for random layer times and link latencies."""
    base = describe_layers(model, x, repeats=1)
    plans = {}
    for seed in range(tries):
        rng = random.Random(seed)
        specs = [dataclasses.replace(s, compute_s=10 ** rng.uniform(-7, -2), update_s=0.0)
                 for s in base]
        link = LinkProfile(latency_s=10 ** rng.uniform(-7, -4), bus_bytes_per_s=1e9)
        found = search_layers(layers=specs, batch=BATCH, link=link, layouts=[(1, 1, 2)])
        key = tuple((c.style, c.input_layout, c.output_layout) for c in found.layers)
        plans.setdefault(key, found)
    return list(plans.values())


def check_tensor_parallel(build, x):
    """Every distinct plan against one process: the output, and the input's gradient when
    the input is not token ids."""
    reference = build()
    x = x.requires_grad_(True) if x.is_floating_point() else x
    expected = reference(x)
    expected.square().sum().backward()
    plans = distinct_plans(reference, x.detach())
    for found in plans:
        mesh = found.process_mesh()
        model = parallelize_module(build(), mesh, found.parallelize_plan(), mesh_dim="tp")
        mine = x.detach().clone().requires_grad_(x.is_floating_point())
        out = model(mine)
        out.square().sum().backward()
        what = [f"{c.style}:{c.input_layout}>{c.output_layout}" for c in found.layers]
        check(torch.allclose(out, expected, rtol=1e-5, atol=1e-8),
              f"{what}: output differs by {(out - expected).abs().max().item():.3g}")
        if x.is_floating_point():
            check(torch.allclose(mine.grad, x.grad, rtol=1e-5, atol=1e-8),
                  f"{what}: input gradient differs by "
                  f"{(mine.grad - x.grad).abs().max().item():.3g}")
    return plans


def check_pipeline():
    model, reference = build_model(), build_model()
    x, target = sample(), torch.randn(BATCH, SEQUENCE, WIDTH)
    specs = describe_layers(model, x, repeats=1)
    # The last layer takes most of the time: the cut balances it against the rest.
    specs = [dataclasses.replace(s, compute_s=0.010 if i == 6 else 0.001, update_s=0.0)
             for i, s in enumerate(specs)]
    found = search_layers(layers=specs, batch=BATCH, layouts=[(2, 1, 1)], micro_batches=2,
                          link=LinkProfile(latency_s=1e-6, bus_bytes_per_s=1e9))
    check(found.stages == [(0, 6), (6, 7)], f"stages {found.stages}")
    rank = hvd.rank()
    stage = PipelineStage(found.split(model)[rank], rank, found.pp)
    schedule = ScheduleGPipe(stage, found.micro_batches, loss_fn=torch.nn.functional.mse_loss)
    losses = []
    if rank == 0:
        schedule.step(x)
    else:
        schedule.step(target=target, losses=losses)
    parts = [torch.nn.functional.mse_loss(reference(xm), tm)
             for xm, tm in zip(x.chunk(2), target.chunk(2))]
    (sum(parts) / len(parts)).backward()   # the schedule averages the micro-batches
    if rank == 1:
        got, want = torch.stack(losses), torch.stack(parts).detach()
        check(torch.allclose(got, want, rtol=1e-5), f"losses {got} against {want}")
    mine = dict(found.split(model)[rank].named_parameters())
    theirs = dict(found.split(reference)[rank].named_parameters())
    for name, parameter in mine.items():
        check(torch.allclose(parameter.grad, theirs[name].grad, rtol=1e-5, atol=1e-10),
              f"stage {rank} {name}: gradient differs")


hvd.init()
plans = check_tensor_parallel(build_model, sample())
styles = {c.style for found in plans for c in found.layers}
check(len(plans) >= 8 and styles == {"replicate", "colwise", "rowwise", "sequence"},
      f"{len(plans)} plans, styles {styles}")
embedding_plans = check_tensor_parallel(build_embedding_model, token_ids())
check({c.style for found in embedding_plans for c in found.layers[:1]} >=
      {"colwise", "rowwise"}, "the embedding was split both ways")
check_pipeline()
print(f"rank {hvd.rank()}: search plans OK ({len(plans)} + {len(embedding_plans)} "
      "tensor-parallel plans)", flush=True)
hvd.shutdown()
