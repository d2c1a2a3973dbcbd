"""The preload of every worker process: ``--preload transient_nb.worker.preload``.

It gives the worker a ``transient_notice`` handler: when the provider announces a preemption,
the worker runs the drain hooks (:mod:`transient_nb.worker.drain`), posts what happened to the
event log, and closes itself with its nanny before the VM is stopped.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import dask.config

from transient_nb.worker.drain import drain_and_close

logger = logging.getLogger(__name__)

#: The warm-up preload, left off a command line where ``transient.warm-up`` is false.
WARM_UP_PRELOAD = "transient_nb.training.warmup"
#: The preloads of every worker's command line, in order: the notice handler, the warm-up of the
#: training code on GPU workers (:mod:`transient_nb.training.warmup`), then the guard of what other
#: VMs may ask of it (:mod:`transient_nb.worker.guard`), last so that it guards the handlers the
#: others added.
WORKER_PRELOADS = (
    "transient_nb.worker.preload",
    WARM_UP_PRELOAD,
    "transient_nb.worker.guard",
)
#: The preloads of every worker's nanny (``--preload-nanny``): the same guard.
NANNY_PRELOADS = ("transient_nb.worker.guard",)


def worker_preloads(warm_up: bool | None = None) -> tuple[str, ...]:
    """The preloads of a worker's command line: :data:`WORKER_PRELOADS`, without the warm-up
    where ``warm_up`` (default: the ``transient.warm-up`` key) is false.

    The backends ask this when they write a VM's command line, on the cluster's side, so that
    the setting of the notebook (or the head) decides, not whatever the VM's configuration says.

    Examples
    --------
    >>> worker_preloads(warm_up=False)
    ('transient_nb.worker.preload', 'transient_nb.worker.guard')
    """
    if warm_up is None:
        warm_up = bool(dask.config.get("transient.warm-up", True))
    return WORKER_PRELOADS if warm_up else tuple(p for p in WORKER_PRELOADS if p != WARM_UP_PRELOAD)


def dask_setup(worker: Any) -> None:
    """Dask preload entry point: install the notice handler on ``worker``."""
    state: dict[str, asyncio.Task[None]] = {}

    async def transient_notice(deadline: float) -> str:
        if "task" not in state:
            logger.warning("Preemption notice: worker %s leaves by %.1f", worker.name, deadline)
            state["task"] = asyncio.ensure_future(drain_and_close(worker, deadline))
        return "draining"

    worker.handlers["transient_notice"] = transient_notice
