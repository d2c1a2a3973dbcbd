"""Preemptions and spares: a worker preempted by hand or by the simulator (with its notice, then
its replacement, as a provider's revocation goes), and spares asked for ahead of the revocations
the lifetime model predicts (``replace_at="ahead"``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from transient_nb.backends import TransientVM
from transient_nb.catalog.lifetimes import PAPER_STARTUP_S
from transient_nb.deploy.provisioning import Provisioning
from transient_nb.policy.spares import JOIN_S, due_for_spare


class Preemption(Provisioning):
    """Preempting workers (by hand, by the simulator) and asking for spares ahead of it."""

    def _lifetime_model(self) -> Any:
        """The model of worker lifetimes that odds of revocation are read from: the simulator's,
        or, where it has none (a cloud), the paper's curves."""
        from transient_nb.catalog.lifetimes import NoPreemption, PaperLifetimesByGpu

        model = self.simulator.model
        return PaperLifetimesByGpu() if isinstance(model, NoPreemption) else model

    # -- spares ahead of predicted revocations (replace_at="ahead") ----------------------------------
    def _lead_s(self) -> float:
        """Wall seconds a new worker takes from being asked for to joining: measured (the mean
        of the last five), else the provisioning delay plus ``spares.JOIN_S``."""
        if self._join_waits:
            return sum(self._join_waits) / len(self._join_waits)
        lo, hi = PAPER_STARTUP_S["spot"]
        delay = (lo + hi) / 2 if self.provisioning_delay == "paper" else self.provisioning_delay
        return float(delay) / self.time_scale + JOIN_S

    async def _spare_ahead(self) -> None:
        """Ask for a spare for each Spot worker whose revocation the lifetime model predicts
        within the lead time (:func:`transient_nb.policy.spares.due_for_spare`)."""
        model = self._lifetime_model()
        while not self._closing:
            lead = self._lead_s()
            now = time.time()
            for vm in list(self.workers.values()):
                since = getattr(vm, "running_since", None)
                if (
                    vm.spec.role != "worker"
                    or not vm.spec.spot
                    or vm.stopped
                    or since is None
                    or vm.name in self._spared
                    or not self._working(vm)
                ):
                    continue
                age_s = (now - since) * self.time_scale
                gpu = self._asked_gpu(vm)
                odds = due_for_spare(model, gpu, age_s, lead * self.time_scale, vm.spec.zone)
                if odds is None:
                    continue
                self._spared.add(vm.name)
                slot = self._free_slot()
                self._slots[slot] = ""  # reserved now: no other request takes it meanwhile
                self._slot_gpu[slot] = gpu
                self._spare_slots.add(slot)
                await self._post(
                    "spare-requested",
                    worker=vm.name,
                    role="worker",
                    gpu=gpu,
                    odds=round(odds, 4),
                    age_s=round(age_s, 1),
                    lead_s=round(lead * self.time_scale, 1),
                )
                self._spawn(self._provision("worker", slot=slot, gpu=gpu))
            await asyncio.sleep(min(1.0, max(0.05, lead / 10)))

    # -- preemption ----------------------------------------------------------------------------------
    def _worker_vms(self) -> list[TransientVM]:
        return [
            w
            for w in self.workers.values()
            if w.spec.role == "worker" and not w.stopped and w.lifecycle not in ("notice",)
        ]

    def _resolve_targets(self, target: int | str | Sequence[str]) -> list[str]:
        if isinstance(target, bool):
            raise ValueError(f"preempt({target!r}): give a number of workers or worker names.")
        if isinstance(target, int):
            if target < 1:
                raise ValueError(f"preempt({target}): the number of workers must be at least 1.")
            candidates = sorted(
                w.name for w in self._worker_vms() if w.lifecycle in ("running", "joined")
            )
            if not candidates:
                candidates = sorted(w.name for w in self._worker_vms())
            if target > len(candidates):
                raise ValueError(
                    f"preempt({target}): only {len(candidates)} worker(s) can be preempted now "
                    f"({', '.join(candidates) or 'none'})."
                )
            return self._rng.sample(candidates, target)
        names = [target] if isinstance(target, str) else list(target)
        for n in names:
            vm = self.workers.get(n)
            if vm is None or vm.spec.role != "worker":
                known = ", ".join(sorted(w.name for w in self._worker_vms())) or "none"
                raise ValueError(f"No preemptible worker named {n!r}: use one of {known}.")
        return names

    async def _preempt(
        self, target: int | str | Sequence[str] = 1, notice: bool = True
    ) -> list[str]:
        names = self._resolve_targets(target)
        for n in names:
            self._spawn(self._preempt_one(n, notice, "manual"))
        return names

    async def _preempt_one(self, name: str, notice: bool, source: str) -> None:
        vm = self.workers.get(name)
        if vm is None or vm.stopped or self._closing:
            return
        self.simulator.vm_gone(name)
        if source != "manual":
            self.placement.record_preemption(vm.spec.gpu, vm.spec.zone)
        deadline = None
        if notice:
            deadline = time.time() + self.notice_s / self.time_scale
            await vm.post("notice", deadline=deadline, source=source)
            if self.replace_at == "notice":
                self._spawn(self._maybe_replace(vm))
        await vm.preempt(notice=notice, deadline=deadline)
        await vm.post("preempted", notice=notice, source=source)
        self._forget(vm)
        if self.replace_at == "preempted" or not notice:
            await self._maybe_replace(vm)

    def preempt(self, target: int | str | Sequence[str] = 1, notice: bool = True) -> Any:
        """Preempt workers now, as the provider would.

        Parameters
        ----------
        target
            How many workers (chosen at random among the running ones), or a worker name, or a
            list of names.
        notice
            Give the preemption notice first (the worker drains and leaves); ``False`` kills at
            once, as a crash would.

        Returns
        -------
        The names of the workers being preempted (the preemptions go on in the background).
        """
        return self.sync(self._preempt, target, notice=notice)
