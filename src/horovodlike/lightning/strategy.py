"""HorovodStrategy: Lightning's Trainer on a job started by ``horovodlikerun -np N``.

Each process trains one replica on its shard of the data; gradients are averaged by
horovodlike's DistributedOptimizer, the replicas start from rank 0's parameters and optimizer
state, and Lightning's collectives (logging with sync_dist, all_gather, barrier, broadcast)
go through horovodlike.
"""

import torch

import horovodlike.torch as hvd
from horovodlike.lightning import collectives
from horovodlike.lightning.environment import HorovodlikeEnvironmentMixin


class HorovodStrategyMixin:
    """The strategy's behaviour, mixed into each Lightning package's ParallelStrategy by
    strategy_class() below; `_flavor` (flavors.Flavor) holds that package's pieces and
    `_environment` is its ClusterEnvironment class."""

    strategy_name = "horovod"
    _flavor = None
    _environment = None

    def __init__(self, accelerator=None, checkpoint_io=None, precision_plugin=None,
                 compression=hvd.Compression.none, gradient_predivide_factor=1.0):
        """`compression` and `gradient_predivide_factor` go to each DistributedOptimizer."""
        super().__init__(accelerator=accelerator, parallel_devices=None,
                         cluster_environment=self._environment(), checkpoint_io=checkpoint_io,
                         precision_plugin=precision_plugin)
        self._compression = compression
        self._gradient_predivide_factor = gradient_predivide_factor
        self._accumulate_grad_batches = 1  # what the DistributedOptimizers were made for
        self._failed = False  # whether the current run raised (on_exception)

    # ------------------------------------------------------------------ ranks and devices

    @property
    def is_distributed(self):
        return True  # Lightning then puts a DistributedSampler on the dataloaders

    @property
    def root_device(self):
        """cuda:<local rank> when the accelerator is a GPU (ranks beyond the host's GPUs share
        them, as in horovodlike's examples), else the accelerator's device (the CPU)."""
        devices = self.parallel_devices or [torch.device("cpu")]
        if devices[0].type == "cuda":
            return torch.device("cuda", self.local_rank % torch.cuda.device_count())
        return devices[0]

    @property
    def distributed_sampler_kwargs(self):
        return {"num_replicas": self.world_size, "rank": self.global_rank}

    def set_world_ranks(self):
        """Called when the Trainer is built: the ranks are known from here on, and only rank 0
        prints Lightning's rank-zero messages."""
        self._start_horovodlike()

    def setup_environment(self):
        self._start_horovodlike()  # again, for a run after hvd.shutdown()
        if self.root_device.type == "cuda":
            torch.cuda.set_device(self.root_device)
        super().setup_environment()

    def _start_horovodlike(self):
        hvd.init()
        for rank_zero_only in self._flavor.rank_zero_functions:
            rank_zero_only.rank = self.global_rank

    def model_to_device(self):
        self.model.to(self.root_device)

    # ------------------------------------------------------------------ training

    def setup(self, trainer):
        """Lightning's setup (model on its device, optimizers configured), then every rank takes
        rank 0's parameters; when fitting, also its optimizer state, and each optimizer is
        wrapped in a DistributedOptimizer."""
        super().setup(trainer)
        hvd.broadcast_parameters(self.lightning_module.state_dict(), root_rank=0)
        if trainer.state.fn == self._flavor.fitting:
            self._accumulate_grad_batches = trainer.accumulate_grad_batches
            self.optimizers = [self._distribute(optimizer, trainer.accumulate_grad_batches)
                               for optimizer in self.optimizers]

    def on_train_batch_start(self, batch, batch_idx):
        """A GradientAccumulationScheduler changes accumulate_grad_batches at an epoch's start,
        after the last step of the one before: the optimizers reduce once per the new number."""
        accumulate = self.lightning_module.trainer.accumulate_grad_batches
        if accumulate != self._accumulate_grad_batches:
            for optimizer in self.optimizers:
                _set_backward_passes(optimizer, accumulate)
            self._accumulate_grad_batches = accumulate
        super().on_train_batch_start(batch, batch_idx)

    def _distribute(self, optimizer, accumulate_grad_batches):
        """`optimizer` as a DistributedOptimizer whose gradients are reduced once per
        accumulate_grad_batches backward passes (Lightning steps once per that many batches)."""
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        if hasattr(optimizer, "synchronize"):
            return optimizer  # configure_optimizers returned a DistributedOptimizer already
        own = {id(p) for group in optimizer.param_groups for p in group["params"]}
        named = [(name, p) for name, p in self.lightning_module.named_parameters() if id(p) in own]
        return hvd.DistributedOptimizer(optimizer, named_parameters=named,
                                        compression=self._compression,
                                        backward_passes_per_step=accumulate_grad_batches,
                                        gradient_predivide_factor=self._gradient_predivide_factor)

    def optimizer_step(self, optimizer, closure, model=None, **kwargs):
        """Lightning's closure runs forward and backward inside optimizer.step(), so the step
        cannot wait for the gradients' allreduces before it: the closure does, right after
        backward, and before the precision plugin's gradient clipping and the update."""
        if not hasattr(optimizer, "synchronize"):
            return super().optimizer_step(optimizer, closure, model, **kwargs)

        def forward_backward_allreduce():
            result = closure()
            optimizer.synchronize()
            return result

        with optimizer.skip_synchronize():
            return super().optimizer_step(optimizer, forward_backward_allreduce, model, **kwargs)

    # ------------------------------------------------------------------ collectives

    def reduce(self, tensor, group=None, reduce_op="mean"):
        """`tensor` reduced over the ranks (self.log(..., sync_dist=True) lands here); other
        values are returned as they are, as Lightning's DDP strategy does."""
        if not isinstance(tensor, torch.Tensor):
            return tensor
        return collectives.allreduce(tensor, reduce_op, group)

    def all_gather(self, tensor, group=None, sync_grads=False):
        return collectives.all_gather(tensor, group, sync_grads)

    def barrier(self, name=None):
        if hvd.is_initialized():
            hvd.barrier()

    def broadcast(self, obj, src=0):
        return hvd.broadcast_object(obj, root_rank=src)

    # ------------------------------------------------------------------ the end of a run

    def on_exception(self, exception):
        # The other ranks may be inside a collective this rank will never join: waiting for
        # them in teardown would hang this rank too, where raising ends the job (the launcher
        # stops the others when a rank exits with an error).
        self._failed = True
        super().on_exception(exception)

    def teardown(self):
        """Lightning's teardown, then the DistributedOptimizers' gradient hooks come off the
        parameters (a later run, or the user's own loop, would otherwise reduce through them);
        after a run that went well every rank waits here for the others. horovodlike stays
        initialized for the rest of the script (hvd.shutdown() or the process's end stops it)."""
        for optimizer in self.optimizers:
            _remove_gradient_hooks(optimizer)
        super().teardown()
        if not self._failed:
            self.barrier()
        self._failed = False


def _set_backward_passes(optimizer, passes):
    """Between two steps (nothing pending), a DistributedOptimizer reduces once per `passes`."""
    if hasattr(optimizer, "set_backward_passes_per_step"):
        optimizer.set_backward_passes_per_step(passes)


def _remove_gradient_hooks(optimizer):
    """Takes a DistributedOptimizer's hooks off its parameters; any other optimizer has none."""
    if hasattr(optimizer, "remove_hooks"):
        optimizer.remove_hooks()


_STRATEGY_DOC = """Lightning's Trainer on a job started by ``horovodlikerun -np N``: one process
per rank, gradients averaged by horovodlike's DistributedOptimizer (docs/lightning.md).

    trainer = Trainer(strategy=HorovodStrategy(), max_epochs=5)   # or strategy="horovod"

`compression` (hvd.Compression.fp16, ...) and `gradient_predivide_factor` are passed to each
DistributedOptimizer."""


def strategy_class(flavor):
    """HorovodStrategy for one Lightning package (flavors.Flavor)."""
    environment = type("HorovodlikeEnvironment",
                       (HorovodlikeEnvironmentMixin, flavor.base_environment),
                       {"__module__": "horovodlike.lightning"})
    return type("HorovodStrategy", (HorovodStrategyMixin, flavor.parallel_strategy),
                {"_flavor": flavor, "_environment": environment,
                 "__module__": "horovodlike.lightning", "__doc__": _STRATEGY_DOC})


def register(strategy):
    """Makes ``Trainer(strategy="horovod")`` build `strategy` in its Lightning package."""
    strategy._flavor.registry.register(
        "horovod", strategy, description="data parallel over a horovodlikerun job",
        override=True)
