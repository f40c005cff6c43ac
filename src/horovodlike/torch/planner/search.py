"""``search_layers``: a per-layer parallel strategy for a chain of layers, by dynamic
programming: each layer's tensor-parallel style (replicate, colwise, rowwise, sequence), the
pipeline cuts and the ZeRO level, under a memory limit per rank.

    found = search_layers(model, sample_input, world_size=4, link=link, memory_limit=8 << 30)
    mesh = found.process_mesh()                                   # ProcessMesh((pp, dp, tp))
    model = parallelize_module(model, mesh, found.parallelize_plan(), mesh_dim="tp")
    stage = found.split(model)[mesh.coordinate("pp")]             # split_sequential's parts

Every (pp, dp, tp) layout of ``world_size`` ranks and every ZeRO level is searched (see
layer_search.py for the programme, layer_options.py for the styles and their costs) and the
fastest plan that fits is returned, with the others' predictions in ``candidates``.
"""

import dataclasses

import numpy as np
import torch

from horovodlike.common import basics
from horovodlike.common.objects import broadcast_object
from horovodlike.torch.planner.cost_model import factorisations, links_by_dimension
from horovodlike.torch.planner.layer_options import (LAYOUT_NAMES, R, STATES, TAGGED,
                                                     LayerSpec, layer_options)
from horovodlike.torch.planner.layer_search import (INF, ZERO_LEVELS, Setting, cut_search,
                                                    stage_options)
from horovodlike.torch.planner.plan_output import LayerChoice, LayerPlan
from horovodlike.torch.planner.links import measure_link
from horovodlike.torch.planner.profiling import profile_layers

MB = float(1 << 20)

_NORMS = tuple(getattr(torch.nn, name) for name in ("LayerNorm", "RMSNorm")
               if hasattr(torch.nn, name))
_ELEMENTWISE = (torch.nn.ReLU, torch.nn.GELU, torch.nn.SiLU, torch.nn.Tanh, torch.nn.Sigmoid,
                torch.nn.Dropout, torch.nn.Identity, torch.nn.LeakyReLU, torch.nn.ELU,
                torch.nn.Softplus, torch.nn.Mish, torch.nn.Hardswish)


def _kind_and_sizes(module):
    if isinstance(module, torch.nn.Linear):
        return "linear", module.out_features, module.in_features
    if isinstance(module, torch.nn.Embedding):
        return "embedding", module.embedding_dim, module.num_embeddings
    if isinstance(module, _NORMS):
        return "norm", 0, 0
    if isinstance(module, _ELEMENTWISE) and not any(True for _ in module.parameters()):
        return "elementwise", 0, 0
    return "other", 0, 0


def describe_layers(model, sample_input, sequence_dim=1, repeats=7, optimizer=None,
                    profiles=None):
    """A LayerSpec for every child of the ``torch.nn.Sequential`` ``model``, profiled on
    ``sample_input`` (the global batch) with ``profile_layers`` (``optimizer`` as there), or
    from ``profiles`` (a calibration's layers) when given."""
    if profiles is None:
        profiles = profile_layers(model, sample_input, repeats=repeats, optimizer=optimizer)
    specs, x = [], sample_input
    with torch.no_grad():
        for (name, module), profile in zip(model.named_children(), profiles):
            y = module(x)
            kind, colwise, rowwise = _kind_and_sizes(module)
            has_sequence = y.dim() >= 3 and sequence_dim % y.dim() != y.dim() - 1
            specs.append(LayerSpec(
                name=name, kind=kind, compute_s=profile.forward_s + profile.backward_s,
                parameter_bytes=profile.parameter_bytes,
                input_bytes=x.numel() * x.element_size(),
                output_bytes=y.numel() * y.element_size(), colwise_size=colwise,
                rowwise_size=rowwise,
                sequence_size=y.shape[sequence_dim] if has_sequence else 0,
                update_s=profile.update_s))
            x = y
    return specs


def _micro_batches(given, pp, per_replica):
    """As plan() picks them: one without a pipeline, else the most up to 4 per stage that
    divide a replica's batch."""
    if given:
        return given
    return 1 if pp == 1 else max(d for d in range(1, 4 * pp + 1) if per_replica % d == 0)


def _sends(specs, setting):
    """Per layer, the hand-off after it at each of the pipeline's boundaries, for each exit
    state: an array (layers, max(pp - 1, 1), states)."""
    return np.array([[[setting.send_s(spec.output_bytes /
                                      (1 if state % TAGGED == R else setting.tp), boundary)
                       for state in range(STATES)] for boundary in range(max(setting.pp - 1, 1))]
                     for spec in specs])


def evaluate(specs, options, stages, setting):
    """(step_s, memory_bytes, [(stage cost, stage memory)]) of a given plan: ``options`` one
    Option per layer, ``stages`` [(first, end)]. Checks that the layouts join up."""
    state, results = R, []
    for number, (first, end) in enumerate(stages):
        time = parameters = largest = kept = update = 0.0
        for i in range(first, end):
            option = options[i]
            if option.source != state:
                raise ValueError(f"layer {specs[i].name!r}: option {option} does not take "
                                 f"state {state}")
            time += option.time_s
            update += option.update_s
            parameters += option.parameter_bytes
            largest = max(largest, option.parameter_bytes)
            kept += option.kept_bytes
            state = option.target
        last = number == len(stages) - 1
        send = 0.0 if last else setting.send_s(
            specs[end - 1].output_bytes / (1 if state % TAGGED == R else setting.tp), number)
        cost = setting.slots * (time / setting.micro_batches + send) + \
            setting.sync_s(parameters) + update * setting.update_share + setting.actions_s
        results.append((cost, setting.memory_bytes(parameters, largest, kept)))
        state = state % TAGGED
    if state != R:
        raise ValueError("the last layer's output must be replicated")
    return max(c for c, _ in results), max(m for _, m in results), results


def _check_arguments(specs, world_size, batch, layouts):
    if not specs:
        raise ValueError("search_layers: no layers to plan")
    for spec in specs:
        if not isinstance(spec, LayerSpec):
            raise ValueError(f"search_layers: layers must be LayerSpec, got {spec!r}")
        spec.check()
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"search_layers: the batch must be a positive int, got {batch!r}")
    if layouts is None:
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ValueError("search_layers: world_size must be a positive int, got "
                             f"{world_size!r}")
        return factorisations(world_size)
    layouts = [tuple(layout) for layout in layouts]
    if any(len(l) != 3 or any(not isinstance(n, int) or n < 1 for n in l) for l in layouts):
        raise ValueError(f"search_layers: layouts must be (pp, dp, tp) triples of positive "
                         f"ints, got {layouts!r}")
    wrong = [l for l in layouts if world_size is not None and l[0] * l[1] * l[2] != world_size]
    if wrong:
        raise ValueError(f"search_layers: layouts {wrong} do not have world_size={world_size} "
                         "ranks; drop world_size or give layouts of that many ranks")
    return layouts


def _lower_bound(tables, setting):
    """No plan of ``setting`` costs less: its dearest stage costs at least 1/pp of every
    layer's cheapest option (transitions aside)."""
    weight = setting.slots / setting.micro_batches
    slope = (setting.sync_s(2.0 * MB) - setting.sync_s(1.0 * MB)) / MB
    return sum(min(weight * o.time_s + slope * o.parameter_bytes for o in options)
               for options in tables) / setting.pp


def _search_one(specs, setting, tables, bound):
    """The best plan of one Setting. With a pipeline, a first try considers only stages
    costing up to a guess a little above the lower bound: a plan found within the guess is
    the optimum (no stage of the optimum was left out), else the guess grows, up to
    ``bound`` (after six tries, ``bound`` itself). Most starts of a stage are then never
    swept."""
    sends = _sends(specs, setting)
    guesses = [_lower_bound(tables, setting) * 1.1 * 1.3 ** n for n in range(6)] \
        if setting.pp > 1 else []
    for guess in [g for g in guesses if g < bound] + [bound]:
        cost, stages, bounded = cut_search(tables, sends, setting, guess)
        if not bounded or (stages is not None and cost <= guess):
            break   # the guess left nothing out, or kept the optimum
    if stages is None:
        return None
    options = []
    for first, end, entry, exit_state, ranking in stages:
        options += stage_options(tables, first, end, entry, exit_state, ranking, setting)
    bounds = [(first, end) for first, end, *_ in stages]
    step, memory, per_stage = evaluate(specs, options, bounds, setting)
    return step, memory, per_stage, bounds, options


def _layouts_and_settings(specs, layouts, batch, links_for, options):
    """Every Setting to search, and (layout, reason) for the layouts that cannot run."""
    settings, rejected = [], []
    for pp, dp, tp in layouts:
        if pp > len(specs):
            rejected.append(((pp, dp, tp), f"{pp} stages for {len(specs)} layers"))
            continue
        if batch % dp:
            rejected.append(((pp, dp, tp), f"batch {batch} does not split over dp={dp}"))
            continue
        m = _micro_batches(options["micro_batches"], pp, batch // dp)
        for level in (options["zero_levels"] if dp > 1 else (0,)):
            settings.append(Setting(pp, dp, tp, level, m, links_for(pp, dp, tp),
                                    options["optimizer_state_factor"],
                                    options["memory_limit"], **options["terms"]))
    return settings, rejected


def search_layers(model=None, sample_input=None, world_size=None, *, layers=None, batch=None,
                  link=None, inter_host_link=None, slots_per_host=None, layouts=None,
                  zero_levels=ZERO_LEVELS, micro_batches=None, optimizer_state_factor=2,
                  memory_limit=None, sequence_dim=1, calibration=None,
                  exchange_s_per_byte=None, pipeline_action_s=None, optimizer=None,
                  verbose=False):
    """The fastest per-layer plan for ``model`` (a ``torch.nn.Sequential``, profiled on
    ``sample_input``, the global batch) or for ``layers`` (LayerSpecs, with ``batch``) on
    ``world_size`` ranks, or on the ``layouts`` given as (pp, dp, tp) triples.

    ``link``: a LinkProfile (measured when None inside a job of two or more ranks);
    ``inter_host_link`` and ``slots_per_host`` as in plan(). ``zero_levels``: which of 0
    (replicated, DistributedOptimizer), 1 (optimizer state sharded, ZeroRedundancyOptimizer)
    and 3 (fully_shard) to consider for dp > 1. ``memory_limit``: bytes per rank; a plan
    over it is never returned. ``sequence_dim``: the activations' sequence dimension.
    ``calibration``: a Calibration (hvd.calibrate's, or the path of one) whose layer
    profiles, links and measured terms are used for what is not given (its point-to-point
    links price the pipeline's hand-offs, each boundary its own, unless links are given).
    ``exchange_s_per_byte`` and ``pipeline_action_s``: as plan() prices them (replicated data
    parallel's exchange beyond its link per gradient byte; a pipeline's forward or backward
    beyond its compute); 0 without a calibration.
    ``optimizer``: the training's optimizer (a function of a list of parameters), whose step
    the profile times per layer (plain SGD when None); LayerSpec.update_s when ``layers``.
    Returns a LayerPlan; raises ValueError when no plan fits.
    """
    if isinstance(calibration, str):
        from horovodlike.torch.planner.calibration import Calibration
        calibration = Calibration.load(calibration)
    conditions = calibration.conditions if calibration is not None else {}
    sends = (calibration.hand_off_links(link, inter_host_link) if calibration is not None
             else (None, None))
    if calibration is not None:
        link = link or calibration.links.get("inside")
        inter_host_link = inter_host_link or calibration.links.get("between")
        slots_per_host = slots_per_host or calibration.slots_per_host
    terms = dict(
        exchange_s_per_byte=float(exchange_s_per_byte if exchange_s_per_byte is not None
                                  else conditions.get("exchange_s_per_byte") or 0.0),
        pipeline_action_s=float(pipeline_action_s if pipeline_action_s is not None
                                else conditions.get("pipeline_action_s") or 0.0))
    if layers is None:
        if not isinstance(sample_input, torch.Tensor) or sample_input.dim() == 0:
            raise ValueError("search_layers: pass a model and a sample_input tensor whose "
                             "first dimension is the global batch, or layers= and batch=")
        layers = describe_layers(model, sample_input, sequence_dim, optimizer=optimizer,
                                 profiles=calibration.layers if calibration else None)
        batch = sample_input.shape[0] if batch is None else batch
    in_job = basics.is_initialized() and basics.size() > 1
    if in_job:   # every rank plans with rank 0's measurements, so that all agree
        layers = broadcast_object(layers, root_rank=0, name="search_layers.layers")
    specs = list(layers)
    layouts = _check_arguments(specs, world_size, batch, layouts)
    if link is None:
        if not in_job:
            raise ValueError("search_layers: no link given and not inside a job of two or "
                             "more ranks to measure one; pass link=LinkProfile(...)")
        link = measure_link()
    links_for = lambda pp, dp, tp: links_by_dimension(link, inter_host_link or link,
                                                      slots_per_host, pp, dp, tp, sends=sends)
    settings, rejected = _layouts_and_settings(specs, layouts, batch, links_for, dict(
        micro_batches=micro_batches, zero_levels=zero_levels, memory_limit=memory_limit,
        optimizer_state_factor=optimizer_state_factor, terms=terms))
    tables, candidates, best = {}, [], None
    # Layouts without a pipeline are searched first (in O(layers)): the best plan so far
    # bounds the stages the pipelined searches consider.
    for setting in sorted(settings, key=lambda s: s.pp):
        key = (setting.dp, setting.tp, id(setting.links["tp"]))
        if key not in tables:
            tables[key] = [layer_options(spec, setting.tp, setting.dp, setting.links["tp"])
                           for spec in specs]
        found = _search_one(specs, setting, tables[key], INF if best is None else best[1][0])
        candidates.append((setting, None if found is None else found[:2]))
        if found is not None and (best is None or found[:2] < best[1][:2]):
            best = (setting, found)
    if best is None:
        raise ValueError(f"search_layers: no plan fits memory_limit={memory_limit} bytes per "
                         f"rank on layouts {layouts} (impossible: {rejected}); raise the "
                         "limit, add ranks or allow more ZeRO levels")
    result = _plan(specs, best, candidates, rejected, sequence_dim)
    if verbose and (not in_job or basics.rank() == 0):
        print(result.table(), flush=True)
    return result


def _plan(specs, best, candidates, rejected, sequence_dim):
    setting, (step, memory, per_stage, bounds, options) = best
    stage_of = [n for n, (first, end) in enumerate(bounds) for _ in range(first, end)]
    choices = [LayerChoice(name=spec.name, kind=spec.kind, style=option.style, stage=stage,
                           input_layout=LAYOUT_NAMES[option.source % TAGGED],
                           output_layout=LAYOUT_NAMES[option.target % TAGGED],
                           time_s=option.time_s, communication_s=option.communication_s)
               for spec, option, stage in zip(specs, options, stage_of)]
    return LayerPlan(pp=setting.pp, dp=setting.dp, tp=setting.tp,
                     zero_level=setting.zero_level, micro_batches=setting.micro_batches,
                     stages=bounds, layers=choices, step_s=step, memory_bytes=int(memory),
                     stage_step_s=[c for c, _ in per_stage],
                     stage_memory_bytes=[int(m) for _, m in per_stage],
                     candidates=[(s.pp, s.dp, s.tp, s.zero_level, None if f is None else f[0],
                                  None if f is None else int(f[1])) for s, f in candidates],
                     rejected=rejected, sequence_dim=sequence_dim)


__all__ = ["search_layers", "describe_layers", "evaluate", "LayerSpec", "LayerPlan",
           "LayerChoice", "INF"]
