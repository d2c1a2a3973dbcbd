"""The never-preemptible PS hosts: more of them for more shards (``scale_ps``), and a move to
another zone (``move_ps``) that the training run follows.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from distributed.utils import NoOpAwaitable

from transient_nb.deploy.scaling import Scaling
from transient_nb.deploy.settings import (
    positive_int,
)

logger = logging.getLogger(__name__)

#: Most PS hosts a cluster may grow to (scale_ps): past two, the paper's PS gains little.
MAX_PS_HOSTS = 4


class PSHosts(Scaling):
    """``scale_ps`` and ``move_ps``."""

    def scale_ps(self, n: int) -> Any:
        """Keep ``n`` PS hosts: add hosts for more PS shards (a run can only gain shards).

        A run started without ``shards=`` follows: once the new hosts have joined, its driver
        splits the PS into one shard per host, from the PS's own state, and the trainers
        follow the new generation (a ``ps-resharded`` event). The paper measured one 4-vCPU PS
        serving at most about 45 global steps/s and two about 1.75 times that: where fast GPUs
        reach that plateau, a second PS host buys more speed than more workers do.

        Examples
        --------
        >>> cluster.scale_ps(2)  # doctest: +SKIP
        """
        n = positive_int(n, "scale_ps: n")
        if n < self.ps_hosts:
            raise ValueError(
                f"scale_ps({n}): the cluster has {self.ps_hosts} PS hosts and a running PS "
                "cannot give back a shard's host; start a new run on a smaller cluster instead."
            )
        if n > MAX_PS_HOSTS:
            raise ValueError(
                f"scale_ps({n}): at most {MAX_PS_HOSTS} PS hosts (the paper's PS gains 1.75x "
                "from a second host; more shards mostly add cost)."
            )
        before = self.ps_hosts
        if n == before or self._closing:
            return NoOpAwaitable() if self.asynchronous else None
        self.ps_hosts = n
        try:
            self._check_hourly_cost(self._mix)
        except ValueError:
            self.ps_hosts = before
            raise
        assert self.loop is not None
        self.loop.add_callback(self._add_ps_hosts, before, n)
        return NoOpAwaitable() if self.asynchronous else None

    def move_ps(self, zone: str, reason: str = "") -> Any:
        """Move the PS hosts to ``zone``: where most workers run, a PS nearby saves each of
        them the round trips to another region (the paper measured workers there up to 1.48x
        slower).

        New PS hosts (as many as the cluster keeps) are started in ``zone``; once they have
        joined, a training run moves its PS onto them from the PS's own state, as it does when
        it gains a shard (a ``ps-moved`` event; the trainers follow the new generation), and
        the old hosts are given back. With no run training, the old hosts go once the new ones
        have joined. Replacements go near the PS from then on.

        Parameters
        ----------
        zone
            One of the zones the cluster may use (its own and its ``fallback_zones``).
        reason
            Said in the ``ps-move`` event (the transient-aware policy says why it moves).

        Examples
        --------
        >>> cluster.move_ps("us-east1-c")  # doctest: +SKIP
        """
        zones = self._zones()
        if not isinstance(zone, str) or zone not in zones:
            raise ValueError(
                f"move_ps({zone!r}): not a zone this cluster may use ({', '.join(zones)}); add "
                "it to fallback_zones when the cluster starts."
            )
        if self.ps_move_zone is not None:
            raise ValueError(
                f"move_ps({zone!r}): the PS is being moved to {self.ps_move_zone} already; wait "
                "for its ps-moved event, then move it again."
            )
        here = self.placement.ps_zone or self.zone
        if zone == here or self._closing:
            return NoOpAwaitable() if self.asynchronous else None
        # The old hosts bill on until the run has moved: the new ones come on top of them.
        try:
            self._check_hourly_cost(self._mix, ps_hosts=2 * self.ps_hosts)
        except ValueError as e:
            raise ValueError(
                f"move_ps({zone!r}): {self.ps_hosts} new PS host(s) run beside the old until the "
                f"run has moved: {e}"
            ) from None
        self.ps_move_zone = zone
        assert self.loop is not None
        self.loop.add_callback(self._move_ps, here, zone, reason)
        return NoOpAwaitable() if self.asynchronous else None

    def _run_going(self) -> bool:
        """Whether a training run has started on this cluster and not finished."""
        started, finished = set(), set()
        for e in self.monitor.events:
            if e.get("kind") == "train-started":
                started.add(e.get("run"))
            elif e.get("kind") == "train-finished":
                finished.add(e.get("run"))
        return bool(started - finished)

    async def _move_ps(self, here: str, zone: str, reason: str) -> None:
        old = [w for w in self.workers.values() if w.spec.role == "ps" and not w.stopped]
        start = len(self.monitor.events)
        await self._post(
            "ps-move", zone_from=here, zone=zone, hosts=[w.name for w in old], reason=reason
        )
        self._log(f"Moving the PS from {here} to {zone}: {self.ps_hosts} new PS host(s)")
        names = await asyncio.gather(
            *(self._provision("ps", zone=zone) for _ in range(self.ps_hosts))
        )
        hosts = [n for n in names if n]
        if len(hosts) < len(names) or self._closing:
            # No half moves: the hosts that did start go, the PS stays where it is.
            await self._fail_move(hosts, zone, self._last_failure or "the cluster closed")
            return
        # The run moves its PS once the new hosts have joined (it watches for them); without a
        # run, nothing holds the old hosts once the new ones work.
        self._ps_move_hosts = set(hosts)
        self._ps_move_lost = [n for n in hosts if n not in self.workers]  # lost as it started
        try:
            moved = await self._ps_moved(hosts, start)
        finally:
            self._ps_move_hosts = set()
        lost, self._ps_move_lost = self._ps_move_lost, []
        if self._closing:
            return
        if not moved and lost:
            # A new host was lost before the run moved onto it: the move fails whole (the
            # other new hosts go), and the PS goes on where it is; a move may be asked again.
            await self._fail_move(
                hosts,
                zone,
                f"new PS host {lost[0]} was lost before the run moved onto it; the PS stays in "
                f"{here}",
            )
            return
        for vm in old:
            self.worker_spec.pop(vm.name, None)
        self.placement.ps_zone = zone
        await self._correct_state()
        self.ps_move_zone = None
        for _ in lost:
            # Lost as the run moved onto it: a PS host like any other, replaced near the PS.
            self._spawn(self._provision("ps"))

    async def _fail_move(self, hosts: list[str], zone: str, reason: str) -> None:
        """A move to ``zone`` that will not be made: its new ``hosts`` go, the PS stays."""
        for name in hosts:
            self.worker_spec.pop(name, None)
        await self._correct_state()
        self.ps_move_zone = None
        await self._post("ps-move-failed", zone=zone, reason=reason)

    async def _ps_moved(self, names: list[str], start: int) -> bool:
        """Wait until the run moved its PS onto the new hosts ``names`` (True), or, without a
        run, until they have joined (True); False once one of them is lost first (or the
        cluster closes)."""
        while not self._closing:
            if any(e.get("kind") == "ps-moved" for e in self.monitor.events[start:]):
                return True
            if self._ps_move_lost:
                return False
            if all(n in self._joined for n in names) and not self._run_going():
                return True
            await asyncio.sleep(0.1)
        return False

    async def _add_ps_hosts(self, before: int, n: int) -> None:
        await self._post("ps-hosts", hosts=n, hosts_from=before)
        self._log(f"Adding {n - before} PS host(s): {n} in all, one PS shard each")
        for _ in range(n - before):
            self._spawn(self._provision("ps"))
