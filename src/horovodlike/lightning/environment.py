"""Where a Lightning job started by horovodlikerun learns its ranks: from horovodlike."""

import os

import horovodlike.torch as hvd


class HorovodlikeEnvironmentMixin:
    """A Lightning ClusterEnvironment (mixed into each Lightning package's LightningEnvironment,
    flavors.py) whose ranks are horovodlike's. The launcher starts the processes, so Lightning
    starts none, and horovodlike decides the world size: Lightning's setters change nothing."""

    @property
    def creates_processes_externally(self):
        return True

    @staticmethod
    def detect():
        return "HOROVOD_RANK" in os.environ

    def world_size(self):
        return hvd.size()

    def set_world_size(self, size):
        pass

    def global_rank(self):
        return hvd.rank()

    def set_global_rank(self, rank):
        pass

    def local_rank(self):
        return hvd.local_rank()

    def node_rank(self):
        # Horovod's cross rank: the index of this host among those with a rank of this local rank.
        return hvd.cross_rank()

    def teardown(self):
        pass  # horovodlike outlives a Trainer run (strategy.py, teardown)
