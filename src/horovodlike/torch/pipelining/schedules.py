"""Pipeline schedules, as in ``torch.distributed.pipelining``: ScheduleGPipe, Schedule1F1B and
ScheduleInterleaved1F1B.

A schedule is data: for each rank, the ordered list of actions ``(F or B, stage, micro-batch)``
it runs in one step (``actions_for(rank_position)``). One executor runs every schedule: a forward
receives its input from the previous stage (unless it is the first), runs, and sends its output
to the next stage; a backward receives the gradient of its output (unless it is the last stage,
which starts from the loss), runs, and sends the gradient of its input back. Sends are
asynchronous and the receiving rank keeps messages until it asks for them, so a rank only ever
waits for data that its neighbour's own list produces before needing anything from it.

Gradients of one step are those of the mean of the micro-batch losses: each micro-batch's loss
is scaled by 1/n_microbatches before its backward, and they accumulate into ``.grad``, so a
pipelined step equals the step one process takes on the whole batch (when it divides evenly).
As DistributedDataParallel's gradients are under torch.distributed.pipelining, a
DistributedOptimizer's are exchanged once per step: every backward of a stage but its last runs
inside no_sync (local_accumulation.py), so the optimizer needs no backward_passes_per_step.
Likewise for a stage sharded with fully_shard: its wrapped modules' gradient sync is off for
every backward but the last (FSDP2's set_requires_gradient_sync), so the full gradients add up
locally and are reduce-scattered once per step, as the same micro-batches would be in one
process.
"""

import contextlib

import torch

from horovodlike.common import basics
from horovodlike.common import point_to_point as p2p
from horovodlike.common.exceptions import HorovodInternalError
from horovodlike.torch.fsdp import FSDPModule
from horovodlike.torch.local_accumulation import no_sync
from horovodlike.torch.p2p import irecv_any, isend
from horovodlike.torch.pipelining.stage import PipelineStage

FORWARD, BACKWARD = "F", "B"
_MAX_MICROBATCHES = 1 << 16
_MAX_STAGES = 1 << 14


def _tag(sender_stage, backward, microbatch):
    """One tag per (boundary, direction, micro-batch): a message can only meet its own receive."""
    return (((sender_stage << 1) | int(backward)) << 16) | microbatch


class _PipelineSchedule:
    def __init__(self, stages, n_microbatches, loss_fn=None):
        stages = list(stages) if isinstance(stages, (list, tuple)) else [stages]
        if not stages or not all(isinstance(s, PipelineStage) for s in stages):
            raise TypeError(f"{type(self).__name__}: expects a PipelineStage "
                            "(or a list of them for interleaved schedules)")
        if isinstance(n_microbatches, bool) or not isinstance(n_microbatches, int) or \
                not 1 <= n_microbatches <= _MAX_MICROBATCHES:
            raise ValueError(f"{type(self).__name__}: n_microbatches must be an int from 1 to "
                             f"{_MAX_MICROBATCHES}, got {n_microbatches!r}")
        first = stages[0]
        if first.num_stages > _MAX_STAGES:
            raise ValueError(f"at most {_MAX_STAGES} stages")
        if any(s.process_set != first.process_set or s.num_stages != first.num_stages
               for s in stages):
            raise ValueError(f"{type(self).__name__}: the stages of one rank must share their "
                             "process set and num_stages")
        self.stages = {s.stage_index: s for s in stages}
        if len(self.stages) != len(stages):
            raise ValueError(f"{type(self).__name__}: a stage index appears twice")
        self.num_stages = first.num_stages
        self.process_set = first.process_set
        self.ranks = first.ranks
        self.position = self.ranks.index(basics.rank())
        self.n_microbatches = n_microbatches
        self.loss_fn = loss_fn
        self._local = {}  # messages between two stages of this rank (a set of one rank)
        self.bytes_sent = 0  # activations and gradients this rank sent to other ranks, in total
        expected = [i for i in range(self.num_stages)
                    if i % len(self.ranks) == self.position]
        if sorted(self.stages) != expected:
            raise ValueError(f"{type(self).__name__}: rank {basics.rank()} holds stages "
                             f"{sorted(self.stages)}, but this schedule places stages "
                             f"{expected} on it")
        if self.stages.get(self.num_stages - 1) is not None and loss_fn is None:
            raise ValueError(f"{type(self).__name__}: the last stage needs a loss_fn")
        self._check()
        self.actions = self.actions_for(self.position)
        self._last_backward = last_backwards(self.actions)

    def _check(self):
        """Schedule-specific constraints (raise ValueError)."""

    def actions_for(self, position):
        """The ordered actions of the rank at ``position`` in the process set."""
        raise NotImplementedError

    # ---------------------------------------------------------------------------- step

    def step(self, *args, target=None, losses=None, **kwargs):
        """Runs one pipelined forward and backward of a batch. The rank holding stage 0 passes
        the batch; the one holding the last stage passes ``target`` (and a list ``losses`` to
        get each micro-batch's loss); the others pass nothing. Gradients accumulate into
        ``.grad`` (zero them between steps as usual). Returns the output of the last stage,
        the micro-batch outputs concatenated, on its rank; None elsewhere."""
        return self._run(self.actions, args, target, losses)

    def eval(self, *args, target=None, losses=None):
        """A forward of the batch only (evaluation): no gradients, nothing kept for a backward,
        the same arguments and result as ``step``. ``target`` is needed only for ``losses``."""
        order = [(FORWARD, index, m) for m in range(self.n_microbatches)
                 for index in sorted(self.stages)]
        with torch.no_grad():
            return self._run(order, args, target, losses, need_target=losses is not None)

    def _run(self, actions, args, target, losses, need_target=True):
        n = self.n_microbatches
        inputs = self._split(args[0] if args else None, 0, "the batch") \
            if 0 in self.stages else None
        last = self.num_stages - 1
        targets = self._split(target, last, "target") \
            if last in self.stages and need_target else None
        for stage in self.stages.values():
            stage.saved.clear()
            stage.peak_saved = 0
        outputs, pending = [None] * n, []
        try:
            for kind, index, microbatch in actions:
                stage = self.stages[index]
                if kind == FORWARD:
                    self._forward(stage, microbatch, inputs, targets, outputs, losses, pending)
                else:
                    self._backward(stage, microbatch, pending)
                pending = [w for w in pending if not w.is_completed()]
            for work in pending:
                work.wait()
            if actions is not self.actions:  # forward only: nothing will be backpropagated
                for stage in self.stages.values():
                    stage.saved.clear()
        except BaseException as e:
            for stage in self.stages.values():
                stage.saved.clear()
            if isinstance(e, Exception):
                # The other stages must not wait for this one: they raise too.
                where = ", ".join(str(s) for s in self.stages.values())
                reason = str(e) if isinstance(e, HorovodInternalError) else \
                    f"{where} raised {type(e).__name__}: {e}"
                try:
                    p2p.notify_failure(self.process_set, reason)
                except Exception:  # noqa: BLE001 - the runtime is gone; peers see that anyway
                    pass
            raise
        if last in self.stages:
            return torch.cat(outputs) if outputs and outputs[0].dim() > 0 else \
                torch.stack(outputs)
        return None

    def _split(self, batch, stage_index, what):
        if not isinstance(batch, torch.Tensor):
            raise TypeError(f"{type(self).__name__}.step: the rank holding stage {stage_index} "
                            f"must pass {what} as a tensor, got {type(batch).__name__}")
        if batch.dim() == 0 or batch.shape[0] < self.n_microbatches:
            raise ValueError(f"{type(self).__name__}.step: {what} of shape {tuple(batch.shape)} "
                             f"cannot be split into {self.n_microbatches} micro-batches along "
                             "its first dimension")
        return torch.tensor_split(batch, self.n_microbatches)

    def _receive(self, stage, peer_stage, backward, microbatch):
        peer = stage.rank_of(peer_stage)
        tag = _tag(peer_stage, backward, microbatch)  # the peer stage sent it
        if peer == basics.rank():
            return self._local.pop(tag)
        return irecv_any(peer, tag, self.process_set).wait().to(stage.device)

    def _send(self, stage, tensor, peer_stage, backward, microbatch, pending):
        peer = stage.rank_of(peer_stage)
        tag = _tag(stage.stage_index, backward, microbatch)
        if peer == basics.rank():  # both stages on this rank (a set of one)
            self._local[tag] = tensor.detach().clone()
            return
        pending.append(isend(tensor.detach(), peer, tag, self.process_set))
        self.bytes_sent += tensor.numel() * tensor.element_size()

    def _forward(self, stage, microbatch, inputs, targets, outputs, losses, pending):
        if stage.is_first:
            x = inputs[microbatch]
        else:
            x = self._receive(stage, stage.stage_index - 1, False, microbatch)
        output = stage.forward_one(microbatch, x)
        if stage.is_last:
            outputs[microbatch] = output.detach()
            if targets is not None:
                loss = self.loss_fn(output, targets[microbatch])
                stage.keep_loss(microbatch, loss)
                if losses is not None:
                    losses.append(loss.detach())
        else:
            self._send(stage, output, stage.stage_index + 1, False, microbatch, pending)

    def _backward(self, stage, microbatch, pending):
        # The stage's gradients are exchanged after its last backward of the step only.
        exchange = microbatch == self._last_backward[stage.stage_index]
        with contextlib.nullcontext() if exchange else _accumulating(stage.submodule):
            if stage.is_last:
                grad_input = stage.backward_one(microbatch,
                                                loss_scale=1.0 / self.n_microbatches)
            else:
                grad = self._receive(stage, stage.stage_index + 1, True, microbatch)
                grad_input = stage.backward_one(microbatch, grad_output=grad)
        if not stage.is_first:
            self._send(stage, grad_input, stage.stage_index - 1, True, microbatch, pending)


@contextlib.contextmanager
def _accumulating(module):
    """A backward inside it adds the gradients of ``module`` up locally: a DistributedOptimizer
    does not exchange them (no_sync) and fully_shard's modules do not reduce-scatter them
    (their gradient sync is off, then back to what it was)."""
    sharded = [m for m in module.modules() if isinstance(m, FSDPModule)]
    was = [m.get_requires_gradient_sync() for m in sharded]
    for m in sharded:
        m.set_requires_gradient_sync(False, recurse=False)
    try:
        with no_sync(module.parameters()):
            yield
    finally:
        for m, value in zip(sharded, was):
            m.set_requires_gradient_sync(value, recurse=False)


def last_backwards(actions):
    """{stage: the micro-batch of its last backward} in a rank's actions."""
    return {index: microbatch for kind, index, microbatch in actions if kind == BACKWARD}


class ScheduleGPipe(_PipelineSchedule):
    """Every micro-batch forward, then every backward: simple, but each stage holds the
    activations of all n micro-batches at once."""

    def actions_for(self, position):
        n = self.n_microbatches  # one stage per rank: its index is the rank's position
        return [(FORWARD, position, m) for m in range(n)] + \
            [(BACKWARD, position, m) for m in range(n)]

    def _check(self):
        if self.num_stages != len(self.ranks):
            raise ValueError("ScheduleGPipe: one stage per rank (num_stages == the process "
                             "set's size); use ScheduleInterleaved1F1B for several")


class Schedule1F1B(_PipelineSchedule):
    """One forward, one backward: after a warm-up of (num_stages - stage - 1) forwards each
    stage alternates, so it holds at most num_stages - stage micro-batches of activations,
    whatever n_microbatches is (the backward-first schedule of the Whale paper)."""

    def actions_for(self, position):
        s, n = position, self.n_microbatches
        warmup = min(self.num_stages - 1 - s, n)
        actions = [(FORWARD, s, m) for m in range(warmup)]
        for i in range(n - warmup):
            actions += [(FORWARD, s, warmup + i), (BACKWARD, s, i)]
        actions += [(BACKWARD, s, m) for m in range(n - warmup, n)]
        return actions

    def _check(self):
        if self.num_stages != len(self.ranks):
            raise ValueError("Schedule1F1B: one stage per rank (num_stages == the process set's "
                             "size); use ScheduleInterleaved1F1B for several")


class ScheduleInterleaved1F1B(_PipelineSchedule):
    """1F1B with several stages per rank (stage i on rank i % P): the micro-batches go round
    the ranks v = num_stages / P times, which shortens the pipeline's fill and drain by v.
    Needs n_microbatches to be a multiple of P (Megatron-LM's interleaved schedule)."""

    def _check(self):
        p = len(self.ranks)
        if self.n_microbatches % p:
            raise ValueError(f"ScheduleInterleaved1F1B: n_microbatches ({self.n_microbatches}) "
                             f"must be a multiple of the number of ranks ({p})")

    def actions_for(self, position):
        p = len(self.ranks)
        v = self.num_stages // p
        n = self.n_microbatches
        total = n * v

        def unit(k, backward):
            chunk = (k // p) % v
            if backward:
                chunk = v - 1 - chunk
            microbatch = (k // (p * v)) * p + k % p
            return chunk * p + position, microbatch

        warmup = min((p - position - 1) * 2 + (v - 1) * p, total)
        actions = [(FORWARD, *unit(k, False)) for k in range(warmup)]
        for i in range(total - warmup):
            actions.append((FORWARD, *unit(warmup + i, False)))
            actions.append((BACKWARD, *unit(i, True)))
        actions += [(BACKWARD, *unit(k, True)) for k in range(total - warmup, total)]
        return actions
