"""Elastic training for PyTorch, with Horovod's API:

    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0)

    @hvd.elastic.run
    def train(state):
        ...
        state.commit()

Started with ``horovodlikerun --min-np 2 --max-np 4 --host-discovery-script discover.sh``.
"""

from horovodlike.common.elastic import ObjectState as _ObjectState
from horovodlike.common.elastic import State, reset_runtime, run_fn
from horovodlike.data.elastic_sampler import ElasticSampler
from horovodlike.torch.elastic.state import TorchState
from horovodlike.torch.functions import broadcast_object
from horovodlike.common.basics import rank


def run(func):
    """Decorator for the training function: on a worker failure the state is restored to its
    last commit, the job re-formed without the failed worker and the function called again; on
    new hosts the job grows at the next commit."""
    return run_fn(func, reset_runtime)


class ObjectState(_ObjectState):
    """Python attributes kept by elastic training: ``ObjectState(epoch=0, batch=0)``."""

    def __init__(self, bcast_object=broadcast_object, get_rank=rank, **kwargs):
        super().__init__(bcast_object, get_rank, **kwargs)


__all__ = ["run", "State", "ObjectState", "TorchState", "ElasticSampler"]
