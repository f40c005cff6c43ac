"""SyncBatchNorm: batch normalization whose statistics are those of the global batch."""

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from horovodlike.common.process_sets import global_process_set
from horovodlike.torch.mpi_ops import Sum, allreduce


class _SyncBatchNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, momentum, process_set):
        dims = [0] + list(range(2, x.dim()))
        channels = x.shape[1]
        # Sums in float64 so the global mean and variance do not lose precision.
        x64 = x.detach().to(torch.float64)
        local = torch.cat([x64.sum(dims), (x64 * x64).sum(dims),
                           torch.tensor([x.numel() / channels], dtype=torch.float64,
                                        device=x.device)])
        total = allreduce(local, op=Sum, name=None, process_set=process_set)
        count = total[-1].item()
        if count <= 1:
            raise ValueError("SyncBatchNorm needs more than one value per channel over the "
                             f"global batch, got input of shape {tuple(x.shape)}")
        mean64 = total[:channels] / count
        var64 = (total[channels:2 * channels] / count - mean64 * mean64).clamp_min(0)
        if running_mean is not None:
            with torch.no_grad():
                running_mean.mul_(1 - momentum).add_(mean64.to(running_mean.dtype) * momentum)
                unbiased = var64 * count / (count - 1)
                running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype) * momentum)
        shape = [1, channels] + [1] * (x.dim() - 2)
        mean = mean64.to(x.dtype).reshape(shape)
        invstd = torch.rsqrt(var64 + eps).to(x.dtype).reshape(shape)
        xhat = (x - mean) * invstd
        out = xhat * weight.reshape(shape) + bias.reshape(shape) if weight is not None else xhat
        ctx.save_for_backward(xhat, weight, invstd)
        ctx.count, ctx.process_set, ctx.dims = count, process_set, dims
        return out

    @staticmethod
    def backward(ctx, grad_out):
        xhat, weight, invstd = ctx.saved_tensors
        dims, channels = ctx.dims, xhat.shape[1]
        shape = [1, channels] + [1] * (xhat.dim() - 2)
        local_dy = grad_out.sum(dims)
        local_dy_xhat = (grad_out * xhat).sum(dims)
        # The statistics depend on every rank's inputs: their gradients flow across ranks.
        total = allreduce(torch.cat([local_dy, local_dy_xhat]), op=Sum,
                          process_set=ctx.process_set)
        mean_dy = (total[:channels] / ctx.count).reshape(shape)
        mean_dy_xhat = (total[channels:] / ctx.count).reshape(shape)
        scale = invstd * (weight.reshape(shape) if weight is not None else 1.0)
        grad_x = scale * (grad_out - mean_dy - xhat * mean_dy_xhat)
        grad_w = local_dy_xhat if weight is not None else None
        grad_b = local_dy if weight is not None else None
        return grad_x, grad_w, grad_b, None, None, None, None, None


class SyncBatchNorm(_BatchNorm):
    """Applies batch normalization over the batch of all ranks together (training mode); in
    eval mode, the running statistics, as BatchNorm does. A drop-in for torch.nn.BatchNorm*d.

    The gradients of weight and bias are this rank's share; DistributedOptimizer averages them.
    """

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, process_set=global_process_set):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.process_set = process_set

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"SyncBatchNorm expects at least 2-D input (N, C, ...), "
                             f"got {input.dim()}-D")

    def forward(self, input):
        self._check_input_dim(input)
        if not self.training and self.track_running_stats:
            return torch.nn.functional.batch_norm(input, self.running_mean, self.running_var,
                                                  self.weight, self.bias, False, 0.0, self.eps)
        momentum = self.momentum if self.momentum is not None else 0.0
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # cumulative moving average
                momentum = 1.0 / float(self.num_batches_tracked)
        return _SyncBatchNormFunction.apply(
            input, self.weight, self.bias,
            self.running_mean if self.training and self.track_running_stats else None,
            self.running_var if self.training and self.track_running_stats else None,
            self.eps, momentum, self.process_set)
