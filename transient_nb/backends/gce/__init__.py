"""Google Compute Engine: Spot VMs through google-cloud-compute, behind one small API wrapper.

Before 0.2 this was one module; its names (``GCEBackend``, ``GCEError`` ...) are still found
here for one release, with a ``DeprecationWarning``: import them from
:mod:`transient_nb.backends.gce.backend`.
"""

from __future__ import annotations

import importlib
from typing import Any


def __getattr__(name: str) -> Any:
    backend = importlib.import_module("transient_nb.backends.gce.backend")
    if name.startswith("__") or not hasattr(backend, name):
        raise AttributeError(f"module 'transient_nb.backends.gce' has no attribute {name!r}")
    from transient_nb._moved import warn

    warn(f"backends.gce.{name}", f"backends.gce.backend.{name}")
    return getattr(backend, name)
