"""The models the planner's benchmarks train, as torch.nn.Sequential, dense or (given a
tensor-parallel process set) with Megatron's column/row Linears in the same places, and the
training loop that measures one layout's step time."""

import statistics
import time

import torch

MODELS = {
    # name: (description, global batch)
    "mlp": ("2 x (Linear(512, 2048), GELU, Linear(2048, 512))", 64),
    "transformer": ("2 pre-norm blocks (attention, MLP), d 256, 4 heads, sequence 32", 16),
    "bert-small": ("BERT-shaped: 4 pre-norm blocks (attention, MLP), d 384, 8 heads, "
                   "sequence 16", 8),
}


def _linear(kind, inputs, outputs, tp_set):
    if tp_set is None:
        return torch.nn.Linear(inputs, outputs)
    from horovodlike.torch.parallel import ColumnParallelLinear, RowParallelLinear
    layer = ColumnParallelLinear if kind == "column" else RowParallelLinear
    return layer(inputs, outputs, process_set=tp_set)


def _tp_size(tp_set):
    if tp_set is None:
        return 1
    from horovodlike.common.process_sets import set_ranks
    return len(set_ranks(tp_set))


class Attention(torch.nn.Module):
    """x + attention(norm(x)); the projection's outputs are laid out (head, q/k/v, feature) so
    that a column split keeps whole heads on each rank."""

    def __init__(self, d, heads, tp_set=None):
        super().__init__()
        self.heads, self.head_dim = heads // _tp_size(tp_set), d // heads
        self.norm = torch.nn.LayerNorm(d)
        self.qkv = _linear("column", d, 3 * d, tp_set)
        self.out = _linear("row", d, d, tp_set)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(self.norm(x)).view(b, s, self.heads, 3, self.head_dim).unbind(3)
        y = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return x + self.out(y.transpose(1, 2).reshape(b, s, self.heads * self.head_dim))


class FeedForward(torch.nn.Module):
    def __init__(self, d, hidden, tp_set=None):
        super().__init__()
        self.norm = torch.nn.LayerNorm(d)
        self.up = _linear("column", d, hidden, tp_set)
        self.down = _linear("row", hidden, d, tp_set)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


def transformer(layers, d, heads, tp_set=None):
    blocks = []
    for _ in range(layers):
        blocks += [Attention(d, heads, tp_set), FeedForward(d, 4 * d, tp_set)]
    return torch.nn.Sequential(*blocks)


def build_model(name, tp_set=None):
    """(model, sample input of the global batch) of ``name``, from one seed on every rank."""
    torch.manual_seed(0)
    batch = MODELS[name][1]
    if name == "mlp":
        layers = []
        for _ in range(2):
            layers += [_linear("column", 512, 2048, tp_set), torch.nn.GELU(),
                       _linear("row", 2048, 512, tp_set)]
        return torch.nn.Sequential(*layers), torch.randn(batch, 512)
    if name == "transformer":
        return transformer(2, 256, 4, tp_set), torch.randn(batch, 32, 256)
    return transformer(4, 384, 8, tp_set), torch.randn(batch, 16, 384)


def _train_step(model, optimizer, schedule, stage, x, target):
    optimizer.zero_grad()
    if schedule is None:
        torch.nn.functional.mse_loss(model(x), target).backward()
    elif stage.is_first:
        schedule.step(x)
    elif stage.is_last:
        schedule.step(target=target)
    else:
        schedule.step()
    optimizer.step()


class _NoParameters:
    """The optimizer of a stage without parameters."""

    def zero_grad(self):
        pass

    def step(self):
        pass


def build_layout(candidate, make_model, tag):
    """(model, optimizer, schedule, stage, mesh) of ``candidate``'s layout on this rank:
    ProcessMesh((pp, dp, tp)), the planner's stage split and micro-batches under Schedule1F1B,
    DistributedOptimizer over dp. ``make_model(tp_set)`` builds the whole model."""
    import horovodlike.torch as hvd
    from horovodlike.torch.pipelining import PipelineStage, Schedule1F1B, split_sequential
    pp, dp, tp = candidate.pp, candidate.dp, candidate.tp
    mesh = hvd.ProcessMesh((pp, dp, tp), ("pp", "dp", "tp"), innermost="tp")
    model = make_model(mesh.process_set("tp") if tp > 1 else None)
    schedule = stage = None
    if pp > 1:
        balance = [last - first for first, last in candidate.stages]
        model = split_sequential(model, pp, balance=balance)[mesh.coordinate("pp")]
        stage = PipelineStage(model, mesh.coordinate("pp"), pp,
                              process_set=mesh.process_set("pp"))
        schedule = Schedule1F1B(stage, candidate.micro_batches, torch.nn.functional.mse_loss)
    if not list(model.parameters()):   # a stage of an activation alone
        return model, _NoParameters(), schedule, stage, mesh
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=1e-3),
        named_parameters=[(f"{tag}.{n}", p) for n, p in model.named_parameters()],
        process_set=mesh.process_set("dp"),
        backward_passes_per_step=candidate.micro_batches if pp > 1 else 1)
    return model, optimizer, schedule, stage, mesh


def measure(candidate, make_model, x, target, steps, tag, on_step=None):
    """Trains ``candidate``'s layout for ``steps`` steps after 3 warm-up ones; returns every
    timed step's seconds (the slowest rank's). ``on_step()`` runs before the first timed step
    and after the last (to read byte counters)."""
    import horovodlike.torch as hvd
    # A fresh start for every layout: unnamed collectives (the tensor-parallel layers') are
    # numbered per process, and the stages of a pipelined layout make different numbers of
    # them, which the next layout's sets would otherwise inherit.
    hvd.shutdown()
    hvd.init()
    model, optimizer, schedule, stage, mesh = build_layout(candidate, make_model, tag)
    dp = candidate.dp
    coordinate = mesh.coordinate("dp")
    batch = x.shape[0]
    rows = slice(coordinate * batch // dp, (coordinate + 1) * batch // dp)
    times = []
    for step in range(steps + 3):
        hvd.barrier()
        if on_step and step == 3:
            on_step()
        start = time.perf_counter()
        _train_step(model, optimizer, schedule, stage, x[rows], target[rows])
        elapsed = max(hvd.allgather_object(time.perf_counter() - start, name=f"time.{tag}"))
        if step >= 3:
            times.append(elapsed)
    hvd.barrier()
    if on_step:
        on_step()
    return times


def median(values):
    return statistics.median(values)
