"""Horovod's Ray API: a horovodlike job whose ranks are Ray actors.

``RayExecutor`` runs a fixed number of workers placed by a placement group;
``ElasticRayExecutor`` follows the Ray cluster's live nodes with elastic training.
Needs ``ray`` (``pip install "horovodlike[ray]"``).
"""

from horovodlike.ray.executor import RayExecutor, RaySettings
from horovodlike.ray.elastic import ElasticRayExecutor, RayHostDiscovery

__all__ = ["RayExecutor", "RaySettings", "ElasticRayExecutor", "RayHostDiscovery"]
