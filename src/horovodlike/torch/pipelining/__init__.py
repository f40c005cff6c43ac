"""Pipeline parallelism with ``torch.distributed.pipelining``'s names.

    stage = PipelineStage(split_sequential(model, 4)[hvd.rank()], hvd.rank(), 4)
    schedule = Schedule1F1B(stage, n_microbatches=8, loss_fn=torch.nn.functional.mse_loss)
    if hvd.rank() == 0:
        schedule.step(x)
    elif hvd.rank() == 3:
        losses = []
        schedule.step(target=y, losses=losses)
    else:
        schedule.step()
    optimizer.step()

Stages exchange activations and gradients by point-to-point messages within their process set
(``process_set=mesh.process_set("pp")`` for pipeline x data parallel, with the stage's
DistributedOptimizer on ``mesh.process_set("dp")``).
"""

from horovodlike.torch.pipelining.schedules import (Schedule1F1B, ScheduleGPipe,
                                                     ScheduleInterleaved1F1B)
from horovodlike.torch.pipelining.split import split_sequential
from horovodlike.torch.pipelining.stage import PipelineStage

__all__ = ["PipelineStage", "ScheduleGPipe", "Schedule1F1B", "ScheduleInterleaved1F1B",
           "split_sequential"]
