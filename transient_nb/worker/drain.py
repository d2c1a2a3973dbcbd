"""Drain hooks: what a worker does with a preemption notice before its VM is stopped.

Other parts of transient_nb register hooks here (the trainer pushes its last gradient); the
preload's ``transient_notice`` handler runs them all, bounded by the notice's deadline, posts
``drained`` and closes the worker with its nanny.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from transient_nb.eventlog.vocabulary import TOPIC, make_event
from transient_nb.worker.identity import vm_name

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


async def drain_and_close(worker: Any, deadline: float) -> None:
    t0 = time.time()
    errors = await run_drain_hooks(deadline)
    worker.log_event(
        TOPIC,
        make_event(
            "drained",
            worker=vm_name(worker),
            hooks=len(_hooks),
            seconds=time.time() - t0,
            errors=errors,
        ),
    )
    # Let the event reach the scheduler before the connection goes away.
    await asyncio.sleep(0.05)
    await worker.close(reason="transient-preempted", nanny=True)
