"""examples/pytorch_digits.py's model and data as a PyTorch Lightning module, trained by
Lightning's Trainer with horovodlike's HorovodStrategy (docs/lightning.md).

    horovodlikerun -np 2 python examples/lightning_digits.py

Each rank trains on its shard of the training set (Lightning adds the DistributedSampler);
--batch-size is per rank and --lr is for the global batch, as in pytorch_digits.py. The
validation loss and accuracy are logged with sync_dist=True, so every rank sees their mean
over the ranks. --checkpoint-dir keeps the last epoch's checkpoint there (rank 0 writes it).
"""

import argparse

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

import pytorch_digits
import horovodlike.torch as hvd
from horovodlike.lightning import HorovodStrategy


class DigitsModule(pl.LightningModule):
    """pytorch_digits.py's MLP; SGD with momentum, as there."""

    def __init__(self, lr=0.2, batch_size=32):
        super().__init__()
        self.save_hyperparameters()
        self.model = pytorch_digits.build_model()
        self.train_set, self.test_set = pytorch_digits.load_data()

    def forward(self, x):
        return self.model(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, sync_dist=True)
        return loss

    def _evaluate(self, batch, stage):
        x, y = batch
        logits = self(x)
        self.log(f"{stage}_loss", F.cross_entropy(logits, y), sync_dist=True)
        self.log(f"{stage}_accuracy", (logits.argmax(dim=1) == y).float().mean(), sync_dist=True)

    def validation_step(self, batch, batch_idx):
        self._evaluate(batch, "val")

    def test_step(self, batch, batch_idx):
        self._evaluate(batch, "test")

    def predict_step(self, batch, batch_idx):
        return self(batch[0]).argmax(dim=1)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.hparams.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.test_set, batch_size=self.hparams.batch_size)

    def test_dataloader(self):
        return self.val_dataloader()

    def predict_dataloader(self):
        return self.val_dataloader()


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32, help="batch size per rank")
    parser.add_argument("--lr", type=float, default=0.2, help="learning rate for the global batch")
    parser.add_argument("--accumulate", type=int, default=1, metavar="K",
                        help="accumulate_grad_batches: one step per K batches")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--checkpoint-dir", help="rank 0 saves the last epoch's checkpoint here")
    parser.add_argument("--cuda", action="store_true", help="train on the GPU cuda:<local rank>")
    return parser.parse_args()


def main():
    args = parse_args()
    pl.seed_everything(args.seed, verbose=False)
    torch.set_num_threads(1)  # ranks share the host's cores
    trainer = pl.Trainer(
        strategy=HorovodStrategy(), accelerator="gpu" if args.cuda else "cpu", devices=1,
        max_epochs=args.epochs, accumulate_grad_batches=args.accumulate,
        logger=False, enable_progress_bar=False, enable_model_summary=False,
        enable_checkpointing=bool(args.checkpoint_dir), default_root_dir=args.checkpoint_dir)
    module = DigitsModule(lr=args.lr, batch_size=args.batch_size)
    trainer.fit(module)
    for epoch_metric in ("train_loss", "val_loss", "val_accuracy"):
        value = trainer.callback_metrics[epoch_metric].item()
        if trainer.is_global_zero:
            print(f"{epoch_metric} {value:.4f}", flush=True)
    (scores,) = trainer.test(module, verbose=False)
    if trainer.is_global_zero:
        print(f"test accuracy {100 * scores['test_accuracy']:.2f}% on {hvd.size()} ranks",
              flush=True)


if __name__ == "__main__":
    main()
