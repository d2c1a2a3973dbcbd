"""The core of a TransientCluster: its state, its events, its money and its limits.

The cluster is one class made of parts, one module each, stacked in this order (each part may
use the ones below it): :class:`ClusterCore` (state, event log, cost, limits), provisioning and
replacement (:mod:`~transient_nb.deploy.provisioning`), scaling (:mod:`~transient_nb.deploy.scaling`),
the PS hosts (:mod:`~transient_nb.deploy.ps_hosts`), control requests
(:mod:`~transient_nb.deploy.control`), and :class:`~transient_nb.deploy.cluster.TransientCluster`
itself (settings, start and close).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import warnings
from typing import Any

import pandas as pd
from dask.utils import parse_timedelta
from distributed import Scheduler
from distributed.deploy.spec import SpecCluster

from transient_nb.backends import Backend, VMSpec
from transient_nb.backends.simulator import PreemptionSimulator
from transient_nb.catalog.mix import Mix, format_mix
from transient_nb.deploy.monitor import TransientMonitor
from transient_nb.deploy.settings import ClusterSettings, SharedSettings
from transient_nb.eventlog.bill import CostReport, compute_costs
from transient_nb.eventlog.folds import vm_states
from transient_nb.eventlog.records import events_frame
from transient_nb.eventlog.vocabulary import TOPIC, make_event
from transient_nb.policy.placement import ReplacementPolicy

logger = logging.getLogger(__name__)


class ClusterCore(SpecCluster, SharedSettings):
    """State, events, money and limits that every part of a :class:`TransientCluster` shares."""

    # What every part of the cluster reads and writes; TransientCluster.__init__ sets them (the
    # settings' own, SharedSettings', too).
    settings: ClusterSettings
    run_path: str
    run_record: str
    backend: Backend
    #: Where new and replacement workers go (a :class:`ReplacementPolicy`).
    placement: ReplacementPolicy
    monitor: TransientMonitor
    simulator: PreemptionSimulator
    control_handlers: dict[str, Any]
    close_hooks: list[Any]
    ps_move_zone: str | None
    _mix: Mix
    _on_demand: dict[str, int]
    _on_demand_slots: set[int]
    _ps_move_hosts: set[str]
    _ps_move_lost: list[str]
    _backoff_s: float
    _backoff_max_s: float
    _rng: random.Random
    _head_info: dict[str, Any]
    _counter: dict[str, int]
    _slots: dict[int, str]
    _slot_gpu: dict[int, str]
    _tasks: set[asyncio.Future[Any]]
    _closing: bool
    _joined: set[str]
    _spared: set[str]
    _spare_slots: set[int]
    _asked_at: dict[str, float]
    _asking: dict[str, VMSpec]
    _join_waits: list[float]
    _last_failure: str
    _started_once: bool
    _failures: int
    _policy: Any

    # -- events ----------------------------------------------------------------------------------------
    @property
    def policy(self) -> ReplacementPolicy:
        """Deprecated name of :attr:`placement` (it never was the transient-aware policy)."""
        warnings.warn(
            "TransientCluster.policy is now TransientCluster.placement (where workers go); "
            "the old name goes in the next release.",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.placement

    async def _post(self, kind: str, **fields: Any) -> None:
        msg = make_event(kind, **fields)
        if isinstance(self.scheduler, Scheduler):
            # In-process scheduler: a direct call keeps events in exactly the order they happen.
            self.scheduler.log_event(TOPIC, msg)
        else:  # pragma: no cover - remote schedulers (cloud backends)
            assert self.scheduler_comm is not None
            await self.scheduler_comm.log_event(topic=TOPIC, msg=msg)

    async def _events(self) -> list[dict[str, Any]]:
        assert self.scheduler_comm is not None, "the cluster has not started"
        return list(await self.scheduler_comm.transient_events())

    def events(self) -> pd.DataFrame:
        """Every event of this run so far, in order, as a DataFrame."""
        if self.asynchronous:
            return self._events_async()
        return events_frame(self.sync(self._events))

    async def _events_async(self) -> pd.DataFrame:
        return events_frame(await self._events())

    def cost(self) -> CostReport:
        """Money spent so far, per VM and in total, beside the on-demand counterfactual."""
        events = self.monitor.events if self.scheduler is not None else []
        return compute_costs(
            list(events), minimum_s=self.catalog.minimum_s, time_scale=self.time_scale
        )

    def vms(self) -> pd.DataFrame:
        """Every VM of the run with its lifecycle state and time in state."""
        return vm_states(list(self.monitor.events))

    # -- provisioning and replacement ---------------------------------------------------------------
    def _next_name(self, role: str) -> str:
        i = self._counter[role]
        self._counter[role] += 1
        return f"w-{i}" if role == "worker" else f"ps-{i}"

    @property
    def _target(self) -> int:
        """Workers asked for, of all types."""
        return sum(self._mix.values())

    @property
    def mix(self) -> Mix:
        """GPU type -> number of workers of that type the cluster keeps (a copy)."""
        return dict(self._mix)

    @property
    def on_demand(self) -> Mix:
        """GPU type -> how many of the mix's workers of that type run on demand (a copy; types
        with none left out). The rest are Spot, on a Spot cluster."""
        return {g: n for g, n in self._on_demand.items() if n > 0}

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Future[Any]) -> None:
        self._tasks.discard(task)
        # A background task's error is logged, never "Task exception was never retrieved".
        if not task.cancelled() and task.exception() is not None:
            logger.error(
                "Background task of cluster %s failed", self.name, exc_info=task.exception()
            )

    # -- money and time limits (transient_nb.limits: one place for every backend) ----------------
    def _check_hourly_cost(
        self, mix: Mix, on_demand: Mix | None = None, ps_hosts: int | None = None
    ) -> None:
        """Refuse, before anything is asked for, a change that would let the cluster hold ``mix``
        (with ``ps_hosts`` PS hosts) at a cost above ``max_hourly_cost``, at the dearest
        placement each VM may get (what ``scale``, ``scale_ps`` and ``move_ps`` check)."""
        self.settings.check_hourly_cost(
            self.placement,
            mix,
            self._on_demand if on_demand is None else on_demand,
            self.ps_hosts if ps_hosts is None else ps_hosts,
            self.limits,
        )

    def _fleet(self) -> tuple[int, float]:
        """GPU workers, and dollars per hour, of every VM this cluster runs or is asking for, each
        at its own price; VMs on their way out (at their notice, or stopped) left out."""
        workers, hourly = 0, 0.0
        specs = [
            vm.spec
            for vm in self.workers.values()
            if not getattr(vm, "stopped", False) and getattr(vm, "lifecycle", "") != "notice"
        ]
        for spec in [*specs, *self._asking.values()]:
            workers += spec.role == "worker"
            hourly += spec.price.rate(spec.spot)
        return workers, hourly

    def _check_new_vm(self, spec: VMSpec) -> None:
        """The one limits check of every VM this cluster creates (:meth:`Limits.check_fleet`):
        ``spec`` beside every VM the cluster runs or is asking for. Raises ``LimitError``."""
        workers, hourly = self._fleet()
        what = f"{'GPU worker' if spec.role == 'worker' else 'PS host'} {spec.name or ''}".strip()
        where = (
            f"{spec.gpu or spec.machine_type} in {spec.zone}{'' if spec.spot else ', on demand'}"
        )
        self.limits.check_fleet(
            workers + (spec.role == "worker"),
            hourly + spec.price.rate(spec.spot),
            f"A new {what} ({where}, ${spec.price.rate(spec.spot):.3f}/h)",
        )

    async def _guard_limits(self) -> None:
        budget, deadline_s = self.limits.budget, self.limits.deadline_s
        if budget is None and deadline_s is None:
            return
        t0 = time.monotonic()
        while not self._closing:
            spent = self.cost().total
            reason = None
            reached = self.limits.reached(spent, time.monotonic() - t0)
            if reached == "budget":
                reason = f"budget of ${budget:.2f} spent (${spent:.4f})"
            elif reached == "deadline":
                reason = f"deadline of {deadline_s:g} s reached"
            if reason is not None:
                await self._post(
                    "limit-reached", reason=reason, cost=spent, budget=budget, deadline_s=deadline_s
                )
                self._log(f"Stopping cluster {self.name}: {reason}")
                self._spawn(self._close())
                return
            await asyncio.sleep(1.0)

    # -- waiting -------------------------------------------------------------------------------------------
    async def _wait_for_workers(
        self, n_workers: int | None = None, timeout: float | None = None
    ) -> None:
        n = self._target if n_workers is None else n_workers
        deadline = None if timeout is None else time.monotonic() + parse_timedelta(timeout)
        while True:
            joined = vm_states(self.monitor.events)
            if not joined.empty:
                working = joined[joined["state"] == "joined"]
                n_gpu = int((working["role"] == "worker").sum())
                n_ps = int((working["role"] == "ps").sum())
                if n_gpu >= n and n_ps >= self.ps_hosts:
                    return
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"Only some of {n} workers joined within {timeout}.")
            await asyncio.sleep(0.05)

    def wait_for_workers(self, n_workers: int | None = None, timeout: float | None = None) -> Any:
        """Block until ``n_workers`` GPU workers (default: the target) and the PS hosts have joined."""
        return self.sync(self._wait_for_workers, n_workers, timeout)

    def __repr__(self) -> str:
        live = {g: n for g, n in self._mix.items() if n}
        what = f"{self._target} x {self.gpu}" if len(live) <= 1 else f"workers {format_mix(live)}"
        return (
            f"<TransientCluster {self.name!r}: {self.backend.name}, {what} "
            f"{'spot' if self.spot else 'on-demand'} in {self.zone}, "
            f"status={self.status.name}>"
        )
