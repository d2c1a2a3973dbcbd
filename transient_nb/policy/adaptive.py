"""A transient-aware policy: the cluster chooses its mix of GPU workers to meet a goal.

Like :class:`distributed.deploy.Adaptive`, the policy is separate from the mechanism: it is called
periodically, reads what happened (the cluster's event log), asks the
:class:`~transient_nb.policy.planner.Planner` for the configuration that best meets its goal for the steps
left, and acts only through the cluster's public API (``cluster.scale(mix)``). Every decision is a
``policy-decision`` event with its reason, e.g. ``"3 k80 in us-central1-a + 1 v100 in
us-central1-a, 1 PS shard: ETA 1.90 h -> 1.20 h, +0.44 $/h, expected $2.10 to finish"``, and the
cluster's probability of losing 1, 2 or 3 workers within the next hour.

What it learns from the event log is :class:`~transient_nb.policy.learning.PolicyLearning`'s
(step rates, revocations and exposure, progress, money, the PS's service rate).

Its clock is the cluster's: on a local cluster with ``time_scale`` (simulated seconds per wall
second), deadlines, start-up delays, hazards and ETAs are in simulated time, as the bill is, and
a wall-clock rate or exposure is converted. Its steps are the steps the run stands for: with the
paper emulation's ``emulate_step_scale`` (each global step paced as that many GPU steps), a
trainer's rate and the steps left are counted in emulated steps, the unit of the planner's prior
rates and PS capacity. Without either, both clocks and both step counts are the same.

Goals: ``"deadline"`` (the cheapest mix expected to finish in time), ``"budget"`` (the fastest
mix expected to stay within the money left) and ``"cost-per-step"``. A new mix is applied only when
it is expected to be better by at least ``hysteresis`` (a fraction) in the goal's measure, so the
cluster does not flap between near-equal mixes; a mix that no longer meets the goal is always
replaced.

Besides the mix it decides: PS shards (``cluster.scale_ps``) where one PS is the bottleneck of a
run that follows new PS hosts; the zone new workers of each type go to first (``prefer_zone``);
on a Spot cluster, how many of each type run on demand (``scale(..., on_demand=...)``, where the
goal needs workers no storm revokes); and where the PS runs (``cluster.move_ps``), when the plan
with the PS in another region is better by the hysteresis.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Any

from transient_nb.eventlog.folds import event_log
from transient_nb.policy.learning import (
    PS_MOVE_SETTLE,
    PolicyLearning,
    _finite,
)
from transient_nb.policy.planner import (
    Configuration,
    Estimate,
    Kind,
    Plan,
    plan_fields,
)
from transient_nb.training.emulation import region_of

logger = logging.getLogger(__name__)


class TransientPolicy(PolicyLearning):
    """Choose the cluster's GPU mix for a goal, periodically, from its event log.

    Parameters
    ----------
    cluster
        A :class:`~transient_nb.TransientCluster` (anything with ``monitor.events``, ``cost()``,
        ``scale(mix)``, ``catalog``, ``zone``, ``machine_type``, ``ps_machine_type``, ``limits``).
    goal
        ``"deadline"``, ``"budget"`` or ``"cost-per-step"``.
    deadline
        For ``goal="deadline"``: a duration (``"2h"``, seconds) from when the policy starts, on
        the cluster's clock (simulated time on a local cluster with a ``time_scale``).
    budget
        For ``goal="budget"``: dollars the cluster may spend in all (what it spent counts).
    gpus
        GPU types it may use (default: the cluster's own, every type of its mix, and its
        fallbacks).
    max_workers
        Largest cluster it may ask for (default: the cluster's ``max_workers`` limit, else 8).
    max_shards
        Most PS shards (one PS host each) it may grow the PS to, when one PS is the bottleneck
        (default 2, the paper's measured gain; never fewer than the cluster has). Only a run
        started without ``shards=`` follows new PS hosts, so only such a run gets them.
    interval
        How often it decides (wall-clock).
    hysteresis
        Relative improvement a new mix must promise before the cluster is changed.
    margin
        Fraction of the time or money left that a deadline or a budget keeps in reserve against
        the model's errors (default 0.1): the plan must meet the goal with 10% to spare. A
        budget plan expected to cost $0.98 of $1.00 cost $1.15 (round ten: its first start-ups
        took longer than the paper's).
    on_demand
        On a Spot cluster, whether it may run some workers on demand (default True): it does
        where the model expects them to serve the goal better, e.g. a deadline that a storm of
        revocations makes Spot workers alone miss (an on-demand worker is never revoked, and
        costs about three times a Spot one). False keeps every worker Spot.
    planner
        A ready planner (tests); default: one built from the cluster's catalog.
    """

    # -- what it decides -----------------------------------------------------------------------------
    def current(self) -> Configuration:
        """The cluster's configuration now: its workers asked for, by GPU type, each in the zone
        its live VMs are in, Spot or on demand as they run (those still to come: where the
        cluster places that type first, on demand while the type has fewer on-demand workers
        than the cluster keeps)."""
        mix = getattr(self.cluster, "mix", None)
        if mix is None:
            mix = {self.cluster.gpu: int(getattr(self.cluster, "_target", 0))}
        dear = dict(getattr(self.cluster, "on_demand", None) or {})
        kinds = {(k.gpu, k.zone, k.spot): k for k in self.planner.kinds}
        counts: dict[Kind, int] = {}
        for gpu, n in dict(mix).items():
            n = int(n)
            of_gpu = [k for k in self.planner.kinds if k.gpu == gpu]
            if not n or not of_gpu:
                continue
            on_demand = int(dear.get(gpu, 0))
            for g, zone, spot in self._live.values():
                kind = kinds.get((g, zone, spot)) or kinds.get((g, zone, not spot))
                if g == gpu and kind is not None and n > 0:
                    counts[kind] = counts.get(kind, 0) + 1
                    n -= 1
                    on_demand -= int(not kind.spot)
            zone = self._first_zone(gpu)
            for spot, m in ((False, min(n, max(0, on_demand))), (True, n - max(0, on_demand))):
                if m > 0:
                    home = kinds.get((gpu, zone, spot)) or kinds.get((gpu, zone, True))
                    home = home or next((k for k in of_gpu if k.spot == spot), of_gpu[0])
                    counts[home] = counts.get(home, 0) + m
        return Configuration.of(counts, self._shards())

    def _first_zone(self, gpu: str) -> str:
        replacement = getattr(self.cluster, "placement", None)
        preferred = getattr(replacement, "preferred_zones", None) or {}
        return str(preferred.get(gpu, getattr(self.cluster, "zone", "")))

    def zones_of(self, plan: Plan) -> dict[str, str]:
        """GPU type -> the zone the plan puts most of that type in (ties: the earlier kind)."""
        best: dict[str, tuple[int, str]] = {}
        for kind, n in plan.chosen.config.workers:
            if kind.gpu not in best or n > best[kind.gpu][0]:
                best[kind.gpu] = (n, kind.zone)
        return {gpu: zone for gpu, (_, zone) in best.items()}

    def remaining_steps(self) -> int | None:
        """Global steps the run still has to train (None before a run starts)."""
        if self._steps is None:
            return None
        return max(0, self._steps - self._step)

    def recommend(self, now: float | None = None) -> Plan | None:
        """The planner's choice for the steps left (None when no run is going or it is done)."""
        remaining = self.remaining_steps()
        if not remaining:
            return None
        now = time.time() if now is None else now
        self.observe_places(now)
        kwargs: dict[str, Any] = {}
        if self.goal == "deadline":
            assert self.deadline_s is not None
            elapsed = (now - self.started_at) * self.time_scale
            kwargs["deadline_s"] = max(1.0, (self.deadline_s - elapsed) * (1 - self.margin))
        elif self.goal == "budget":
            assert self.budget is not None
            left = self.budget - float(self.cluster.cost().total)
            kwargs["budget"] = max(0.01, left * (1 - self.margin))
        shards = self._shards()
        # More shards only for a run that follows new PS hosts, and never fewer. Before the PS
        # is measured the paper's plateau decides (waiting to measure cost a deadline run the
        # seconds that mattered); once measured, what it serves does.
        return self.planner.choose(
            self.goal,
            remaining * self.step_scale,
            max_workers=self.max_workers,
            max_shards=max(shards, self.max_shards) if self._elastic else shards,
            min_shards=shards,
            current=self.current(),
            **kwargs,
        )

    def _shards(self) -> int:
        return int(getattr(self.cluster, "ps_hosts", 1) or 1)

    def worth_changing(self, plan: Plan) -> bool:
        """Whether ``plan``'s mix is enough better than the current one to act on."""
        now, new = plan.current, plan.chosen
        if now is None or new.config == now.config:
            return False
        if now.liveput <= 0:
            return True
        return self.better(plan, new, now)

    def settling(self, now: float | None = None) -> bool:
        """Whether the last change is still taking effect: its workers take a start-up (the
        median observed) to boot and join, and until then the cluster's rates, and the plan made
        from them, do not show it. No other change before (under a storm, changing on a plan
        made mid-change flapped the mix: each change billed a boot and gave back working VMs)."""
        if self._acted_at is None:
            return False
        now = time.time() if now is None else now
        return now - self._acted_at < self.planner.startup_s / self.time_scale

    def mix_of(self, plan: Plan) -> dict[str, int]:
        """The plan as the mix ``cluster.scale`` takes (types it leaves out go to 0)."""
        mix = {k.gpu: 0 for k in self.planner.kinds}
        for kind, n in plan.chosen.config.workers:
            mix[kind.gpu] = mix.get(kind.gpu, 0) + n
        return mix

    def on_demand_of(self, plan: Plan) -> dict[str, int]:
        """GPU type -> how many of the plan's workers of that type run on demand (types with
        none left out)."""
        dear: dict[str, int] = {}
        for kind, n in plan.chosen.config.workers:
            if not kind.spot:
                dear[kind.gpu] = dear.get(kind.gpu, 0) + n
        return dear

    def _on_demand_asked(self, plan: Plan) -> dict[str, int]:
        """:meth:`on_demand_of` with every type the planner may buy (0 for those with none):
        a type whose on-demand workers the plan drops gets them swapped back for Spot ones."""
        return {**{k.gpu: 0 for k in self.planner.kinds}, **self.on_demand_of(plan)}

    def _weighs_on_demand(self) -> bool:
        return any(not k.spot for k in self.planner.kinds) and bool(
            getattr(self.cluster, "spot", True)
        )

    def decision_fields(self, plan: Plan, acted: bool) -> dict[str, Any]:
        """The fields of the ``policy-decision`` event of ``plan``."""
        config = plan.chosen.config
        return {
            **plan_fields(plan),
            "acted": acted,
            "mix": self.mix_of(plan),
            "on_demand": self.on_demand_of(plan),
            "zones": self.zones_of(plan),
            "remaining_steps": self.remaining_steps(),
            "p_lose_1h": [round(self.planner.p_lose_at_least(config, k), 4) for k in (1, 2, 3)],
            # Of each Spot kind the plan or the cluster has: the fraction of the time a worker
            # is expected up, and the model's own figure (the difference: what was observed).
            "availability": self._availabilities(plan),
            # What the plan assumes of the PS (measured live once it was the bottleneck).
            "ps_capacity": _finite(self.planner.ps_capacity(config.shards)),
            "ps_bottleneck": self._ps_bottleneck,
            "ps_zone": self.planner.ps_zone,
            # What a change is expected to wait for its new workers (simulated seconds).
            "startup_s": round(self.planner.startup_s, 1),
            "load_s": round(self.planner.load_s, 1),
        }

    def _availabilities(self, plan: Plan) -> dict[str, list[float]]:
        configs = [plan.chosen.config] + ([plan.current.config] if plan.current else [])
        kinds = dict.fromkeys(k for c in configs for k, _ in c.workers if k.spot)
        return {
            f"{k.gpu}@{k.zone}": [
                round(self.planner.availability(k), 4),
                round(self.planner.model_availability(k), 4),
            ]
            for k in kinds
        }

    def better(self, plan: Plan, new: Estimate, old: Estimate) -> bool:
        """Whether ``new`` serves ``plan``'s goal enough better than ``old`` (by the hysteresis).

        A deadline: meeting it where ``old`` misses it; both meet it, cheaper; both miss it,
        enough sooner (a near-equal miss is no reason to boot and give back VMs: under a storm
        that flapped the mix a dozen times). A budget: within it where ``old`` is not; both
        within, sooner; both over, cheaper. Cost per step: less per step.
        """
        factor = 1 - self.hysteresis
        if plan.goal == "cost-per-step":
            return new.cost_per_step < old.cost_per_step * factor
        if plan.meets(new) != plan.meets(old):
            return plan.meets(new)
        cheaper, sooner = new.cost < old.cost * factor, new.eta_s < old.eta_s * factor
        if plan.goal == "deadline":
            return cheaper if plan.meets(new) else sooner
        return sooner if plan.meets(new) else cheaper

    def ps_move(self, plan: Plan, now: float | None = None) -> tuple[str, Plan] | None:
        """A zone in another region to move the PS to, and the plan made there, where that
        plan is :meth:`better` than ``plan`` (the workers there then step at their GPU's
        speed, not 1.48x slower); None when staying is as good, or no zone elsewhere is
        allowed.

        The planner weighs each other region's first zone the cluster may use as the PS's
        place. A move costs a PS host's start-up, during which the run goes on where it is.
        """
        here = self.planner.ps_zone
        if here is None or getattr(self.cluster, "ps_move_zone", None) is not None:
            return None
        now = time.time() if now is None else now
        startup = self.planner.startup_s
        if (
            self._ps_moved_at is not None
            and (now - self._ps_moved_at) * self.time_scale < PS_MOVE_SETTLE * startup
        ):
            return None
        remaining = (self.remaining_steps() or 0) * self.step_scale
        if plan.current is not None and plan.current.liveput * startup >= remaining:
            # Done before a new PS host would serve a step: a PS moved 38 steps before the end
            # (round eleven) billed a host for nothing.
            return None
        replacement = getattr(self.cluster, "placement", None)
        zones = list(getattr(replacement, "zones", lambda: [])() or [])
        others = {region_of(z): z for z in reversed(zones) if region_of(z) != region_of(here)}
        best: tuple[str, Plan] | None = None
        try:
            for zone in others.values():
                self.planner.ps_zone = zone
                there = self.recommend(now)
                rival = best[1] if best else plan
                if there is not None and self.better(there, there.chosen, rival.chosen):
                    best = (zone, there)
        finally:
            self.planner.ps_zone = here
        return best

    async def adapt(self) -> Plan | None:
        """One round: read the log, decide, and change the cluster when it is worth it."""
        self.observe(list(event_log(self.cluster)))
        self.save_memory()
        plan = self.recommend()
        if plan is None:
            return None
        move = None if self.settling() else self.ps_move(plan)
        if move is not None:
            zone, plan = move
            # Said in the reason, and acted on below as any change (mix, zones, shards).
            plan.reason = f"PS moved to {zone}: " + plan.reason
            self.cluster.move_ps(zone, reason=plan.reason)
            self.planner.ps_zone = zone
            self._ps_moved_at = time.time()
        act = (move is not None or self.worth_changing(plan)) and not self.settling()
        if act:
            shards = plan.chosen.config.shards
            if shards > self._shards():
                # A PS host first: the run splits its PS once the host has joined.
                self.cluster.scale_ps(shards)
            prefer = getattr(getattr(self.cluster, "placement", None), "prefer_zone", None)
            if prefer is not None:
                # New workers of each type (and replacements) go where the plan put them; the
                # ones already running stay until they are preempted or given back.
                for gpu, zone in self.zones_of(plan).items():
                    prefer(gpu, zone)
            if self._weighs_on_demand():
                self.cluster.scale(self.mix_of(plan), on_demand=self._on_demand_asked(plan))
            else:
                self.cluster.scale(self.mix_of(plan))
            self._acted_at = time.time()
        self.last = plan
        changed = self._changed_view(plan)
        if act or changed:
            await self.cluster._post("policy-decision", **self.decision_fields(plan, act))
        return plan

    def _changed_view(self, plan: Plan) -> bool:
        # Post the first decision, and one whenever the expected finish moves by over 10%.
        before = self._posted_eta
        eta = plan.chosen.eta_s
        if before is None or not math.isfinite(before) or abs(eta - before) > 0.1 * before:
            self._posted_eta = eta
            return True
        return False

    # -- running it -----------------------------------------------------------------------------------
    def start(self) -> None:
        """Decide every ``interval`` on the cluster's event loop until :meth:`stop`."""
        loop = self.cluster.loop
        loop.add_callback(self._start)

    async def _start(self) -> None:
        await self._announce(self.goal)
        self._task = asyncio.ensure_future(self._loop())

    async def _announce(self, goal: str | None) -> None:
        # The views (panel, dashboard) show which goal is on, and drop a stopped policy's plan.
        try:
            await self.cluster._post(
                "policy",
                goal=goal,
                deadline_s=self.deadline_s if goal else None,
                budget=self.budget if goal else None,
                # The event's field keeps its name "history" (events are persisted, and their
                # vocabulary does not change): it holds the policy's memory file.
                history=str(self.memory.path) if goal and self.memory else None,
                remembered_h=round(self.remembered_h, 3) if goal else None,
            )
        except Exception:  # the scheduler may be closing with the cluster
            logger.debug("could not post 'policy' for %s", self.goal, exc_info=True)

    async def _loop(self) -> None:
        while True:
            try:
                await self.adapt()
            except Exception:  # a bad round must not end the policy: log it, go on
                logger.exception("Policy round of %s failed", getattr(self.cluster, "name", "?"))
            await asyncio.sleep(self.interval_s)

    def stop(self, announce: bool = True) -> None:
        """Stop deciding (the cluster keeps its current mix); ``announce`` it in the event log."""
        task = self._task
        if task is not None:
            self.save_memory()
            self.cluster.loop.add_callback(task.cancel)
            self._task = None
            if announce:
                self.cluster.loop.add_callback(self._announce, None)
