"""Pipelined training against a single-process replay of the same steps.

Usage: pipeline_worker.py MODE [args]
  train SCHEDULE:STAGES_PER_RANK...  pipeline over every rank; weights and losses after 3 steps
  ppdp SCHEDULE[:STAGES_PER_RANK]... 4 ranks, ProcessMesh (pp=2, dp=2): a pipeline x 2 replicas
  raise                            stage 1 raises mid-step: every rank raises
  kill REPORT_DIR                  rank 1 is killed mid-step: the others raise within seconds
"""

import os
import signal
import sys

import torch

import horovodlike.torch as hvd
from horovodlike.torch.pipelining import (PipelineStage, Schedule1F1B, ScheduleGPipe,
                                          ScheduleInterleaved1F1B, split_sequential)
from common import check, kill_self, seconds_since_kill

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B,
             "interleaved": ScheduleInterleaved1F1B}
# Each stage changes the width, so the activations differ in shape between stages.
WIDTHS = [6, 10, 7, 12, 5, 9, 8, 11, 4]
STEPS = 3
BATCH = 16
N_MICROBATCHES = 4
torch.set_default_dtype(torch.float64)


def build_model(num_stages):
    torch.manual_seed(1234)
    blocks = [torch.nn.Sequential(torch.nn.Linear(WIDTHS[i], WIDTHS[i + 1]), torch.nn.Tanh())
              for i in range(num_stages - 1)]
    blocks.append(torch.nn.Sequential(torch.nn.Linear(WIDTHS[num_stages - 1], 3)))
    return torch.nn.Sequential(*blocks)


def batch(step, rows=BATCH):
    generator = torch.Generator().manual_seed(100 + step)
    return torch.randn(rows, WIDTHS[0], generator=generator), \
        torch.randn(rows, 3, generator=generator)


def make_optimizer(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def reference_run(num_stages, n_microbatches):
    """One process, whole batch, loss = mean of the micro-batch losses: the weights and losses."""
    model = build_model(num_stages)
    optimizer = make_optimizer(model.parameters())
    losses = []
    for step in range(STEPS):
        x, y = batch(step)
        optimizer.zero_grad()
        parts = [torch.nn.functional.mse_loss(model(xm), ym)
                 for xm, ym in zip(torch.tensor_split(x, n_microbatches),
                                   torch.tensor_split(y, n_microbatches))]
        loss = sum(parts) / n_microbatches
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return model, losses


def run_pipeline(schedule, stage_modules, optimizer, num_stages, x_rows=None, steps=STEPS):
    first, last = 0 in schedule.stages, num_stages - 1 in schedule.stages
    step_losses = []
    for step in range(steps):
        x, y = batch(step)
        if x_rows is not None:
            x, y = x[x_rows], y[x_rows]
        optimizer.zero_grad()
        losses = []
        if first and last:
            schedule.step(x, target=y, losses=losses)
        elif first:
            schedule.step(x)
        elif last:
            out = schedule.step(target=y, losses=losses)
            check(tuple(out.shape) == tuple(y.shape), f"output shape {tuple(out.shape)}")
        else:
            schedule.step()
        optimizer.step()
        if last:
            check(len(losses) == schedule.n_microbatches, f"{len(losses)} losses")
            step_losses.append(float(sum(losses) / len(losses)))
    return step_losses


def compare(reference, stage_index, module, what):
    expected = list(split_sequential(reference, len(reference))[stage_index].named_parameters())
    got = list(module.named_parameters())
    check(len(got) == len(expected), f"{what}: stage {stage_index} has {len(got)} parameters")
    for (name, p), (_, q) in zip(got, expected):
        check(torch.allclose(p, q, rtol=1e-5, atol=1e-8),
              f"{what}: stage {stage_index} {name} differs by {(p - q).abs().max().item():.3g}")


def train(schedule_name, stages_per_rank):
    hvd_size = hvd.size()
    num_stages = hvd_size * stages_per_rank
    model = build_model(num_stages)
    parts = split_sequential(model, num_stages)
    mine = [i for i in range(num_stages) if i % hvd_size == hvd.rank()]
    stages = [PipelineStage(parts[i], i, num_stages) for i in mine]
    schedule = SCHEDULES[schedule_name](stages if len(stages) > 1 else stages[0],
                                        N_MICROBATCHES, loss_fn=torch.nn.functional.mse_loss)
    params = [p for i in mine for p in parts[i].parameters()]
    losses = run_pipeline(schedule, parts, make_optimizer(params), num_stages)
    reference, reference_losses = reference_run(num_stages, N_MICROBATCHES)
    for i in mine:
        compare(reference, i, parts[i], schedule_name)
    if losses:
        for got, want in zip(losses, reference_losses):
            check(abs(got - want) <= 1e-5 * abs(want), f"loss {got} != {want}")
    if schedule_name == "1f1b":
        # At most num_stages - stage micro-batches of activations alive, not n_microbatches.
        for stage in stages:
            check(stage.peak_saved <= min(num_stages - stage.stage_index, N_MICROBATCHES),
                  f"stage {stage.stage_index} held {stage.peak_saved} micro-batches")
    if schedule_name == "gpipe":
        check(stages[0].peak_saved == N_MICROBATCHES, f"gpipe held {stages[0].peak_saved}")


def pp_dp_train(schedule_name, stages_per_rank, mesh, passes):
    """Each replica (a dp coordinate) pipelines its half of the global batch over its pp line;
    the stages' gradients are averaged over their dp line by a DistributedOptimizer given
    backward_passes_per_step=passes (None: the default). Returns this rank's stage modules."""
    pp_set, dp_set = mesh.process_set("pp"), mesh.process_set("dp")
    pp_index, dp_index = pp_set.rank(), mesh.coordinate("dp")
    num_stages = 2 * stages_per_rank
    parts = split_sequential(build_model(num_stages), num_stages)
    mine = {i: parts[i] for i in range(pp_index, num_stages, 2)}
    stages = [PipelineStage(part, i, num_stages, process_set=pp_set) for i, part in mine.items()]
    schedule = SCHEDULES[schedule_name](stages if len(stages) > 1 else stages[0],
                                        N_MICROBATCHES, loss_fn=torch.nn.functional.mse_loss)
    params = [p for part in mine.values() for p in part.parameters()]
    named = [(f"{i}.{name}", p) for i, part in mine.items() for name, p in part.named_parameters()]
    options = {} if passes is None else {"backward_passes_per_step": passes}
    optimizer = hvd.DistributedOptimizer(make_optimizer(params), named_parameters=named,
                                         process_set=dp_set, **options)
    rows = slice(dp_index * BATCH // 2, (dp_index + 1) * BATCH // 2)
    run_pipeline(schedule, list(mine.values()), optimizer, num_stages, x_rows=rows)
    return mine


def pp_dp(spec, mesh):
    """pp x dp with a plain DistributedOptimizer (the schedule defers the exchange to each
    stage's last micro-batch) and with backward_passes_per_step=N_MICROBATCHES: both equal
    single-process training on the global batch, and each other."""
    name, _, per_rank = spec.partition(":")
    per_rank = int(per_rank or 1)
    plain = pp_dp_train(name, per_rank, mesh, None)
    explicit = pp_dp_train(name, per_rank, mesh, N_MICROBATCHES)
    # The global batch is BATCH rows = 2 replicas x N_MICROBATCHES micro-batches of BATCH / 8.
    reference, _ = reference_run(2 * per_rank, 2 * N_MICROBATCHES)
    for index, part in plain.items():
        compare(reference, index, part, f"pp x dp {spec}")
        for (name, p), q in zip(part.named_parameters(), explicit[index].parameters()):
            check(torch.allclose(p, q, rtol=1e-12, atol=0),
                  f"pp x dp {spec}: stage {index} {name}, plain and explicit "
                  f"backward_passes_per_step differ by {(p - q).abs().max().item():.3g}")


class Failing(torch.nn.Module):
    """Raises in the forward of micro-batch `when` (counted from 0) of the second step."""

    def __init__(self, inner, when, action):
        super().__init__()
        self.inner, self.calls, self.when, self.action = inner, 0, when, action

    def forward(self, x):
        self.calls += 1
        if self.calls == N_MICROBATCHES + self.when + 1:
            self.action()
        return self.inner(x)


def fail_midway(action):
    num_stages = hvd.size()
    parts = split_sequential(build_model(num_stages), num_stages)
    module = parts[hvd.rank()]
    if hvd.rank() == 1:
        module = Failing(module, 1, action)
    stage = PipelineStage(module, hvd.rank(), num_stages)
    schedule = Schedule1F1B(stage, N_MICROBATCHES, loss_fn=torch.nn.functional.mse_loss)
    return run_pipeline(schedule, [module], make_optimizer(module.parameters()), num_stages,
                        steps=4)


mode = sys.argv[1]
hvd.init()
rank = hvd.rank()

if mode == "train":
    for spec in sys.argv[2:]:
        name, per_rank = spec.split(":")
        train(name, int(per_rank))
    print(f"rank {rank}: pipelines OK", flush=True)
elif mode == "ppdp":
    mesh = hvd.ProcessMesh((2, 2), ("pp", "dp"))
    for name in sys.argv[2:]:
        pp_dp(name, mesh)
    print(f"rank {rank}: pp x dp OK", flush=True)
elif mode == "raise":
    # Bad set-up raises ValueError before anything is sent.
    parts = split_sequential(build_model(hvd.size()), hvd.size())
    other = (rank + 1) % hvd.size()
    for call, fragment in [
            (lambda: PipelineStage(parts[other], other, hvd.size()),
             f"stage {other} of {hvd.size()} runs on rank {other}"),
            (lambda: PipelineStage(parts[0], 0, hvd.size() + 1), "cannot be spread evenly"),
            (lambda: ScheduleInterleaved1F1B(PipelineStage(parts[rank], rank, hvd.size()), 4,
                                             torch.nn.functional.mse_loss),
             "must be a multiple of the number of ranks"),
            (lambda: Schedule1F1B(PipelineStage(parts[rank], rank, hvd.size()), 0),
             "n_microbatches must be an int")]:
        try:
            call()
            raise AssertionError(f"no error for {fragment}")
        except ValueError as e:
            check(fragment in str(e), f"'{e}' does not mention '{fragment}'")

    def boom():
        raise ValueError("boom in stage 1")
    try:
        fail_midway(boom)
        raise AssertionError("no error")
    except ValueError as e:
        check(rank == 1 and "boom" in str(e), f"rank {rank}: {e}")
    except hvd.HorovodInternalError as e:
        check(rank != 1 and "stage 1" in str(e) and "ValueError: boom" in str(e),
              f"rank {rank}: {e}")
    hvd.barrier()  # every rank got here: nobody hangs, collectives still work
    print(f"rank {rank}: raised OK", flush=True)
elif mode == "kill":
    report_dir = sys.argv[2]
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # report before the launcher stops this rank

    make_optimizer([torch.zeros(1, requires_grad=True)])  # torch's first one imports a lot
    try:
        fail_midway(lambda: kill_self(report_dir))
        outcome = "no error"
    except hvd.HorovodInternalError as e:
        outcome = f"HorovodInternalError after {seconds_since_kill(report_dir):.2f} s: {e}"
    with open(os.path.join(report_dir, f"rank{rank}.txt"), "w") as f:
        f.write(outcome + "\n")
