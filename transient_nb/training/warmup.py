"""Warm-up preload of GPU workers: ``--preload transient_nb.training.warmup``.

A replacement's first update waits for the imports of torch and the trainer (1-3 s of torch
alone on a cold process). Started in a thread while the worker registers, they overlap with the
registration and the driver's actor submission instead of following them; the import lock makes
a trainer that comes first simply wait for the rest of the import. Clusters with
``transient.warm-up`` false leave it off their workers' command lines.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

logger = logging.getLogger(__name__)


def dask_setup(worker: Any) -> None:
    """Dask preload entry point: on a GPU worker, import the trainer in the background."""
    if getattr(getattr(worker, "state", None), "total_resources", {}).get("gpu"):
        warm_up()


def warm_up() -> threading.Thread:
    """Import torch and the trainer in a daemon thread; returns it."""

    def load() -> None:
        try:
            import transient_nb.training.trainer  # noqa: F401  (torch, models, data)
        except Exception:  # a worker without torch still serves the cluster
            logger.debug("Warm-up import failed", exc_info=True)

    thread = threading.Thread(target=load, name="transient-warm-up", daemon=True)
    thread.start()
    return thread
