"""The per-layer choices the layer search picks from: what a layer of a chain is
(``LayerSpec``), and for each tensor-parallel style it can take, the activation layout it
accepts and makes and what that costs (``Option``).

Between two layers an activation is replicated (R), split on its last dimension (LAST, what
ColwiseParallel makes) or split on its sequence dimension (SEQ, sequence parallelism); it is
also "tagged" when the style that made it kept its layout on the tensor
(``use_local_output=False``), which lets a SequenceParallel module that receives it convert it.
A state is a layout plus TAGGED when tagged: six states in all.

Costs per training step for one replica (the global batch / dp), forward and backward, over
the tensor-parallel set of ``tp`` ranks with the link's alpha-beta terms (``LinkProfile``):
- a split (R to a shard) is free forward and gathers the gradient backward; a gather (a shard
  to R) gathers forward; one shard to another gathers forward and backward;
- ColwiseParallel on a replicated input allreduces the input's gradient (Megatron's f), on a
  split input gathers it forward and reduce-scatters its gradient; its output is LAST for
  nothing, or R for a gather;
- RowwiseParallel allreduces its output forward (R, Megatron's g) or reduce-scatters it
  (SEQ, gathered backward); its input is converted to LAST first;
- SequenceParallel converts a tagged input to SEQ and allreduces its parameters' gradients;
- a module left out of the plan ("replicate") runs whole on every rank of the set: one with
  parameters needs R (converted by PrepareModuleInput), one without (an activation, dropout)
  runs on whatever layout arrives, on 1/tp of the work when that is split.
"""

import dataclasses

R, LAST, SEQ = 0, 1, 2
TAGGED = 3
STATES = 6
LAYOUT_NAMES = ("R", "LAST", "SEQ")
STYLES = ("replicate", "colwise", "rowwise", "sequence")
KINDS = ("linear", "embedding", "norm", "elementwise", "other")


@dataclasses.dataclass
class LayerSpec:
    """One layer of a chain, measured (or estimated) on the global batch in one process.

    ``kind``: "linear" (an ``nn.Linear``), "embedding", "norm" (parameters, position by
    position: LayerNorm, RMSNorm), "elementwise" (no parameters, element by element:
    activations, dropout) or "other" (runs whole). ``colwise_size``/``rowwise_size``: the sizes
    ColwiseParallel and RowwiseParallel split (out and in features; embedding dim and
    vocabulary), which tp must divide; ``sequence_size``: the length of the activations'
    sequence dimension (0 when they have none: sequence parallelism is then not offered);
    ``update_s``: the optimizer's step on the layer's parameters, once per training step
    (LayerProfile.update_s)."""
    name: str
    kind: str
    compute_s: float
    parameter_bytes: int
    input_bytes: int
    output_bytes: int
    colwise_size: int = 0
    rowwise_size: int = 0
    sequence_size: int = 0
    update_s: float = 0.0

    def check(self):
        if self.kind not in KINDS:
            raise ValueError(f"LayerSpec {self.name!r}: kind must be one of {KINDS}, got "
                             f"{self.kind!r}")
        for field in ("compute_s", "parameter_bytes", "input_bytes", "output_bytes",
                      "colwise_size", "rowwise_size", "sequence_size", "update_s"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"LayerSpec {self.name!r}: {field} must be a number >= 0, "
                                 f"got {value!r}")
        if self.kind == "elementwise" and self.parameter_bytes:
            raise ValueError(f"LayerSpec {self.name!r}: an elementwise layer has no "
                             f"parameters, got parameter_bytes={self.parameter_bytes}; use "
                             "kind='norm' or 'other'")


@dataclasses.dataclass(frozen=True)
class Option:
    """One way to run one layer: from state ``source`` to state ``target``."""
    style: str
    source: int
    target: int
    time_s: float          # compute + tensor-parallel communication per step
    communication_s: float
    parameter_bytes: float  # parameters held per rank (after tp)
    kept_bytes: float       # the output kept for backward per rank (whole replica batch)
    update_s: float = 0.0   # the optimizer's step on those parameters, once per step


class _Costs:
    """The tensor-parallel collectives on one replica's activations."""

    def __init__(self, link, tp, dp):
        self.link, self.tp, self.dp = link, tp, dp

    def gather(self, nbytes):
        return self.link.gather_s(nbytes / self.dp, self.tp)

    def allreduce(self, nbytes):
        return self.link.allreduce_s(nbytes / self.dp, self.tp)

    def convert(self, source, target, nbytes):
        if source == target:
            return 0.0
        if R in (source, target):
            return self.gather(nbytes)   # forward for a gather, backward for a split
        return 2 * self.gather(nbytes)


def _divides(size, tp):
    return size > 0 and size % tp == 0


def _sharded_styles(spec, layout, tagged, costs):
    """(style, target state, communication) of the styles that split this layer's work."""
    x, y, tp = spec.input_bytes, spec.output_bytes, costs.tp
    found = []
    sequence = _divides(spec.sequence_size, tp)
    if spec.kind in ("linear", "embedding"):
        if _divides(spec.colwise_size, tp) and (spec.kind == "linear" or layout == R):
            if spec.kind == "embedding":
                into = 0.0   # ids have no gradient
            else:
                into = costs.allreduce(x) if layout == R else 2 * costs.gather(x)
            found.append(("colwise", LAST + TAGGED, into))
            found.append(("colwise", R + TAGGED, into + costs.gather(y)))
        if _divides(spec.rowwise_size, tp) and (spec.kind == "linear" or layout == R):
            into = costs.convert(layout, LAST, x) if spec.kind == "linear" else 0.0
            found.append(("rowwise", R + TAGGED, into + costs.allreduce(y)))
            if sequence:
                found.append(("rowwise", SEQ + TAGGED, into + 2 * costs.gather(y)))
    if spec.kind in ("norm", "elementwise") and sequence and (layout == SEQ or tagged):
        gradients = costs.link.allreduce_s(spec.parameter_bytes, tp)
        found.append(("sequence", SEQ + TAGGED, costs.convert(layout, SEQ, x) + gradients))
    return found


def layer_options(spec, tp, dp, tp_link):
    """Every Option of ``spec`` with tp ranks splitting it and dp replicas of the batch."""
    per_replica = spec.compute_s / dp
    kept = spec.output_bytes / dp
    if tp == 1:
        return [Option("replicate", R, R, per_replica, 0.0, spec.parameter_bytes, kept,
                       spec.update_s)]
    costs = _Costs(tp_link, tp, dp)
    options = []
    for source in range(STATES):
        layout, tagged = source % TAGGED, source >= TAGGED
        if spec.kind == "elementwise":
            split = layout != R
            options.append(Option("replicate", source, layout, per_replica / (tp if split
                                                                              else 1),
                                  0.0, 0, kept / (tp if split else 1)))
        else:
            move = costs.convert(layout, R, spec.input_bytes)
            options.append(Option("replicate", source, R, per_replica + move, move,
                                  spec.parameter_bytes, kept))
        for style, target, communication in _sharded_styles(spec, layout, tagged, costs):
            whole = style == "sequence"   # its parameters stay whole on every rank
            options.append(Option(
                style, source, target, per_replica / tp + communication, communication,
                spec.parameter_bytes / (1 if whole else tp),
                kept / (1 if target % TAGGED == R else tp)))
    # The optimizer steps on the parameters each option leaves a rank.
    return [dataclasses.replace(o, update_s=spec.update_s * o.parameter_bytes /
                                spec.parameter_bytes) if spec.parameter_bytes else o
            for o in options]
