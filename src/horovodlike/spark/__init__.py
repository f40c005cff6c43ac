"""Horovod's Spark API: ``run`` (a fixed number of ranks, one Spark barrier task each) and
``run_elastic``; PySpark's ``TorchDistributor`` on horovodlike ranks. Needs ``pyspark``
(``pip install "horovodlike[spark]"``) and Java."""

from horovodlike.spark.elastic import run_elastic
from horovodlike.spark.runner import run
from horovodlike.spark.torch_distributor import TorchDistributor

__all__ = ["run", "run_elastic", "TorchDistributor"]
