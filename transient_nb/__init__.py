"""transient_nb: train deep-learning models on cheap preemptible GPUs, from Jupyter.

The public API is imported lazily (a module ``__getattr__``): ``import transient_nb`` costs only
the configuration's defaults, so a worker's preload or a VM's startup script that imports a
piece of the package never pays for the cluster, pandas or torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from transient_nb import _moved, config  # noqa: F401  (config: the ``transient`` defaults)
from transient_nb._version import __version__

if TYPE_CHECKING:
    from transient_nb.catalog.prices import PriceCatalog
    from transient_nb.deploy.cluster import TransientCluster
    from transient_nb.deploy.connect import connect
    from transient_nb.eventlog.bill import CostReport, compute_costs
    from transient_nb.training.estimate import Estimate, estimate
    from transient_nb.training.export import load_model, load_state_dict
    from transient_nb.training.run import TrainingRun, train

#: Public name -> the module that defines it.
_PUBLIC = {
    "CostReport": "transient_nb.eventlog.bill",
    "Estimate": "transient_nb.training.estimate",
    "PriceCatalog": "transient_nb.catalog.prices",
    "TrainingRun": "transient_nb.training.run",
    "TransientCluster": "transient_nb.deploy.cluster",
    "compute_costs": "transient_nb.eventlog.bill",
    "connect": "transient_nb.deploy.connect",
    "estimate": "transient_nb.training.estimate",
    "load_model": "transient_nb.training.export",
    "load_state_dict": "transient_nb.training.export",
    "train": "transient_nb.training.run",
}

_moved.install()


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value  # once found, an ordinary attribute
        return value
    if name in _moved.MOVED:  # ``from transient_nb import cost``: a module of the old layout
        return importlib.import_module(f"transient_nb.{name}")
    raise AttributeError(f"module 'transient_nb' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})


__all__ = [
    "CostReport",
    "Estimate",
    "PriceCatalog",
    "TrainingRun",
    "TransientCluster",
    "__version__",
    "compute_costs",
    "connect",
    "estimate",
    "load_model",
    "load_state_dict",
    "train",
]


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext transient_nb``: the ``%transient_cluster`` magics, and clusters and training
    runs that display as their live control panel."""
    from transient_nb.notebook.magics import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    """``%unload_ext transient_nb``: clusters and runs display as plain objects again."""
    from transient_nb.notebook.magics import unload_ipython_extension as unload

    unload(ipython)


def _jupyter_server_extension_points() -> list[dict[str, Any]]:
    """Where Jupyter Server finds the extension behind the JupyterLab panel.

    Imported only when a server asks, so that kernels never load the server's dependencies.
    """
    from transient_nb.server.app import TransientServerExtension

    return [{"module": "transient_nb.server.app", "app": TransientServerExtension}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    """Load the panel's routes into ``serverapp`` (Jupyter Server's loader hook)."""
    from transient_nb.server.app import TransientServerExtension

    TransientServerExtension._load_jupyter_server_extension(serverapp)


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    """Where the prebuilt JupyterLab panel is, for ``jupyter labextension develop``."""
    return [{"src": "labextension/prebuilt", "dest": "transient-nb"}]
