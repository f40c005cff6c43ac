"""TorchState: a model, an optimizer, ElasticSamplers and plain attributes, kept consistent by
elastic training."""

import copy

from horovodlike.common.basics import rank
from horovodlike.common.elastic import ObjectState
from horovodlike.data.elastic_sampler import ElasticSampler
from horovodlike.torch.functions import (allgather_object, broadcast_object,
                                         broadcast_optimizer_state, broadcast_parameters)


class TorchState(ObjectState):
    def __init__(self, model=None, optimizer=None, **kwargs):
        self.model = model
        self.optimizer = optimizer
        self._samplers = {k: v for k, v in kwargs.items() if isinstance(v, ElasticSampler)}
        plain = {k: v for k, v in kwargs.items() if k not in self._samplers}
        for name, sampler in self._samplers.items():
            setattr(self, name, sampler)
        super().__init__(broadcast_object, rank, **plain)
        self._save_local()

    def _save_local(self):
        self._saved_model = copy.deepcopy(self.model.state_dict()) if self.model else None
        self._saved_optimizer = (copy.deepcopy(self.optimizer.state_dict())
                                 if self.optimizer else None)
        self._saved_samplers = {k: s.state_dict() for k, s in self._samplers.items()}
        ObjectState.save(self)

    def save(self):
        # Samples any rank processed count for all: a worker that dies later must not take
        # its share of the committed samples with it.
        for name, sampler in self._samplers.items():
            everyone = allgather_object(sorted(sampler.processed_indices),
                                        name=f"elastic.sampler.{name}")
            sampler.processed_indices = set().union(*map(set, everyone))
        self._save_local()

    def restore(self):
        if self.model is not None:
            self.model.load_state_dict(self._saved_model)
        if self.optimizer is not None:
            self.optimizer.load_state_dict(self._saved_optimizer)
        for name, sampler in self._samplers.items():
            sampler.load_state_dict(self._saved_samplers[name])
        super().restore()

    def sync(self, root=None):
        root = self.sync_root() if root is None else root
        if self.model is not None:
            broadcast_parameters(self.model.state_dict(), root_rank=root)
        if self.optimizer is not None:
            broadcast_optimizer_state(self.optimizer, root_rank=root)
        for name, sampler in self._samplers.items():
            sampler.load_state_dict(broadcast_object(sampler.state_dict(), root_rank=root,
                                                     name=f"elastic.sampler.{name}.sync"))
        super().sync(root)
        self._save_local()
