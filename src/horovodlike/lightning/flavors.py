"""The Lightning packages a strategy can plug into.

Lightning ships under two names with separate class hierarchies: ``pytorch_lightning`` (the
``pytorch-lightning`` distribution) and ``lightning.pytorch`` (the ``lightning`` one). A
strategy is only accepted by the Trainer of the package whose ``Strategy`` it subclasses, so
horovodlike builds one strategy class per package found, from the pieces gathered here.
"""

import importlib
from dataclasses import dataclass

# (the Trainer's package, the Fabric package it is built on)
PACKAGES = (("pytorch_lightning", "lightning_fabric"), ("lightning.pytorch", "lightning.fabric"))


@dataclass(frozen=True)
class Flavor:
    name: str                 # "pytorch_lightning" or "lightning.pytorch"
    parallel_strategy: type   # the package's ParallelStrategy
    base_environment: type    # its Fabric's LightningEnvironment
    registry: object          # its StrategyRegistry
    fitting: object           # its TrainerFn.FITTING
    rank_zero_functions: tuple  # the rank_zero_only functions whose .rank says who logs


def load(name, fabric_name):
    """The Flavor of the package `name`, or None when it is not installed."""
    try:
        lightning = importlib.import_module(name)
    except ImportError:
        return None
    fabric = importlib.import_module(fabric_name)
    strategies = importlib.import_module(f"{name}.strategies")
    rank_zero = (importlib.import_module(f"{name}.utilities.rank_zero").rank_zero_only,
                 importlib.import_module(f"{fabric_name}.utilities.rank_zero").rank_zero_only,
                 importlib.import_module("lightning_utilities.core.rank_zero").rank_zero_only)
    return Flavor(name=name, parallel_strategy=strategies.ParallelStrategy,
                  base_environment=fabric.plugins.environments.LightningEnvironment,
                  registry=strategies.StrategyRegistry,
                  fitting=lightning.trainer.states.TrainerFn.FITTING,
                  rank_zero_functions=rank_zero)


def installed():
    """The Flavors of the Lightning packages installed, pytorch_lightning first."""
    return [flavor for flavor in (load(*names) for names in PACKAGES) if flavor is not None]
