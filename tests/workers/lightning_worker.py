"""HorovodStrategy under the launcher (tests/test_lightning.py).

    lightning_worker.py train OUT      fit against a single-process replica, predict, logging
                                       with sync_dist, torchmetrics, checkpoints (2 ranks)
    lightning_worker.py reload OUT     the checkpoint of `train` loaded on this job's ranks
    lightning_worker.py fail OUT       rank 1 raises in its second training step

Each rank prints "rank R: ... OK" for what it checked itself and writes OUT/rankR.json with
what the test compares across ranks with NumPy.
"""

import json
import sys
from pathlib import Path

import numpy as np
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from lightning_fabric.plugins import TorchCheckpointIO
from pytorch_lightning.callbacks import GradientAccumulationScheduler, ModelCheckpoint
from torch.utils.data import DistributedSampler
from torchmetrics import MeanMetric

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import pytorch_digits  # noqa: E402
from lightning_digits import DigitsModule  # noqa: E402

import horovodlike.torch as hvd  # noqa: E402
# Importing horovodlike.lightning registers strategy="horovod".
from horovodlike.lightning import (HorovodStrategy, gather_all_tensors,  # noqa: E402
                                   metric_sync_options)
from common import check, raises  # noqa: E402

QUIET = dict(logger=False, enable_progress_bar=False, enable_model_summary=False,
             accelerator="cpu", devices=1)
# The exact run: per-rank micro-batches of BATCH, ACCUMULATE of them per step, STEPS steps.
BATCH, ACCUMULATE, STEPS, LR, SEED = 8, 2, 3, 0.1, 11


def step_lr(optimizer):
    return torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)


class ExactModule(DigitsModule):
    """The example's module in the data's order, with a learning rate that changes per step."""

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=LR, momentum=0.9)
        return {"optimizer": optimizer,
                "lr_scheduler": {"scheduler": step_lr(optimizer), "interval": "step"}}


class ManualModule(ExactModule):
    """The same steps with manual optimization: one backward per step."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        optimizer = self.optimizers()
        optimizer.zero_grad()
        x, y = batch
        self.manual_backward(F.cross_entropy(self(x), y))
        optimizer.step()
        self.lr_schedulers().step()


def global_batches(train_set, accumulate):
    """The examples of each step over all ranks: Lightning deals the training set out with a
    DistributedSampler seeded by seed_everything (num_replicas=size, rank=rank, shuffled), and
    each rank's step s takes `accumulate` micro-batches of BATCH from its share."""
    shares = [list(DistributedSampler(train_set, num_replicas=hvd.size(), rank=r, seed=SEED))
              for r in range(hvd.size())]
    width = accumulate * BATCH
    return [sum((share[s * width:(s + 1) * width] for share in shares), [])
            for s in range(STEPS)]


def single_process_replica(init_seed, accumulate):
    """STEPS steps of plain PyTorch in one process on the global batches: Lightning divides
    each micro-batch's loss by `accumulate` and the DistributedOptimizer averages over ranks, so
    a step follows the mean loss over that step's examples of every rank."""
    torch.manual_seed(init_seed)
    model = pytorch_digits.build_model().double()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    scheduler = step_lr(optimizer)
    train_set = pytorch_digits.load_data()[0]
    x, y = train_set.tensors
    for rows in global_batches(train_set, accumulate):
        optimizer.zero_grad()
        F.cross_entropy(model(x[rows].double()), y[rows]).backward()
        optimizer.step()
        scheduler.step()
    return model.state_dict()


def fit_exactly(module_class, rank, accumulate, **trainer_args):
    """STEPS steps of `module_class` in float64, started from different weights on each rank
    (the strategy gives every rank rank 0's), against the single-process run."""
    pl.seed_everything(SEED, verbose=False)
    torch.manual_seed(100 + rank)
    module = module_class(batch_size=BATCH)
    trainer = pl.Trainer(precision="64-true", max_steps=STEPS, accumulate_grad_batches=accumulate,
                         limit_val_batches=0, enable_checkpointing=False, **trainer_args, **QUIET)
    check(trainer.world_size == hvd.size() and trainer.global_rank == rank, "ranks")
    trainer.fit(module)
    check(trainer.global_step == STEPS, f"{trainer.global_step} steps")
    expected = single_process_replica(init_seed=100, accumulate=accumulate)
    for name, value in module.model.state_dict().items():
        check(np.allclose(value.numpy(), expected[name].numpy(), rtol=1e-5, atol=0),
              f"{module_class.__name__}: {name} differs from the single-process run: "
              f"{np.abs(value.numpy() - expected[name].numpy()).max()}")
    return trainer, module


def check_fit_matches_single_process(rank):
    trainer, module = fit_exactly(ExactModule, rank, ACCUMULATE, strategy="horovod")
    check(type(trainer.strategy) is HorovodStrategy, f"strategy: {trainer.strategy}")
    check_predict(trainer, module, rank)
    fit_exactly(ManualModule, rank, 1, strategy=HorovodStrategy())
    # horovodlike is still up after the runs, for the script's own collectives.
    total = hvd.allreduce(torch.tensor([float(rank)]), op=hvd.Sum, name="after_fit")
    check(total.item() == sum(range(hvd.size())), f"allreduce after fit: {total}")
    print(f"rank {rank}: fit matches the single-process run OK", flush=True)


def check_predict(trainer, module, rank):
    """predict() deals the test set out without repeats: rank r gets examples r, r + size, ..."""
    predictions = torch.cat(trainer.predict(module))
    x = module.test_set.tensors[0][rank::hvd.size()]
    with torch.no_grad():
        expected = module(x.double()).argmax(dim=1)
    check(torch.equal(predictions, expected), "predictions differ from the module's own")


class RecordingCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint writer, noting which rank wrote which file."""

    def __init__(self, out):
        super().__init__()
        self.out = out

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        with open(self.out / f"saved_by_rank{hvd.rank()}.txt", "a") as f:
            f.write(f"{path}\n")
        super().save_checkpoint(checkpoint, path, storage_options)


class ProbeModule(DigitsModule):
    """Logs rank-dependent values with sync_dist (mean, max, sum) and through a torchmetrics
    metric synced by horovodlike, and keeps what this rank logged."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.mean_loss = MeanMetric(**metric_sync_options())

    def on_validation_epoch_start(self):
        self.seen = []

    def validation_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y) * (1 + self.global_rank)  # ranks log different values
        self.seen.append((loss.item(), len(y)))
        self.log("val_loss", loss, sync_dist=True, batch_size=len(y))
        self.log("val_max", loss, sync_dist=True, reduce_fx="max", batch_size=len(y))
        self.log("val_batches", 1.0, sync_dist=True, reduce_fx="sum", batch_size=len(y))
        self.mean_loss.update(loss, weight=len(y))
        self.log("val_metric", self.mean_loss, batch_size=len(y))


def check_logging_and_checkpoints(rank, out):
    pl.seed_everything(7, verbose=False)
    module = ProbeModule(batch_size=64, lr=0.2)
    checkpoints = ModelCheckpoint(dirpath=out / "checkpoints")
    # Two backward passes per step from the second epoch on: the optimizers follow.
    accumulation = GradientAccumulationScheduler({1: 2})
    trainer = pl.Trainer(strategy=HorovodStrategy(), max_epochs=2,
                         callbacks=[checkpoints, accumulation],
                         plugins=[RecordingCheckpointIO(out)], **QUIET)
    trainer.fit(module)
    check(trainer.global_step == 12 + 6, f"{trainer.global_step} steps")  # 12 batches a rank
    (validated,) = trainer.validate(module, verbose=False)
    (tested,) = trainer.test(module, verbose=False)
    check(0.0 <= tested["test_accuracy"] <= 1.0, f"test: {tested}")
    # After hvd.shutdown() the next run starts horovodlike again, and finds the same values.
    hvd.shutdown()
    (again,) = trainer.validate(module, verbose=False)
    check(hvd.is_initialized() and again == validated, f"after a restart: {again} {validated}")
    report = {"seen": module.seen, "validated": validated,
              "checkpoint": checkpoints.best_model_path,
              "accuracy_mean": tested["test_accuracy"]}
    if trainer.is_global_zero:
        np.savez(out / "weights.npz", **{k: v.numpy() for k, v in module.state_dict().items()
                                         if k.startswith("model.")})
    (out / f"rank{rank}.json").write_text(json.dumps(report))
    print(f"rank {rank}: logging and checkpoints OK", flush=True)


def check_collectives(rank, strategy):
    """The strategy's collectives against their definitions; bad arguments say what to fix."""
    size = hvd.size()
    gathered = strategy.all_gather(torch.tensor([rank, 10 * rank]))
    check(gathered.tolist() == [[r, 10 * r] for r in range(size)], f"all_gather: {gathered}")
    check(strategy.broadcast({"from": rank}, src=size - 1) == {"from": size - 1}, "broadcast")
    check(strategy.reduce(torch.tensor(rank + 1), reduce_op="mean").item() ==
          sum(range(1, size + 1)) / size, "mean of integers")
    check(strategy.reduce_boolean_decision(rank == 0, all=False), "any")
    check(not strategy.reduce_boolean_decision(rank == 0), "all")
    pieces = gather_all_tensors(torch.arange(rank + 1.0))
    check([p.tolist() for p in pieces] == [list(map(float, range(r + 1))) for r in range(size)],
          f"gather_all_tensors: {pieces}")
    raises(ValueError, lambda: strategy.reduce(torch.ones(1), reduce_op="median"),
           "reduce_op='median'", "mean")
    raises(ValueError, lambda: strategy.all_gather(torch.ones(1), group=object()),
           "process set")
    strategy.barrier("end")
    print(f"rank {rank}: collectives OK", flush=True)


def check_reload(rank, out):
    """The checkpoint of a job of another size: weights as rank 0 saved them, optimizer state
    as written, training goes on from its step."""
    path = json.loads((out / "rank0.json").read_text())["checkpoint"]
    saved = np.load(out / "weights.npz")
    stored = torch.load(path, weights_only=False)
    module = ProbeModule(batch_size=64, lr=0.2)
    trainer = pl.Trainer(strategy="horovod", **QUIET)
    trainer.validate(module, ckpt_path=path, verbose=False)
    for name, value in module.state_dict().items():
        if name in saved:
            check(np.array_equal(value.numpy(), saved[name]), f"{name} differs after loading")

    class CheckRestored(pl.Callback):
        def on_train_start(self, trainer, module):
            state = trainer.optimizers[0].state_dict()["state"]
            for key, value in stored["optimizer_states"][0]["state"].items():
                check(torch.equal(state[key]["momentum_buffer"], value["momentum_buffer"]),
                      f"momentum of parameter {key} not restored")

    resumed = pl.Trainer(strategy="horovod", max_epochs=3, callbacks=[CheckRestored()],
                         enable_checkpointing=False, **QUIET)
    # A new module: the first one's metric states were made in validate()'s inference mode.
    resumed.fit(ProbeModule(batch_size=64, lr=0.2), ckpt_path=path)
    check(resumed.global_step > stored["global_step"], "training did not go on")
    print(f"rank {rank}: reload on {hvd.size()} ranks OK", flush=True)


class FailingModule(DigitsModule):
    def training_step(self, batch, batch_idx):
        if self.global_rank == 1 and batch_idx == 1:
            raise RuntimeError("rank 1 fails on purpose")
        return super().training_step(batch, batch_idx)


def check_failure_ends_the_job(rank):
    """Rank 0 waits in the step's allreduce for a rank that is gone: the launcher stops it."""
    trainer = pl.Trainer(strategy="horovod", max_epochs=1, enable_checkpointing=False, **QUIET)
    trainer.fit(FailingModule(batch_size=16))
    print(f"rank {rank}: fit returned", flush=True)


def main():
    mode, out = sys.argv[1], Path(sys.argv[2])
    torch.set_num_threads(1)
    hvd.init()
    rank = hvd.rank()
    if mode == "train":
        check_fit_matches_single_process(rank)
        check_logging_and_checkpoints(rank, out)
        check_collectives(rank, HorovodStrategy())
    elif mode == "fail":
        check_failure_ends_the_job(rank)
    else:
        check_reload(rank, out)


if __name__ == "__main__":
    main()
