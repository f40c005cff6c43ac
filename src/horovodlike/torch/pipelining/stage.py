"""PipelineStage: one part of a model, placed on one rank of a process set.

Stage ``i`` of ``num_stages`` runs on the ``i % n``-th rank of the set (n ranks), so a rank
holds one stage when ``num_stages == n`` and several (interleaved) when it is a multiple of n.
A stage keeps, per micro-batch in flight, its input and output so that its backward can run
later; the schedule decides when. Activations and gradients travel between ranks through host
memory (point-to-point stages CUDA tensors there) and arrive on the stage's ``device``.
"""

import torch

from horovodlike.common import basics
from horovodlike.common.process_sets import global_process_set, set_ranks


def _module_device(module):
    for tensor in module.parameters():
        return tensor.device
    for tensor in module.buffers():
        return tensor.device
    return torch.device("cpu")


class PipelineStage:
    """``PipelineStage(submodule, stage_index, num_stages, process_set=None, device=None)``, as in
    ``torch.distributed.pipelining``: ``submodule`` is this stage's part of the model (its
    forward takes and returns one tensor). ``device``: where the stage's inputs and incoming
    gradients are put (default: the device of the submodule's first parameter or buffer, else
    the CPU)."""

    def __init__(self, submodule, stage_index, num_stages, process_set=None, device=None):
        if not isinstance(submodule, torch.nn.Module):
            raise TypeError("PipelineStage: submodule must be a torch.nn.Module, got "
                            f"{type(submodule).__name__}")
        for name, value in (("stage_index", stage_index), ("num_stages", num_stages)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"PipelineStage: {name} must be an int, got {value!r}")
        if num_stages < 1 or not 0 <= stage_index < num_stages:
            raise ValueError(f"PipelineStage: stage_index {stage_index} is not in 0 to "
                             f"{num_stages - 1} (num_stages {num_stages})")
        self.process_set = process_set if process_set is not None else global_process_set
        self.ranks = list(set_ranks(self.process_set))
        if num_stages % len(self.ranks):
            raise ValueError(f"PipelineStage: {num_stages} stages cannot be spread evenly over "
                             f"the {len(self.ranks)} ranks {self.ranks} of the process set; use "
                             "a multiple of the set's size")
        self.submodule = submodule
        self.device = torch.device(device) if device is not None else _module_device(submodule)
        self.stage_index = stage_index
        self.num_stages = num_stages
        self.rank = self.rank_of(stage_index)
        if self.rank != basics.rank():
            raise ValueError(f"PipelineStage: stage {stage_index} of {num_stages} runs on rank "
                             f"{self.rank} (the {stage_index % len(self.ranks)}-th rank of "
                             f"{self.ranks}), not on rank {basics.rank()}")
        self.is_first = stage_index == 0
        self.is_last = stage_index == num_stages - 1
        self.prev_rank = None if self.is_first else self.rank_of(stage_index - 1)
        self.next_rank = None if self.is_last else self.rank_of(stage_index + 1)
        # micro-batch -> (input, output or loss) kept for its backward
        self.saved = {}
        self.peak_saved = 0  # the most micro-batches held at once, in the last step

    def rank_of(self, stage_index):
        """The global rank that runs stage ``stage_index``."""
        return self.ranks[stage_index % len(self.ranks)]

    def forward_one(self, microbatch, inputs):
        """Runs the forward of one micro-batch and keeps what its backward needs."""
        if not self.is_first and inputs.is_floating_point():
            inputs.requires_grad_(True)
        output = self.submodule(inputs)
        if not isinstance(output, torch.Tensor):
            raise TypeError(f"stage {self.stage_index}: the submodule returned "
                            f"{type(output).__name__}; a pipeline stage must return one tensor")
        self.saved[microbatch] = [inputs, output]
        self.peak_saved = max(self.peak_saved, len(self.saved))
        return output

    def keep_loss(self, microbatch, loss):
        """On the last stage the backward starts from the loss rather than the output."""
        self.saved[microbatch][1] = loss

    def backward_one(self, microbatch, grad_output=None, loss_scale=1.0):
        """Runs the backward of one micro-batch (from ``grad_output``, or from the kept loss
        times ``loss_scale`` on the last stage); returns the gradient of its input (None on the
        first stage) and frees what the forward kept."""
        inputs, output = self.saved.pop(microbatch)
        if grad_output is None:
            (output * loss_scale).backward()
        else:
            torch.autograd.backward(output, grad_tensors=grad_output)
        if self.is_first or not inputs.is_floating_point():
            return None
        return inputs.grad if inputs.grad is not None else torch.zeros_like(inputs)

    def __repr__(self):
        return f"PipelineStage(stage {self.stage_index} of {self.num_stages} on rank {self.rank})"
