"""What ``search_layers`` returns, and its translation into what the model-parallel APIs take:
a ``parallelize_plan`` for ``parallelize_module``, the stage sizes for ``split_sequential``,
the ``ProcessMesh`` of its layout."""

import dataclasses

from horovodlike.torch.parallel.layouts import Replicate, Shard
from horovodlike.torch.parallel.styles import (ColwiseParallel, PrepareModuleInput,
                                               RowwiseParallel, SequenceParallel)
from horovodlike.torch.pipelining.split import split_sequential
from horovodlike.torch.process_mesh import ProcessMesh

ZERO_NAMES = {0: "dp", 1: "zero1", 3: "fsdp"}


@dataclasses.dataclass
class LayerChoice:
    """One layer's part of the plan: its style, its stage, the layouts of its input and
    output ("R" replicated, "LAST" split on the last dimension, "SEQ" on the sequence)."""
    name: str
    kind: str
    style: str
    stage: int
    input_layout: str
    output_layout: str
    time_s: float = 0.0            # compute and tensor-parallel communication per step
    communication_s: float = 0.0


@dataclasses.dataclass
class LayerPlan:
    pp: int
    dp: int
    tp: int
    zero_level: int               # 0: DistributedOptimizer, 1: ZeroRedundancyOptimizer,
    #                               3: fully_shard
    micro_batches: int
    stages: list                  # [(first layer, last layer + 1)]
    layers: list                  # LayerChoice per layer
    step_s: float                 # predicted step time
    memory_bytes: int             # predicted memory per rank (the fullest stage's)
    stage_step_s: list
    stage_memory_bytes: list
    candidates: list              # (pp, dp, tp, zero level, step_s or None, memory or None)
    rejected: list                # ((pp, dp, tp), reason)
    sequence_dim: int = 1

    @property
    def shape(self):
        return (self.pp, self.dp, self.tp)

    @property
    def fsdp(self):
        return self.zero_level == 3

    @property
    def balance(self):
        """Layers per stage, as ``split_sequential(model, pp, balance)`` takes them."""
        return [end - first for first, end in self.stages]

    def split(self, model):
        """The model's stages (``split_sequential`` with this plan's cuts)."""
        return split_sequential(model, self.pp, self.balance)

    def process_mesh(self):
        """The layout's ProcessMesh((pp, dp, tp)) (collective: every rank calls it)."""
        inner = "tp" if self.tp > 1 else "dp"
        return ProcessMesh(self.shape, ("pp", "dp", "tp"), innermost=inner)

    def _layout(self, name):
        return {"R": Replicate(), "LAST": Shard(-1), "SEQ": Shard(self.sequence_dim)}[name]

    def parallelize_plan(self, prefix=""):
        """{module name: style} for ``parallelize_module(model, mesh, plan, mesh_dim="tp")``;
        names are the layers' (a Sequential's children: "0", "1", ...) after ``prefix``.
        Styles keep their output's layout on the tensor (``use_local_output=False``) so that
        the next styled module converts it as the plan expects. Empty when tp is 1."""
        if self.tp == 1:
            return {}
        plan = {}
        for layer in self.layers:
            source, target = self._layout(layer.input_layout), self._layout(layer.output_layout)
            if layer.kind == "embedding":
                source = Replicate()
            if layer.style == "colwise":
                style = ColwiseParallel(input_layouts=source, output_layouts=target,
                                        use_local_output=False)
            elif layer.style == "rowwise":
                style = RowwiseParallel(input_layouts=source, output_layouts=target,
                                        use_local_output=False)
            elif layer.style == "sequence":
                style = SequenceParallel(sequence_dim=self.sequence_dim)
            elif layer.kind != "elementwise" and layer.input_layout != "R":
                style = PrepareModuleInput(input_layouts=source,
                                           desired_input_layouts=Replicate())
            else:
                continue   # runs whole, on what arrives
            plan[prefix + layer.name] = style
        return plan

    @property
    def layout(self):
        return f"pp={self.pp} {ZERO_NAMES[self.zero_level]}={self.dp} tp={self.tp}"

    def table(self):
        lines = [f"layer plan: {self.layout}, {self.micro_batches} micro-batches, step "
                 f"{self.step_s * 1e3:.3f} ms, {self.memory_bytes / (1 << 20):.2f} MiB per rank",
                 f"{'layer':<16} {'kind':<12} {'style':<10} {'stage':>5} {'in':>5} {'out':>5} "
                 f"{'ms':>9}"]
        for c in self.layers:
            lines.append(f"{c.name:<16} {c.kind:<12} {c.style:<10} {c.stage:>5} "
                         f"{c.input_layout:>5} {c.output_layout:>5} {c.time_s * 1e3:>9.3f}")
        lines.append("layouts searched:")
        for pp, dp, tp, level, step, memory in sorted(
                self.candidates, key=lambda c: (c[4] is None, c[4] or 0.0)):
            label = f"pp={pp} {ZERO_NAMES[level]}={dp} tp={tp}"
            lines.append(f"  {label:<22} " + ("none faster than the plan chosen (that fits)"
                                               if step is None
                                               else f"{step * 1e3:9.3f} ms "
                                                    f"{memory / (1 << 20):10.2f} MiB"))
        for layout, reason in self.rejected:
            lines.append(f"  pp={layout[0]} dp={layout[1]} tp={layout[2]}: not possible: "
                         f"{reason}")
        return "\n".join(lines)
