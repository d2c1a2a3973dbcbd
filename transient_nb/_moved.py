"""Module paths of the flat layout (before 0.2), and names renamed since, kept working for one
release.

``import transient_nb.cluster`` (or ``from transient_nb import cost``) still works, with a
``DeprecationWarning`` that names the module's new place; the old name and the new one are the
same module object.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

#: Old module (under ``transient_nb.``) -> its new place.
MOVED: dict[str, str] = {
    "agent": "worker.preload",
    "backends.gce_agent": "backends.gce.preload",
    "backends.gce_api": "backends.gce.api",
    "backends.gce_enroll": "backends.gce.enroll",
    "backends.gce_head": "backends.gce.head",
    "backends.gce_head_ps": "backends.gce.head_ps",
    "backends.gce_head_serve": "deploy.head_vm",
    "backends.gce_labels": "backends.gce.labels",
    "backends.gce_startup": "backends.gce.startup",
    "backends.gce_sweep": "deploy.sweep",
    "backends.gce_vm": "backends.gce.vm",
    "cluster": "deploy.cluster",
    "connect": "deploy.connect",
    "cost": "eventlog.bill",
    "emulation": "training.emulation",
    "evaluation": "experiments.evaluation",
    "events": "eventlog.vocabulary",
    "head": "deploy.head",
    "history": "policy.memory",
    "magics": "notebook.magics",
    "mix": "catalog.mix",
    "monitor": "deploy.monitor",
    "planner": "policy.planner",
    # The policy's memory of earlier runs was its "history" (a run's curve is that, alone).
    "policy.history": "policy.memory",
    "preemption": "catalog.lifetimes",
    "prices": "catalog.prices",
    "registry": "deploy.registry",
    "replacement": "policy.placement",
    "reproduce": "experiments.reproduce",
    "simulator": "backends.simulator",
    "spares": "policy.spares",
    "state": "eventlog.folds",
    "training.remote_run": "deploy.remote_run",
    "views": "notebook.views",
}


def warn(old: str, new: str, stacklevel: int = 3) -> None:
    warnings.warn(
        f"transient_nb.{old} moved to transient_nb.{new}; import it from there "
        "(the old path goes in the next release).",
        DeprecationWarning,
        stacklevel=stacklevel,
    )


def renamed(module: str, names: Mapping[str, str]) -> Callable[[str], Any]:
    """A module's ``__getattr__`` that still finds its old ``names`` (old -> new name in the
    same module), with a ``DeprecationWarning`` that names the new one, for one release.

    ``__getattr__ = renamed(__name__, {"history": "training_curve"})`` at the end of the module.
    """

    def __getattr__(name: str) -> Any:
        new = names.get(name)
        if new is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        warnings.warn(
            f"{module}.{name} is now {module}.{new}; use that name (the old one goes in the "
            "next release).",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(sys.modules[module], new)

    return __getattr__


def forward(package: str, module: str, name: str) -> Any:
    """``name`` of ``transient_nb.<module>``, asked of ``transient_nb.<package>`` (which was that
    module before 0.2), with the warning; an AttributeError if the module has no such name."""
    target = importlib.import_module(f"transient_nb.{module}")
    if name.startswith("__") or not hasattr(target, name):
        raise AttributeError(f"module 'transient_nb.{package}' has no attribute {name!r}")
    warn(f"{package}.{name}", f"{module}.{name}", stacklevel=4)
    return getattr(target, name)


class _Alias(importlib.abc.Loader):
    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new

    def create_module(self, spec: Any) -> ModuleType:
        warn(self.old, self.new, stacklevel=6)
        return importlib.import_module(f"transient_nb.{self.new}")

    def exec_module(self, module: ModuleType) -> None:
        # The new module is executed already: the old name is only another key for it.
        pass


class MovedFinder(importlib.abc.MetaPathFinder):
    """Finds the old module paths of :data:`MOVED` (and the modules under ``views``)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if not fullname.startswith("transient_nb."):
            return None
        old = fullname[len("transient_nb.") :]
        new = MOVED.get(old)
        if new is None and old.startswith("views."):
            new = "notebook." + old
        if new is None:
            return None
        return importlib.util.spec_from_loader(fullname, _Alias(old, new))


def install() -> None:
    """Put :class:`MovedFinder` on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, MovedFinder) for f in sys.meta_path):
        sys.meta_path.append(MovedFinder())
