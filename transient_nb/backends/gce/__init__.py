"""Google Compute Engine: Spot VMs through google-cloud-compute, behind one small API wrapper.

Before 0.2 this was one module; its names (``GCEBackend``, ``GCEError`` ...) are still found
here for one release, with a ``DeprecationWarning``: import them from
:mod:`transient_nb.backends.gce.backend`.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    from transient_nb._moved import forward

    return forward("backends.gce", "backends.gce.backend", name)
