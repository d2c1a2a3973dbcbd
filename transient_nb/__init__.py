"""transient_nb: train deep-learning models on cheap preemptible GPUs, from Jupyter."""

from __future__ import annotations

from transient_nb import config  # noqa: F401  (registers the ``transient`` dask config defaults)
from transient_nb.cluster import TransientCluster
from transient_nb.cost import CostReport, compute_costs
from transient_nb.prices import PriceCatalog

__version__ = "0.1.0"
__all__ = ["CostReport", "PriceCatalog", "TransientCluster", "__version__", "compute_costs"]
