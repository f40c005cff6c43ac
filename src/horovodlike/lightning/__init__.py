"""horovodlike for PyTorch Lightning: ``HorovodStrategy``, Lightning 2.x's Trainer over a job
started by ``horovodlikerun -np N python train.py`` (docs/lightning.md).

    import horovodlike.lightning  # registers the strategy name "horovod"
    trainer = pytorch_lightning.Trainer(strategy="horovod", max_epochs=5)

Importing this package registers "horovod" in the StrategyRegistry of each Lightning package
installed (``pytorch_lightning``, and ``lightning.pytorch`` when the ``lightning`` distribution
is there too). ``HorovodStrategy`` is the class for ``pytorch_lightning`` (for
``lightning.pytorch`` when only that one is installed); ``STRATEGIES`` maps each package's
name to its class.
"""

from horovodlike.lightning import flavors
from horovodlike.lightning.collectives import gather_all_tensors, metric_sync_options
from horovodlike.lightning.strategy import register, strategy_class

_FLAVORS = flavors.installed()
if not _FLAVORS:
    raise ImportError("horovodlike.lightning needs PyTorch Lightning 2.x: pip install "
                      "'horovodlike[lightning]' (pytorch-lightning), or the lightning package")

STRATEGIES = {flavor.name: strategy_class(flavor) for flavor in _FLAVORS}
for _strategy in STRATEGIES.values():
    register(_strategy)
HorovodStrategy = STRATEGIES[_FLAVORS[0].name]

__all__ = ["HorovodStrategy", "STRATEGIES", "gather_all_tensors", "metric_sync_options"]
