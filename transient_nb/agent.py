"""The part of transient_nb that runs inside every worker process.

Loaded with ``--preload transient_nb.agent`` by every backend's worker command line. It gives the
worker a ``transient_notice`` handler: when the provider announces a preemption, the worker runs
the *drain hooks* that other parts registered (the trainer pushes its last gradient there), posts
what happened to the event log, and closes itself with its nanny before the VM is stopped.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from transient_nb.events import TOPIC, make_event

logger = logging.getLogger(__name__)

#: A drain hook gets the wall-clock deadline (UNIX seconds) by which the VM will be gone.
DrainHook = Callable[[float], "Awaitable[Any] | Any"]

_hooks: list[DrainHook] = []
#: Seconds kept free before the deadline for the worker to close itself.
CLOSE_MARGIN_S = 0.5


def register_drain_hook(hook: DrainHook) -> None:
    """Run ``hook(deadline)`` in this worker process when a preemption notice arrives.

    Examples
    --------
    >>> def hook(deadline):
    ...     print("leaving before", deadline)
    >>> register_drain_hook(hook)
    >>> unregister_drain_hook(hook)
    """
    _hooks.append(hook)


def unregister_drain_hook(hook: DrainHook) -> None:
    """Forget a hook registered with :func:`register_drain_hook`."""
    if hook in _hooks:
        _hooks.remove(hook)


async def run_drain_hooks(deadline: float) -> list[str]:
    """Run every registered hook concurrently until ``deadline``; returns the errors seen."""
    errors: list[str] = []

    async def _one(hook: DrainHook) -> None:
        try:
            result = hook(deadline)
            if inspect.isawaitable(result):
                await result
        except Exception as e:  # a failing hook must not keep the others from draining
            errors.append(f"{getattr(hook, '__qualname__', hook)}: {e!r}")

    timeout = max(0.0, deadline - time.time() - CLOSE_MARGIN_S)
    tasks = [asyncio.ensure_future(_one(h)) for h in list(_hooks)]
    if tasks:
        _, pending = await asyncio.wait(tasks, timeout=timeout)
        for t in pending:
            t.cancel()
            errors.append("drain hook did not finish before the deadline")
    return errors


def _vm_name(worker: Any) -> str:
    # The VM's name as the cluster knows it (set by the backend's command line).
    try:
        return str(json.loads(os.environ["TRANSIENT_NB_VM"])["name"])
    except (KeyError, ValueError):
        return str(worker.name)


async def _drain_and_close(worker: Any, deadline: float) -> None:
    t0 = time.time()
    errors = await run_drain_hooks(deadline)
    worker.log_event(
        TOPIC,
        make_event(
            "drained",
            worker=_vm_name(worker),
            hooks=len(_hooks),
            seconds=time.time() - t0,
            errors=errors,
        ),
    )
    # Let the event reach the scheduler before the connection goes away.
    await asyncio.sleep(0.05)
    await worker.close(reason="transient-preempted", nanny=True)


def dask_setup(worker: Any) -> None:
    """Dask preload entry point: install the notice handler on ``worker``."""
    state: dict[str, asyncio.Task[None]] = {}

    async def transient_notice(deadline: float) -> str:
        if "task" not in state:
            logger.warning("Preemption notice: worker %s leaves by %.1f", worker.name, deadline)
            state["task"] = asyncio.ensure_future(_drain_and_close(worker, deadline))
        return "draining"

    worker.handlers["transient_notice"] = transient_notice
    if getattr(getattr(worker, "state", None), "total_resources", {}).get("gpu"):
        _warm_up()


def _warm_up() -> None:
    """Import torch and the trainer in a thread while the worker registers.

    A replacement's first update waits for these imports (1-3 s of torch alone on a cold
    process); started here, they overlap with the worker's registration and the driver's
    actor submission instead of following them. The import lock makes a trainer that comes
    first simply wait for the rest of the import.
    """

    def load() -> None:
        try:
            import transient_nb.training.trainer  # noqa: F401  (torch, models, data)
        except Exception:  # a worker without torch still serves the cluster
            logger.debug("Warm-up import failed", exc_info=True)

    threading.Thread(target=load, name="transient-warm-up", daemon=True).start()
