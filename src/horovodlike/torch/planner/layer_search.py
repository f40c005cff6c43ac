"""The dynamic programme behind ``search_layers``: for one (pp, dp, tp) layout, a ZeRO level
and a micro-batch count, the tensor-parallel style of every layer and the pipeline cuts that
minimise the predicted step time, each stage within the memory limit.

A stage of layers j..i-1 entered in layout e and left in layout s costs
    (m + pp - 1) x (T / m + send + 2a) + sync(P) + U
(the planner's pipeline: m micro-batches take m + pp - 1 slots of a stage's per-micro-batch
time T/m plus its boundary send forward and back (over its own boundary's link: the send
depends on the stage's number) and, with a pipeline, a pipeline action's own cost a for its
forward and its backward; then the stage's gradients are synchronised over dp as its ZeRO
level says, on P, its parameter bytes per rank, with the exchange's cost per byte beyond the
link for replicated data parallel; then the optimizer's step U on the parameters the rank
updates: its layers' update_s, over dp when ZeRO shards it), and the step is the cost of its
most expensive stage: cost_model.predict's terms. T, P and U add up over the stage's layers
(U is carried in T, at m / (m + pp - 1) of it) and sync is affine in P, so for every stage
start j the cheapest styles of j..i are one sweep over the layers with six
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
    exchange_s_per_byte: float = 0.0   # replicated dp's exchange beyond its link
    pipeline_action_s: float = 0.0     # a pipeline's forward or backward, beyond its compute

    @property
    def slots(self):
        return self.micro_batches + self.pp - 1

    def sync_s(self, parameter_bytes):
        """The stage's gradient (and for ZeRO, parameter) traffic over dp per step."""
        link, dp = self.links["dp"], self.dp
        if self.zero_level == 0:
            return link.allreduce_s(parameter_bytes, dp) + (
                self.exchange_s_per_byte * parameter_bytes if dp > 1 else 0.0)
        collectives = 2 if self.zero_level == 1 else 2 * self.micro_batches + 1
        return collectives * link.gather_s(parameter_bytes, dp)

    def state_bytes_per_parameter_byte(self):
        """Weights, gradients and optimizer state per parameter byte held by a rank."""
        f, dp = self.state_factor, self.dp
        return {0: 2 + f, 1: 2 + f / dp, 3: (2 + f) / dp}[self.zero_level]

    @property
    def update_share(self):
        """The part of its parameters' optimizer step a rank runs (ZeRO shards it over dp)."""
        return 1.0 if self.zero_level == 0 else 1.0 / self.dp

    @property
    def actions_s(self):
        """A stage's pipeline actions on its critical path: a forward and a backward a slot."""
        return self.slots * 2 * self.pipeline_action_s if self.pp > 1 else 0.0

    @property
    def in_flight(self):
        return min(self.pp, self.micro_batches) / self.micro_batches

    def memory_bytes(self, parameters, largest, kept):
        gathered = largest if self.zero_level == 3 else 0
        return parameters * self.state_bytes_per_parameter_byte() + gathered + \
            kept * self.in_flight

    def send_s(self, nbytes, boundary=0):
        """A boundary activation forward and its gradient back, per micro-batch: over the
        point-to-point link of hand-off ``boundary`` (0 after the first stage) where the links
        have them ("pp_sends", cost_model.links_by_dimension), else the pp dimension's."""
        hand_offs = self.links.get("pp_sends")
        link = hand_offs[boundary] if hand_offs else self.links["pp"]
        return 2 * link.send_s(nbytes / self.dp / self.micro_batches)


class _Affine:
    """sync_s as offset + slope x bytes for bytes > 0 (the link terms are affine)."""

    def __init__(self, setting):
        one, two = float(1 << 20), float(1 << 21)
        self.slope = (setting.sync_s(two) - setting.sync_s(one)) / one
        self.offset = setting.sync_s(one) - self.slope * one

    def __call__(self, parameter_bytes):
        return np.where(parameter_bytes > 0, self.offset + self.slope * parameter_bytes, 0.0)


class _Table:
    """One layer's options as 6 x 6 matrices (source state, target state) for one Setting:
    the option each pair takes (per pair the best does not depend on the path, the ranking
    being additive) and, stacked as FIELDS, its two ranking keys, time, parameters and kept
    activations."""

    FIELDS = ("cost", "memory", "time", "parameters", "kept")

    def __init__(self, options, setting, memory_first):
        source = np.array([o.source for o in options])
        target = np.array([o.target for o in options])
        # The optimizer's step, once a step, rides in the time at m / slots of it: a stage's
        # cost takes slots / m of its time.
        time = np.array([o.time_s + o.update_s * setting.update_share * setting.micro_batches
                         / setting.slots for o in options])
        parameters = np.array([o.parameter_bytes for o in options], dtype=float)
        kept = np.array([o.kept_bytes for o in options], dtype=float)
        cost = setting.slots / setting.micro_batches * time + _Affine(setting).slope * parameters
        memory = parameters * setting.state_bytes_per_parameter_byte() + \
            kept * setting.in_flight
        pair = source * STATES + target
        order = np.lexsort((cost, memory, pair) if memory_first else (memory, cost, pair))
        _, first = np.unique(pair[order], return_index=True)
        chosen = order[first]
        self.options = options
        self.index = np.full((STATES, STATES), -1)
        self.index[source[chosen], target[chosen]] = chosen
        self.values = np.full((len(self.FIELDS), STATES, STATES), INF)
        self.values[3:] = 0.0
        for row, column in enumerate((cost, memory, time, parameters, kept)):
            self.values[row, source[chosen], target[chosen]] = column[chosen]


class _Paths:
    """For every stage start j still considered and entry layout e, the best path to each
    state so far: _Table.FIELDS stacked in ``values`` (5, n, 3, 6) and its largest layer's
    parameters in ``largest`` (n, 3, 6); rows are stage starts, oldest first."""

    def __init__(self, memory_first, capacity):
        self.memory_first = memory_first
        self._values = np.zeros((len(_Table.FIELDS), capacity, 3, STATES))
        self._largest = np.zeros((capacity, 3, STATES))
        self.first = self.end = 0

    @property
    def values(self):
        return self._values[:, self.first:self.end]

    @property
    def largest(self):
        return self._largest[self.first:self.end]

    def start_here(self, entries=range(3)):
        row = self._values[:, self.end]
        row[:3], row[3:] = INF, 0.0
        row[:3, list(entries), list(entries)] = 0.0
        self._largest[self.end] = 0.0
        self.end += 1

    def drop(self, count):
        self.first += count

    def extend(self, table):
        """Runs one more layer; returns the chosen source state per (j, e, target)."""
        values = self.values
        cost = values[0, ..., None] + table.values[0]                # (n, 3, source, target)
        if self.memory_first:
            memory = values[1, ..., None] + table.values[1]
            least = memory.min(axis=2, keepdims=True)
            cost = np.where(memory <= least * (1 + 1e-12), cost, INF)
        source = np.argmin(cost, axis=2)                             # (n, 3, target)
        rows = np.arange(source.shape[0])[:, None, None]
        entries, target = np.arange(3)[None, :, None], np.arange(STATES)
        self._values[:, self.first:self.end] = values[:, rows, entries, source] + \
            table.values[:, source, target]
        self._largest[self.first:self.end] = np.maximum(
            self.largest[rows, entries, source], table.values[3, source, target])
        return source


def _stage_costs(paths, setting, sync, last):
    """(cost, memory) of stages ending at this layer, for every (j, e, exit state), without
    the hand-off after it (which depends on the stage's number: _cut adds it)."""
    cost = setting.slots * paths.values[2] / setting.micro_batches + \
        sync(paths.values[3]) + setting.actions_s
    memory = setting.memory_bytes(paths.values[3], paths.largest, paths.values[4])
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


def _rows_to_drop(paths, bound, limit):
    """How many of the oldest stage starts can go: a path only grows in cost and memory, so
    a start whose cheapest path already costs more than ``bound`` (a plan found before), or
    whose leanest path already needs more than ``limit``, never makes a better stage."""
    too_dear = paths[0].values[0].min(axis=(1, 2)) > bound
    dead = too_dear.copy()
    if limit is not None:
        dead |= paths[-1].values[1].min(axis=(1, 2)) > limit
    alive = np.flatnonzero(~dead)
    drop = len(dead) if alive.size == 0 else int(alive[0])
    return drop, bool(too_dear[:drop].any())


def _cut(best, back, cost, hand_offs, ranking, i, first_row, stages):
    """best[k, i + 1] for every stage count k: the last stage ends at layer i and starts at
    one of the rows of ``cost``, first_row onwards; stage k hands off over ``hand_offs[k - 1]``
    (per exit state)."""
    top, rows = min(stages, i + 1), cost.shape[0]
    cost = cost[None] + hand_offs[:top, None, None, :]                  # (k-1, j, e, exit)
    total = np.maximum(best[:top, first_row:first_row + rows, :, None], cost)
    merged = np.stack([total[..., :3], total[..., TAGGED:]], axis=-1)  # (.., layout, tagged)
    merged = np.moveaxis(merged, 3, 1).reshape(top, 3, -1)          # (k-1, layout, j e tag)
    flat = np.argmin(merged, axis=2)
    values = np.take_along_axis(merged, flat[..., None], axis=2)[..., 0]
    best[1:top + 1, i + 1] = values
    for k, layout in zip(*np.nonzero(np.isfinite(values))):
        j, entry, tagged = np.unravel_index(flat[k, layout], (rows, 3, 2))
        exit_state = layout + TAGGED * int(tagged)
        back[k + 1, i + 1, layout] = (int(j) + first_row, int(entry), exit_state,
                                      int(ranking[j, entry, exit_state]))


def cut_search(options, sends, setting, bound=INF):
    """The DP over (layer, stage count) for layers with ``options`` (Option lists) and
    ``sends`` (per layer, the hand-off after it at each boundary, per exit state). Returns
    (step cost, stages, bounded) with stages as [(first, end, entry layout, exit state,
    ranking)], or (inf, None, bounded). Stages costing more than ``bound`` are not considered;
    ``bounded`` says whether that left any out."""
    count, stages = len(options), setting.pp
    sync = _Affine(setting)
    rankings = (False,) if setting.memory_limit is None else (False, True)
    paths = [_Paths(first, count if stages > 1 else 1) for first in rankings]
    best = np.full((stages + 1, count + 1, 3), INF)
    best[0, 0, R] = 0.0
    back, first_row, bounded = {}, 0, False
    # The hand-off after stage k ending at each layer (of pp - 1): none after the last layer,
    # nor a pp-th one.
    hand_offs = np.zeros((count, stages, STATES))
    hand_offs[:-1, :stages - 1] = setting.slots * np.asarray(sends)[:-1, :stages - 1]
    for i in range(count):
        evaluated = []
        for path, memory_first in zip(paths, rankings):
            if i == 0 or stages > 1:
                path.start_here()
            path.extend(_Table(options[i], setting, memory_first))
            evaluated.append(_stage_costs(path, setting, sync, i == count - 1))
        cost, ranking = _best_stage(evaluated, setting.memory_limit)
        _cut(best, back, cost, hand_offs[i], ranking, i, first_row, stages)
        drop, by_bound = _rows_to_drop(paths, bound, setting.memory_limit)
        bounded |= by_bound
        if drop:
            for path in paths:
                path.drop(drop)
            first_row += drop
        if stages == 1 and first_row > 0:
            break   # the one start there is went over the bound or the limit
    if not np.isfinite(best[stages, count, R]):
        return INF, None, bounded
    found, end, layout = [], count, R
    for k in range(stages, 0, -1):
        j, entry, exit_state, ranking = back[k, end, layout]
        found.append((j, end, entry, exit_state, ranking))
        end, layout = j, entry
    return float(best[stages, count, R]), found[::-1], bounded


def stage_options(options, first, end, entry, exit_state, ranking, setting):
    """The Options the sweep chose for one stage: its run again from one start, backwards."""
    tables = [_Table(o, setting, bool(ranking)) for o in options[first:end]]
    path = _Paths(bool(ranking), 1)
    path.start_here((entry,))
    sources = [path.extend(table)[0, entry] for table in tables]
    chosen, state = [], exit_state
    for table, source in zip(tables[::-1], sources[::-1]):
        chosen.append(table.options[table.index[source[state], state]])
        state = source[state]
    if state != entry:
        raise AssertionError(f"stage {first}-{end - 1}: the path found starts in {state}, "
                             f"not {entry}")
    return chosen[::-1]
