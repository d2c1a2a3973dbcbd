"""The preemption simulator of the local backend: it really kills worker VMs.

It draws each worker's lifetime from the preemption model when the worker starts running (or
replays a trace from the cluster's start) and, when the time comes, asks the cluster to preempt the
worker with a notice, exactly as a provider's notice would arrive. Times are simulated seconds,
divided by ``time_scale`` to get wall-clock seconds.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable

from transient_nb.catalog.lifetimes import PreemptionModel, Trace, model_of

logger = logging.getLogger(__name__)

Preempt = Callable[[str, bool, str], Awaitable[object]]


class PreemptionSimulator:
    """Schedules preemptions of worker VMs.

    Parameters
    ----------
    model
        Where lifetimes (or trace entries) come from.
    time_scale
        Simulated seconds per wall-clock second.
    preempt
        ``preempt(name, notice, source)`` coroutine function of the cluster.
    slot_holder
        Returns the name of the worker that holds a slot now (for ``slot:N`` trace targets).
    rng
        Random source (seeded by the cluster for reproducible runs).
    """

    def __init__(
        self,
        model: PreemptionModel,
        time_scale: float,
        preempt: Preempt,
        slot_holder: Callable[[int], str | None],
        rng: random.Random,
    ):
        self.model = model
        self.time_scale = time_scale
        self._preempt = preempt
        self._slot_holder = slot_holder
        self.rng = rng
        self._handles: dict[str, asyncio.TimerHandle] = {}
        self._trace_handles: list[asyncio.TimerHandle] = []
        self._tasks: set[asyncio.Task[object]] = set()
        self.stopped = False

    def start(self) -> None:
        """Start replaying the trace, if the model is one."""
        if isinstance(self.model, Trace):
            loop = asyncio.get_running_loop()
            for entry in self.model.entries:
                self._trace_handles.append(
                    loop.call_later(
                        entry.time_s / self.time_scale, self._fire_trace, entry.target, entry.notice
                    )
                )

    def vm_running(self, name: str, gpu: str | None = None, zone: str | None = None) -> None:
        """A worker VM of type ``gpu`` started running: draw its lifetime.

        A model with a ``for_zone`` method (``preemption="zones:..."``) draws from that zone's
        model, and one with a ``for_gpu`` method (``preemption="paper"``) from that type's curve
        (:func:`~transient_nb.catalog.lifetimes.model_of`).
        """
        if self.stopped:
            return
        model = model_of(self.model, gpu, zone)
        lifetime = model.lifetime(self.rng)
        if lifetime is None:
            return
        loop = asyncio.get_running_loop()
        self._handles[name] = loop.call_later(lifetime / self.time_scale, self._fire, name, True)

    def vm_gone(self, name: str) -> None:
        """A worker VM is gone for another reason: forget its scheduled preemption."""
        handle = self._handles.pop(name, None)
        if handle is not None:
            handle.cancel()

    def _fire(self, name: str, notice: bool) -> None:
        self._handles.pop(name, None)
        if self.stopped:
            return
        task = asyncio.ensure_future(self._preempt(name, notice, "simulator"))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _fire_trace(self, target: str, notice: bool) -> None:
        name = self._slot_holder(int(target[5:])) if target.startswith("slot:") else target
        if name is None:
            logger.info("Trace preemption of %s: no worker holds it now", target)
            return
        self._fire(name, notice)

    def stop(self) -> None:
        """Cancel everything still scheduled."""
        self.stopped = True
        for handle in [*self._handles.values(), *self._trace_handles]:
            handle.cancel()
        self._handles.clear()
        self._trace_handles.clear()
