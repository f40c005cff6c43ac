"""The dynamic programme behind ``search_layers``: for one (pp, dp, tp) layout, a ZeRO level
and a micro-batch count, the tensor-parallel style of every layer and the pipeline cuts that
minimise the predicted step time, each stage within the memory limit.

A stage of layers j..i-1 entered in layout e and left in layout s costs
    (m + pp - 1) x (T / m + send) + sync(P)
(the planner's pipeline: m micro-batches take m + pp - 1 slots of a stage's per-micro-batch
time T/m plus its boundary send forward and back; then the stage's gradients are synchronised
over dp as its ZeRO level says, on P, its parameter bytes per rank), and the step is the cost
of its most expensive stage. T and P add up over the stage's layers and sync is affine in P,
so for every stage start j the cheapest styles of j..i are one sweep over the layers with six
layout states (see layer_options.py); the cuts are a DP over (layer, stage count) taking, at
each end i, the best max(previous stages, this stage) over every start j: O(L^2 x pp x
options) for L layers, O(L x options) without a pipeline.

Memory per rank of a stage: parameters, gradients and optimizer state (sharded as the ZeRO
level says; fully_shard adds the largest layer's parameters, gathered while it computes) plus
the activations kept for backward. A stage whose cheapest styles exceed the limit takes the
styles that need the least memory instead (ties to the cheaper), or is not allowed.
"""

import dataclasses

import numpy as np

from horovodlike.torch.planner.layer_options import R, STATES, TAGGED

INF = float("inf")
ZERO_LEVELS = (0, 1, 3)   # replicated (DistributedOptimizer), ZeroRedundancyOptimizer, fully_shard


@dataclasses.dataclass
class Setting:
    """One point of the search: a layout, a ZeRO level, the micro-batches and the links."""
    pp: int
    dp: int
    tp: int
    zero_level: int
    micro_batches: int
    links: dict
    state_factor: float
    memory_limit: float = None

    @property
    def slots(self):
        return self.micro_batches + self.pp - 1

    def sync_s(self, parameter_bytes):
        """The stage's gradient (and for ZeRO, parameter) traffic over dp per step."""
        link, dp = self.links["dp"], self.dp
        if self.zero_level == 0:
            return link.allreduce_s(parameter_bytes, dp)
        collectives = 2 if self.zero_level == 1 else 2 * self.micro_batches + 1
        return collectives * link.gather_s(parameter_bytes, dp)

    def state_bytes_per_parameter_byte(self):
        """Weights, gradients and optimizer state per parameter byte held by a rank."""
        f, dp = self.state_factor, self.dp
        return {0: 2 + f, 1: 2 + f / dp, 3: (2 + f) / dp}[self.zero_level]

    @property
    def in_flight(self):
        return min(self.pp, self.micro_batches) / self.micro_batches

    def memory_bytes(self, parameters, largest, kept):
        gathered = largest if self.zero_level == 3 else 0
        return parameters * self.state_bytes_per_parameter_byte() + gathered + \
            kept * self.in_flight

    def send_s(self, nbytes):
        """A boundary activation forward and its gradient back, per micro-batch."""
        return 2 * self.links["pp"].send_s(nbytes / self.dp / self.micro_batches)


class _Affine:
    """sync_s as offset + slope x bytes for bytes > 0 (the link terms are affine)."""

    def __init__(self, setting):
        one, two = float(1 << 20), float(1 << 21)
        self.slope = (setting.sync_s(two) - setting.sync_s(one)) / one
        self.offset = setting.sync_s(one) - self.slope * one

    def __call__(self, parameter_bytes):
        return np.where(parameter_bytes > 0, self.offset + self.slope * parameter_bytes, 0.0)


class _Table:
    """One layer's options, padded to (target state, k): index -1 is an impossible option."""

    def __init__(self, options):
        per_target = [[i for i, o in enumerate(options) if o.target == t] for t in range(STATES)]
        width = max(1, max(len(p) for p in per_target))
        index = np.full((STATES, width), len(options))
        for target, found in enumerate(per_target):
            index[target, :len(found)] = found
        pad = lambda values, fill: np.append(np.array(values, dtype=float), fill)[index]
        self.options = options
        self.index = index
        self.source = np.append([o.source for o in options], 0)[index]
        self.time = pad([o.time_s for o in options], INF)
        self.parameters = pad([o.parameter_bytes for o in options], 0.0)
        self.kept = pad([o.kept_bytes for o in options], 0.0)


class _Paths:
    """For every stage start j and entry layout e, the best path to each state so far:
    its time, parameters, largest layer's parameters and kept activations, (n, 3, 6)."""

    def __init__(self):
        self.time = np.zeros((0, 3, STATES))
        self.parameters = np.zeros((0, 3, STATES))
        self.largest = np.zeros((0, 3, STATES))
        self.kept = np.zeros((0, 3, STATES))

    def start_here(self):
        row = np.full((1, 3, STATES), INF)
        row[0, range(3), range(3)] = 0.0
        zero = np.zeros((1, 3, STATES))
        self.time = np.concatenate([self.time, row])
        self.parameters = np.concatenate([self.parameters, zero])
        self.largest = np.concatenate([self.largest, zero])
        self.kept = np.concatenate([self.kept, zero])

    def extend(self, table, key):
        """Runs one more layer; ``key(time, parameters, kept)`` ranks the candidates. Returns
        the chosen column (into table.index) for every (j, e, target)."""
        time = self.time[:, :, table.source] + table.time
        parameters = self.parameters[:, :, table.source] + table.parameters
        largest = np.maximum(self.largest[:, :, table.source], table.parameters)
        kept = self.kept[:, :, table.source] + table.kept
        choice = np.argmin(key(time, parameters, kept), axis=3)[..., None]
        pick = lambda values: np.take_along_axis(values, choice, axis=3)[..., 0]
        self.time, self.parameters = pick(time), pick(parameters)
        self.largest, self.kept = pick(largest), pick(kept)
        return choice[..., 0]


def _keys(setting, sync):
    """The two rankings of a stage's paths: step cost, and memory (ties to step cost)."""
    weight = setting.slots / setting.micro_batches
    by_cost = lambda time, parameters, kept: weight * time + sync.slope * parameters
    per_byte = setting.state_bytes_per_parameter_byte()

    def by_memory(time, parameters, kept):
        memory = np.where(np.isfinite(time),
                          parameters * per_byte + kept * setting.in_flight, INF)
        least = memory.min(axis=3, keepdims=True)
        return np.where(memory <= least * (1 + 1e-12), by_cost(time, parameters, kept), INF)
    return by_cost, by_memory


def _stage_costs(paths, setting, sync, sends, last):
    """(cost, memory) of stages ending at this layer, for every (j, e, exit state)."""
    send = 0.0 if last else sends
    cost = setting.slots * (paths.time / setting.micro_batches + send) + sync(paths.parameters)
    memory = setting.memory_bytes(paths.parameters, paths.largest, paths.kept)
    if last:   # the model's output is whole
        cost = np.where(np.isin(np.arange(STATES), (R, R + TAGGED)), cost, INF)
    return cost, memory


def _best_stage(evaluated, limit):
    """The stage cost per (j, e, exit) and which ranking gave it (0: cost, 1: memory)."""
    (cost, memory), *rest = evaluated
    if limit is None:
        return cost, np.zeros(cost.shape, dtype=int)
    fits = np.where(memory <= limit, cost, INF)
    if not rest:
        return fits, np.zeros(cost.shape, dtype=int)
    cost2, memory2 = rest[0]
    fits2 = np.where(memory2 <= limit, cost2, INF)
    use2 = ~np.isfinite(fits) & np.isfinite(fits2)
    return np.where(use2, fits2, fits), use2.astype(int)


def cut_search(tables, sends, setting):
    """The DP over (layer, stage count). Returns (step cost, stages) with stages as
    [(first, end, entry layout, exit state, ranking)], or (inf, None)."""
    count, stages = len(tables), setting.pp
    sync = _Affine(setting)
    keys = _keys(setting, sync)[:1 if setting.memory_limit is None else 2]
    paths = [_Paths() for _ in keys]
    best = np.full((stages + 1, count + 1, 3), INF)
    best[0, 0, R] = 0.0
    back = {}
    for i, table in enumerate(tables):
        evaluated = []
        for path, key in zip(paths, keys):
            path.start_here()
            path.extend(table, key)
            evaluated.append(_stage_costs(path, setting, sync, sends[i], i == count - 1))
        cost, ranking = _best_stage(evaluated, setting.memory_limit)
        for k in range(1, min(stages, i + 1) + 1):
            total = np.maximum(best[k - 1, :i + 1, :, None], cost)      # (j, e, exit)
            for layout in range(3):
                pair = total[:, :, [layout, layout + TAGGED]]
                flat = int(np.argmin(pair))
                j, entry, tagged = np.unravel_index(flat, pair.shape)
                if pair.flat[flat] < best[k, i + 1, layout]:
                    best[k, i + 1, layout] = pair.flat[flat]
                    exit_state = layout + TAGGED * int(tagged)
                    back[k, i + 1, layout] = (int(j), int(entry), exit_state,
                                              int(ranking[j, entry, exit_state]))
    if not np.isfinite(best[stages, count, R]):
        return INF, None
    found, end, layout = [], count, R
    for k in range(stages, 0, -1):
        j, entry, exit_state, ranking = back[k, end, layout]
        found.append((j, end, entry, exit_state, ranking))
        end, layout = j, entry
    return float(best[stages, count, R]), found[::-1]


def stage_options(tables, first, end, entry, exit_state, ranking, setting):
    """The options the sweep chose for one stage: its run again from one start, backwards."""
    key = _keys(setting, _Affine(setting))[ranking]
    path = _Paths()
    path.start_here()
    path.time[0] = np.where(np.arange(3)[:, None] == entry, path.time[0], INF)
    choices = [path.extend(table, key)[0, entry] for table in tables[first:end]]
    chosen, state = [], exit_state
    for table, choice in zip(tables[first:end][::-1], choices[::-1]):
        option = table.options[table.index[state, choice[state]]]
        chosen.append(option)
        state = option.source
    if state != entry:
        raise AssertionError(f"stage {first}-{end - 1}: the path found starts in {state}, "
                             f"not {entry}")
    return chosen[::-1]
