"""Provisioning and replacement: ask the backend for VMs, watch them, replace what is lost.

Every VM the cluster asks for goes through :meth:`Provisioning._provision` (the placement
policy's zones and GPU types in order, stock-outs, quotas and backoff); a VM that is lost
(preempted, killed, never joined) is forgotten and replaced by its slot's type; spares go ahead of
predicted revocations (:mod:`~transient_nb.deploy.preemption`); preemptions by hand or by the
simulator take the same path.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import Any

from transient_nb.backends import CapacityError, QuotaError, TransientVM, VMSpec
from transient_nb.catalog.lifetimes import parse_delay
from transient_nb.deploy.core import ClusterCore
from transient_nb.limits import LimitError
from transient_nb.policy.placement import Placement

logger = logging.getLogger(__name__)


class Provisioning(ClusterCore):
    """The VMs of a cluster: asked for, watched, replaced (see the module's docstring)."""

    def _on_demand_held(self, gpu: str) -> int:
        """On-demand workers of ``gpu`` live or being asked for."""
        live = sum(1 for w in self._worker_vms_of(gpu) if not w.spec.spot)
        asking = sum(
            1
            for s in self._on_demand_slots
            if self._slots.get(s) == "" and self._slot_gpu.get(s) == gpu
        )
        return live + asking

    def _asked_gpu(self, vm: TransientVM) -> str:
        """The type ``vm`` was asked for (its slot's), which a fallback may differ from."""
        slot = vm.spec.slot
        if slot is not None and slot in self._slot_gpu:
            return self._slot_gpu[slot]
        return vm.spec.gpu or self.gpu

    def _worker_vms_of(self, gpu: str, exclude: TransientVM | None = None) -> list[TransientVM]:
        """Live worker VMs asked for as ``gpu`` (``exclude``, one at its notice, left out)."""
        return [
            w
            for w in self.workers.values()
            if w.spec.role == "worker"
            and w is not exclude
            and not w.stopped
            and self._asked_gpu(w) == gpu
        ]

    def _live_workers(self, gpu: str, exclude: TransientVM | None = None) -> int:
        """How many live worker VMs are asked for as ``gpu`` (``exclude`` not counted)."""
        return len(self._worker_vms_of(gpu, exclude))

    def _free_slot(self) -> int:
        used = set(self._slots)
        return next(i for i in range(len(used) + 1) if i not in used)

    def _slot_holder(self, slot: int) -> str | None:
        return self._slots.get(slot)

    def _delay(self, spot: bool) -> float:
        return parse_delay(self.provisioning_delay, spot=spot, rng=self._rng) / self.time_scale

    def _make_vm(self, spec: VMSpec) -> TransientVM:
        assert self.scheduler is not None
        return self.backend.make_vm(
            spec,
            scheduler_address=self.scheduler.address,
            post=self._post,
            on_running=self._vm_running,
            on_exit=self._vm_exited,
            on_gone=self._vm_gone,
            delay_s=self._delay(spec.spot),
            connection_args=self.security.get_connection_args("client"),
        )

    def _zones(self) -> list[str]:
        return self.placement.zones()

    def _spec(self, role: str, name: str, p: Placement, slot: int | None) -> VMSpec:
        if role == "ps":
            machine = self.ps_machine_type
            if self.settings.head_machine_type is not None and self.backend.hosts_next_ps():
                # The PS host is the head VM itself: billed as its own machine type.
                machine = self.settings.head_machine_type
            price = self.catalog.machine_price(machine, p.zone)
            return VMSpec(name, "ps", None, p.zone, False, machine, price, None, {"ps": 1})
        price = self.catalog.worker_price(p.gpu, self.machine_type, p.zone)
        return VMSpec(
            name, "worker", p.gpu, p.zone, p.spot, self.machine_type, price, slot, {"gpu": 1}
        )

    async def _provision(
        self, role: str, slot: int | None = None, gpu: str | None = None, zone: str | None = None
    ) -> str | None:
        """Ask the backend for one VM, trying the policy's placements in order.

        The PS host tries the preferred zone and then the fallback zones too. Whatever goes
        wrong, the worker's slot is released (so that ``scale`` and replacements can fill it
        again), and a failure that is not a stock-out is retried after a growing pause.
        """
        if role == "ps":
            # In ``zone`` only (a move: elsewhere would be no move), else where the PS runs
            # first (its first host's zone, or where it was moved), then the other zones.
            home = self.placement.ps_zone or self.zone
            zones = [zone] if zone else list(dict.fromkeys([home, *self._zones()]))
            placements = [Placement("", z, False) for z in zones]
        else:
            slot = self._free_slot() if slot is None else slot
            gpu = gpu or self._slot_gpu.get(slot) or self.gpu
            self._slot_gpu[slot] = gpu
            # On demand while the type has fewer on-demand workers than asked for (a Spot
            # cluster's on-demand share, from scale(on_demand=...)).
            on_demand = self.spot and self._on_demand_held(gpu) < self._on_demand.get(gpu, 0)
            placements = list(self.placement.candidates(gpu, on_demand_first=on_demand))
            self._slots[slot] = ""  # reserved while we ask
            if on_demand:
                self._on_demand_slots.add(slot)
        self._last_failure = ""
        skip_regions: set[str] = set()
        failed = False
        refused: LimitError | None = None
        try:
            for p in placements:
                if self._closing:
                    break
                region = p.zone.rsplit("-", 1)[0]
                if region in skip_regions or "global" in skip_regions:
                    continue
                spec = self._spec(role, "", p, slot)
                try:
                    self._check_new_vm(spec)
                except LimitError as e:
                    refused = e
                    if e.limit == "max_workers":
                        break  # no placement adds fewer workers
                    continue  # a cheaper placement may fit
                name = self._next_name(role)
                asked_at = time.time()
                spec = dataclasses.replace(spec, name=name)
                vm = self._make_vm(spec)
                # Counted by the limits while it is being asked for (requests run side by side).
                self._asking[name] = spec
                try:
                    await vm.start()
                except QuotaError as e:
                    # A quota is not a stock-out: waiting does not help, and the other zones of
                    # its region (every region, for GPUS_ALL_REGIONS) share it.
                    skip_regions.add(e.region)
                    self._last_failure = str(e)
                    await self._post(
                        "quota-exceeded",
                        worker=name,
                        role=role,
                        gpu=p.gpu or None,
                        zone=p.zone,
                        quota=e.quota,
                        region=e.region,
                        limit=e.limit,
                        message=str(e),
                    )
                    self._log(str(e))
                    continue
                except CapacityError as e:
                    if role == "worker":
                        self.placement.remember_stockout(p)
                    self._last_failure = f"{p.zone}: {e.reason}"
                    await self._post(
                        "stockout", worker=name, gpu=p.gpu or None, zone=p.zone, reason=e.reason
                    )
                    what = f"{p.gpu} capacity" if p.gpu else f"{self.ps_machine_type} capacity"
                    self._log(f"{p.zone} has no {what}; trying the next placement")
                    continue
                except asyncio.CancelledError:
                    raise
                except Exception as e:
                    # Not the zone's fault (a request that failed after its retries, a name
                    # someone else holds): the next placement would likely fail the same way.
                    failed = True
                    self._last_failure = str(e)
                    await self._post(
                        "provision-failed", worker=name, role=role, zone=p.zone, error=str(e)
                    )
                    self._log(f"Could not create {role} VM {name}: {e}")
                    break
                finally:
                    self._asking.pop(name, None)
                if role == "ps" and not any(
                    w.spec.role == "ps" and not w.stopped for w in self.workers.values()
                ):
                    # The PS's first host: replacements go near it first (its region).
                    self.placement.ps_zone = p.zone
                self.worker_spec[name] = {"cls": type(vm), "options": {"spec": spec}}
                self.workers[name] = vm
                self._asked_at[name] = asked_at
                if slot is not None:
                    self._slots[slot] = name
                return name
        finally:
            # Whatever happened (an exception included), an unfilled reservation goes.
            if slot is not None:
                self._on_demand_slots.discard(slot)
                if self._slots.get(slot) == "":
                    del self._slots[slot]
        if self._closing:
            return None
        if failed:
            if role == "worker":
                self._spawn(self._retry_later(role, slot, "its request failed"))
            return None
        if refused is not None and not self._last_failure:
            # The limits, not the provider: neither a stock-out to remember nor one to retry.
            self._last_failure = str(refused)
            await self._post(
                "limit-refused",
                role=role,
                gpu=gpu if role == "worker" else None,
                limit=refused.limit,
                reason=str(refused),
            )
            self._log(str(refused))
            return None
        await self._post(
            "capacity-exhausted",
            role=role,
            gpu=gpu if role == "worker" else None,
            zone=self.zone,
            reason=self._last_failure,
        )
        if role == "ps" and self._started_once and zone is None:
            # A run cannot go on without its PS host: keep asking, with a growing pause.
            self._spawn(self._retry_later(role, None, "no zone could place the PS host"))
        if skip_regions:
            self._log(f"No {role} VM could be created: a quota is used up ({self._last_failure})")
        else:
            self._log(
                f"No capacity left for a {role} in any allowed zone or GPU type; the cluster "
                "runs with fewer workers. Add fallback_zones/fallback_gpus, or allow on-demand."
            )
        return None

    def _backoff(self) -> float:
        """Pause before the next attempt after ``self._failures`` start failures in a row."""
        if self._failures <= 0:
            return 0.0
        return float(min(self._backoff_max_s, self._backoff_s * 2 ** (self._failures - 1)))

    async def _retry_later(self, role: str, slot: int | None, why: str) -> None:
        """Ask again for a VM after a start failure, backing off while the failures go on."""
        self._failures += 1
        delay = self._backoff()
        if self._failures >= 2:
            await self._post(
                "crash-loop", role=role, failures=self._failures, delay_s=delay, reason=why
            )
            self._log(
                f"{self._failures} {role} VMs in a row failed ({why}); the next attempt is in "
                f"{delay:g} s. See the VM logs (the run folder; on GCE, the serial console)."
            )
        if slot is not None:
            self._slots[slot] = ""  # still reserved: scale() must not ask twice meanwhile
        try:
            await asyncio.sleep(delay)
        finally:
            if slot is not None and self._slots.get(slot) == "":
                del self._slots[slot]
        if self._closing:
            return
        gpu = self._slot_gpu.get(slot, self.gpu) if slot is not None else self.gpu
        if role == "worker" and self._live_workers(gpu) >= self._mix.get(gpu, 0):
            return
        await self._provision(role, slot=slot, gpu=gpu if role == "worker" else None)

    def _vm_running(self, vm: TransientVM) -> None:
        # Only a Spot VM has a lifetime to draw: the provider never revokes an on-demand one
        # (an on-demand fallback, or a share asked for with scale(on_demand=...)).
        if vm.spec.role == "worker" and vm.spec.spot:
            self.simulator.vm_running(vm.name, vm.spec.gpu, vm.spec.zone)
        self._spawn(self._join_watchdog(vm))

    def _membership(self, kind: str, name: str) -> None:
        """A worker joined or left the scheduler (called by the monitor)."""
        if kind == "joined":
            vm = self.workers.get(name)
            if isinstance(vm, TransientVM):
                vm.worker_left = False
                if vm.notice_deadline is not None:
                    self._spawn(vm.joined_during_notice())
            self._joined.add(name)
            self._failures = 0  # a VM that works ends a run of failures
            asked = self._asked_at.pop(name, None)
            if asked is not None:
                self._join_waits = [*self._join_waits[-4:], time.time() - asked]
        elif kind == "left":
            vm = self.workers.get(name)
            if isinstance(vm, TransientVM):
                vm.mark_left()

    async def _join_watchdog(self, vm: TransientVM) -> None:
        """Delete and replace a VM that runs but whose worker never joins (it would bill on)."""
        timeout = self.limits.join_timeout_s
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if vm.name in self._joined or vm.stopped or self._closing:
                return
            await asyncio.sleep(min(1.0, timeout / 20))
        if vm.name in self._joined or vm.stopped or self._closing or vm.name not in self.workers:
            return
        waited = time.monotonic() - t0
        # Billed from "running", with the provider's minimum: what the user paid for nothing.
        billed_s = max(waited * self.time_scale, self.catalog.minimum_s)
        cost = vm.spec.price.rate(vm.spec.spot) * billed_s / 3600
        await vm.post("join-timeout", waited_s=waited, cost=cost)
        self._log(
            f"VM {vm.name} ran {waited:.0f} s without its worker joining (about ${cost:.4f} "
            "spent on it); deleting it and asking for another. Check the image, the startup "
            "log and the firewall."
        )
        self._forget(vm)
        await vm.close()
        if self._lost_in_move(vm):
            return
        if vm.spec.role == "ps" or self.replace:
            await self._retry_later(vm.spec.role, vm.spec.slot, "its worker never joined")

    def _vm_gone(self, vm: TransientVM) -> None:
        """A VM is gone: its certificates are revoked, so a copy of its key is good for nothing
        (the scheduler's guard refuses what the CA no longer knows)."""
        ca = getattr(self.backend, "ca", None)
        if ca is not None and ca.revoke(vm.name):
            logger.info("Revoked the certificate of VM %s (gone)", vm.name)

    def _vm_exited(self, vm: TransientVM) -> None:
        # A VM that stopped without us asking: a crash, or a kill from outside.
        if not self._closing:
            self._spawn(self._lost(vm))

    async def _lost(self, vm: TransientVM) -> None:
        if vm.name not in self.workers or vm.stopped:
            return
        vm.stopped = True
        await self._post("preempted", **vm.spec.event_fields(), notice=False, source="lost")
        self._forget(vm)
        if vm.spec.spot and self.backend.name != "local":
            # A cloud Spot VM that stopped by itself was most likely preempted without notice.
            self.placement.record_preemption(vm.spec.gpu, vm.spec.zone)
        if self._lost_in_move(vm):
            return
        if vm.name not in self._joined:
            # It died before its worker ever joined: a crash on start. Replacing it at once
            # would crash again and again (and bill each boot): back off instead.
            if self.replace or vm.spec.role == "ps":
                await self._post(
                    "replacement-requested", worker=vm.name, role=vm.spec.role, slot=vm.spec.slot
                )
                await self._retry_later(vm.spec.role, vm.spec.slot, "worker crashed on start")
            return
        await self._maybe_replace(vm)

    def _forget(self, vm: TransientVM) -> None:
        self.worker_spec.pop(vm.name, None)
        self.workers.pop(vm.name, None)
        self.simulator.vm_gone(vm.name)
        if vm.spec.slot is not None and self._slots.get(vm.spec.slot) == vm.name:
            del self._slots[vm.spec.slot]

    def _lost_in_move(self, vm: TransientVM) -> bool:
        """Whether ``vm`` is a new PS host of a move the run has not made yet (it is not
        replaced: its successor would start in the old zone, and the move would wait for a
        host that never comes; the move fails instead, see :meth:`_move_ps`)."""
        if vm.name not in self._ps_move_hosts:
            return False
        self._ps_move_lost.append(vm.name)
        return True

    async def _maybe_replace(self, vm: TransientVM) -> None:
        if self._closing or not (self.replace or vm.spec.role == "ps"):
            return
        if self._lost_in_move(vm):
            return
        gpu = None
        if vm.spec.role == "worker":
            # The type asked for, not the one it landed on: a fallback's replacement tries the
            # preferred type again. The VM being replaced does not count: at its notice it is
            # still in self.workers.
            gpu = self._asked_gpu(vm)
            live = self._live_workers(gpu, exclude=vm) + self._spares_coming(gpu)
            if live >= self._mix.get(gpu, 0):
                return  # a spare asked for ahead of this revocation takes its place
        await self._post(
            "replacement-requested",
            worker=vm.name,
            role=vm.spec.role,
            slot=vm.spec.slot,
            **({"gpu": gpu} if gpu else {}),
        )
        await self._provision(vm.spec.role, slot=vm.spec.slot, gpu=gpu)

    def _working(self, vm: Any) -> bool:
        """Whether ``vm``'s worker has joined and not left (the scheduler's membership; a VM's
        own lifecycle ends at "running")."""
        return vm.name in self._joined and not getattr(vm, "worker_left", False)

    def _spares_coming(self, gpu: str) -> int:
        """Spares of type ``gpu`` asked for and not placed yet (their slots still reserved)."""
        self._spare_slots = {s for s in self._spare_slots if self._slots.get(s) == ""}
        return sum(1 for s in self._spare_slots if self._slot_gpu.get(s) == gpu)
