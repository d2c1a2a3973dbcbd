"""transient_nb: train deep-learning models on cheap preemptible GPUs, from Jupyter."""

from __future__ import annotations

import sys
from typing import Any

from transient_nb import config  # noqa: F401  (registers the ``transient`` dask config defaults)
from transient_nb.cluster import TransientCluster
from transient_nb.connect import connect
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
    "connect",
    "train",
]


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext transient_nb``: the ``%transient_cluster`` magics, and clusters and training
    runs that display as their live control panel."""
    from transient_nb.connect import RemoteCluster
    from transient_nb.magics import TransientMagics, display_view

    ipython.register_magics(TransientMagics)
    formatter = ipython.display_formatter.ipython_display_formatter
    formatter.for_type(TransientCluster, display_view)
    formatter.for_type(RemoteCluster, display_view)
    # By name: registering must not import the training code (and torch) before it is used.
    formatter.for_type_by_name("transient_nb.training.run", "TrainingRun", display_view)


def unload_ipython_extension(ipython: Any) -> None:
    """``%unload_ext transient_nb``: clusters and runs display as plain objects again."""
    from transient_nb.connect import RemoteCluster

    formatter = ipython.display_formatter.ipython_display_formatter
    for cls in (TransientCluster, RemoteCluster):
        formatter.pop(cls, None)
    formatter.deferred_printers.pop(("transient_nb.training.run", "TrainingRun"), None)
    run = sys.modules.get("transient_nb.training.run")  # registered by name: never import torch
    if run is not None:
        formatter.type_printers.pop(run.TrainingRun, None)


def _jupyter_server_extension_points() -> list[dict[str, Any]]:
    """Where Jupyter Server finds the extension behind the JupyterLab panel.

    Imported only when a server asks, so that kernels never load the server's dependencies.
    """
    from transient_nb.server.app import TransientServerExtension

    return [{"module": "transient_nb.server.app", "app": TransientServerExtension}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    """Load the panel's routes into ``serverapp`` (Jupyter Server's loader hook).

    Jupyter Server loads the extension through the app named by
    :func:`_jupyter_server_extension_points`; this hook does the same for callers that load the
    module directly.
    """
    from transient_nb.server.app import TransientServerExtension

    TransientServerExtension._load_jupyter_server_extension(serverapp)


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    """Where the prebuilt JupyterLab panel is, for ``jupyter labextension develop``.

    Installs put it in ``share/jupyter/labextensions`` (wheel shared-data); this hook lets a
    developer link the build folder instead: ``jupyter labextension develop --overwrite .``.
    """
    return [{"src": "labextension/prebuilt", "dest": "transient-nb"}]
