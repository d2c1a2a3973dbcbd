"""transient_nb: train deep-learning models on cheap preemptible GPUs, from Jupyter."""

from __future__ import annotations

from transient_nb import config  # noqa: F401  (registers the ``transient`` dask config defaults)
from transient_nb.cluster import TransientCluster
from transient_nb.cost import CostReport, compute_costs
from transient_nb.prices import PriceCatalog

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    # Training pulls in torch (seconds to import): only when it is asked for.
    if name in ("train", "TrainingRun"):
        from transient_nb.training import run

        return getattr(run, name)
    raise AttributeError(f"module 'transient_nb' has no attribute {name!r}")


__all__ = [
    "CostReport",
    "PriceCatalog",
    "TrainingRun",
    "TransientCluster",
    "__version__",
    "compute_costs",
    "train",
]
