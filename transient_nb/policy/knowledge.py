"""What the planner of a transient-aware policy knows: step rates, revocation hazards, start-ups
and the PS's capacity, from priors and what the cluster observed.

Priors come from the paper (its step rates, the first hour of its lifetime curves, its boot and
warm restart, its PS plateau) or a user's model (:meth:`PlannerKnowledge.use_model`); what the
workers and the PS are seen to do, and what earlier runs saw
(:class:`~transient_nb.policy.memory.Observations`), take over. :class:`PlannerKnowledge` is the
part of :class:`~transient_nb.policy.planner.Planner` that keeps them: the planner adds what a
configuration is expected to deliver, and which one meets a goal.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from transient_nb.catalog.lifetimes import PAPER_STARTUP_S, paper_curve
from transient_nb.policy.memory import Observations
from transient_nb.policy.plans import Kind
from transient_nb.training.emulation import (
    CROSS_REGION_SLOWDOWN,
    PAPER_PS_STEPS_PER_S,
    PAPER_TWO_SHARD_GAIN,
    Emulation,
    cross_region,
    parse_emulation,
)

#: The PS is the bottleneck when it serves less than this fraction of the steps its active workers
#: would push at their GPUs' rates (below it, the workers wait on the PS, not on their GPUs).
SATURATED = 0.85

#: Seconds from a worker's VM running to its training, by the paper's warm restart (19 s): the
#: prior of :attr:`Planner.load_s`.
PAPER_LOAD_S = 19.0

#: Hours of exposure the prior hazard counts as (how fast observed revocations take over). Half
#: an hour: the paper's hazards are averages over zones and days that it saw range from 0 of 16
#: K80s revoked in a day to 14 of 16; a zone's own revocations must take over within a run. At
#: 2 h (round nine) a storm of 12 revocations an hour looked like 2-3 for the first half hour,
#: and the policy bought Spot workers where only on-demand ones could keep a deadline.
PRIOR_HOURS = 0.5


def paper_hazard_per_h(gpu: str) -> float:
    """Revocations per hour of a Spot ``gpu`` server, from the paper's first-hour fraction.

    Examples
    --------
    >>> round(paper_hazard_per_h("k80"), 4)
    0.0812
    >>> paper_hazard_per_h("t4") == paper_hazard_per_h("k80")  # not measured: the K80's curve
    True
    """
    first_hour = dict(paper_curve(gpu))[1]
    return -math.log(1.0 - first_hour)


class PlannerKnowledge:
    """What a planner knows of rates, hazards, start-ups and the PS (its parameters: those of
    :class:`~transient_nb.policy.planner.Planner`)."""

    def __init__(
        self,
        kinds: Sequence[Kind],
        ps_hourly: float,
        *,
        steps_per_s: Mapping[str, float] | None = None,
        ps_steps_per_s: float | None = PAPER_PS_STEPS_PER_S,
        two_shard_gain: float = PAPER_TWO_SHARD_GAIN,
        startup_s: float | None = None,
        ps_zone: str | None = None,
        cross_region_slowdown: float = CROSS_REGION_SLOWDOWN,
    ):
        if not kinds:
            raise ValueError("The planner needs at least one kind of worker to choose from.")
        self.kinds = list(kinds)
        self.ps_hourly = float(ps_hourly)
        emu = parse_emulation("paper")
        assert emu is not None
        self.prior_rates = {
            k.lower(): float(v) for k, v in (steps_per_s or emu.steps_per_s).items()
        }
        self.ps_steps_per_s = ps_steps_per_s
        self.two_shard_gain = two_shard_gain
        lo, hi = PAPER_STARTUP_S["spot"]
        self.prior_startup_s = float(
            (lo + hi) / 2 + PAPER_LOAD_S if startup_s is None else startup_s
        )
        # Of which, from the VM running to its worker training: the paper's warm restart.
        self.prior_load_s = min(PAPER_LOAD_S, self.prior_startup_s)
        self.ps_zone = ps_zone
        self.cross_region_slowdown = float(cross_region_slowdown)
        self._observed_startups: list[float] = []
        self._observed_loads: list[float] = []
        self._first_startups: list[float] = []  # of the workers the cluster started with
        self._first_loads: list[float] = []
        self._ps_at: list[float] = []  # one PS's capacity, from rounds it was the bottleneck
        self._ps_at_least = 0.0  # one PS's capacity is at least this (it kept up)
        self._observed_rates: dict[str, list[float]] = {}
        self._revocations: dict[tuple[str, str], int] = {}
        self._exposure_h: dict[tuple[str, str], float] = {}
        # (gpu, zone) -> (hours Spot workers held their places, hours they trained of those).
        self._held: dict[tuple[str, str], tuple[float, float]] = {}
        # What earlier runs saw (remember): added to this run's own observations.
        self._past = Observations()

    # -- what it knows --------------------------------------------------------------------------
    def use_model(self, parameters: int, rates: Mapping[str, float] | None = None) -> None:
        """Plan for a user's model rather than the paper's ResNet-32: the PS's prior capacity
        is the paper's scaled to ``parameters`` (a push's fixed part and a part that grows with
        the bytes; :meth:`~transient_nb.training.emulation.Emulation.ps_service_s`), and the
        workers' prior rates are ``rates`` (the FLOP-based estimate,
        :func:`~transient_nb.training.estimate.worker_rate`; a type without one has none until
        its workers report). What workers and the PS are seen to do replaces both, as ever.

        Examples
        --------
        >>> from transient_nb.policy.planner import Kind, Planner
        >>> planner = Planner([Kind("t4", "us-central1-a", True, 0.2)], 0.19)
        >>> planner.use_model(466_906, {"t4": 30.0})
        >>> round(planner.ps_capacity(1), 1), planner.rate("t4"), planner.rate("k80")
        (125.6, 30.0, 0.0)
        """
        if self.ps_steps_per_s is not None:
            emu = Emulation({}, self.ps_steps_per_s, self.two_shard_gain)
            one, two = (
                emu.ps_service_s(1, parameters=parameters),
                emu.ps_service_s(2, parameters=parameters),
            )
            assert one is not None and two is not None
            self.ps_steps_per_s, self.two_shard_gain = 1.0 / one, one / two
        self.prior_rates = {k.lower(): float(v) for k, v in (rates or {}).items()}

    def remember(self, past: Observations) -> None:
        """Start from what earlier runs saw (:class:`~transient_nb.policy.memory.PolicyMemory`):
        their revocations and hours add to this run's for the hazards, their places' hours to
        the availability, and their start-ups stand until a worker asked for in this run
        trains (before this run's first workers, whose cold start says less of a change)."""
        self._past = past

    def observations(self) -> Observations:
        """What this run saw (not what :meth:`remember` gave): per Spot kind, revocations,
        exposure and places' hours; the start-ups of the workers asked for during the run."""
        keys = set(self._exposure_h) | set(self._revocations) | set(self._held)
        return Observations(
            {
                key: (
                    float(self._revocations.get(key, 0)),
                    self._exposure_h.get(key, 0.0),
                    *self._held.get(key, (0.0, 0.0)),
                )
                for key in sorted(keys)
            },
            tuple(self._observed_startups),
            tuple(self._observed_loads),
        )

    def _past_kind(self, key: tuple[str, str]) -> tuple[float, float, float, float]:
        return tuple(self._past.kinds.get(key, (0.0, 0.0, 0.0, 0.0)))  # type: ignore[return-value]

    def observe_rate(self, gpu: str, steps_per_s: float, zone: str | None = None) -> None:
        """A worker of type ``gpu`` in ``zone`` reported this many steps/s (``worker-metrics``);
        kept as the rate of one in the PS's region (a worker farther away is slower for that)."""
        if steps_per_s > 0 and math.isfinite(steps_per_s):
            rate = float(steps_per_s) * self._slowdown(zone)
            self._observed_rates.setdefault(gpu.lower(), []).append(rate)

    def _slowdown(self, zone: str | None) -> float:
        return self.cross_region_slowdown if cross_region(zone, self.ps_zone) else 1.0

    def kind_rate(self, kind: Kind) -> float:
        """Steps/s of one worker of ``kind``: its type's rate, slower outside the PS's region."""
        return self.rate(kind.gpu) / self._slowdown(kind.zone)

    def observe_exposure(self, gpu: str, zone: str, hours: float, revocations: int = 0) -> None:
        """Servers of ``gpu`` in ``zone`` ran ``hours`` (summed over servers) and lost
        ``revocations`` of theirs to preemption."""
        key = (gpu.lower(), zone)
        self._exposure_h[key] = self._exposure_h.get(key, 0.0) + max(0.0, hours)
        self._revocations[key] = self._revocations.get(key, 0) + max(0, revocations)

    def observe_availability(self, gpu: str, zone: str, held_h: float, trained_h: float) -> None:
        """Spot workers of ``gpu`` in ``zone`` held their places in the cluster ``held_h`` hours
        (summed over workers) and trained ``trained_h`` of them: the totals so far (each call
        replaces the last one's).

        A place is held from a replacement's request (its start-up is the price of the
        revocation before it), or from a worker's first training for the others (a change's
        own start-up is counted by :meth:`estimate`), until the worker is lost.
        """
        if math.isfinite(held_h) and math.isfinite(trained_h) and held_h > 0:
            self._held[(gpu.lower(), zone)] = (float(held_h), min(max(0.0, trained_h), held_h))

    def observe_startup(
        self, seconds: float, load_s: float | None = None, *, first: bool = False
    ) -> None:
        """A worker trained ``seconds`` after it was asked for, ``load_s`` of them after its VM
        was running (starting its process, loading the data and the model, joining the PS):
        a revocation takes those from the VM's lifetime too. ``first``: one of the workers
        the cluster started with, which count only until a worker asked for later trains
        (those started together, and a cold first start says less of what a change costs)."""
        if seconds > 0 and math.isfinite(seconds):
            startups, loads = (
                (self._first_startups, self._first_loads)
                if first
                else (self._observed_startups, self._observed_loads)
            )
            startups.append(float(seconds))
            if load_s is not None and 0 <= load_s <= seconds:
                loads.append(float(load_s))

    @property
    def load_s(self) -> float:
        """Of the start-up, the seconds from the VM running to its worker training: the median
        observed (as :attr:`startup_s`), else the prior (never more than the start-up)."""
        seen = sorted(
            self._observed_loads
            if self._observed_startups
            else self._past.loads
            if self._past.startups
            else self._first_loads
        )
        return min(seen[len(seen) // 2] if seen else self.prior_load_s, self.startup_s)

    @property
    def startup_s(self) -> float:
        """Seconds a lost worker is down before its replacement works: the median observed
        start-up (of the workers asked for later, once one trained; else those of earlier runs;
        else of the first ones), else the prior (a storm makes it count as much as the
        lifetimes do)."""
        seen = sorted(self._observed_startups or self._past.startups or self._first_startups)
        return seen[len(seen) // 2] if seen else self.prior_startup_s

    def rate(self, gpu: str) -> float:
        """Steps/s of one ``gpu`` worker: the median observed, else the prior (0 if none)."""
        seen = sorted(self._observed_rates.get(gpu.lower(), []))
        if seen:
            return seen[len(seen) // 2]
        return self.prior_rates.get(gpu.lower(), 0.0)

    def hazard_per_h(self, kind: Kind) -> float:
        """Revocations per hour of one worker of ``kind`` (0 for on-demand)."""
        if not kind.spot:
            return 0.0
        key = (kind.gpu.lower(), kind.zone)
        prior = paper_hazard_per_h(kind.gpu) * self.zone_factor(kind.zone, but=kind.gpu)
        past_events, past_exposed, _, _ = self._past_kind(key)
        events = self._revocations.get(key, 0) + past_events
        exposed = self._exposure_h.get(key, 0.0) + past_exposed
        return (prior * PRIOR_HOURS + events) / (PRIOR_HOURS + exposed)

    def zone_factor(self, zone: str, but: str | None = None) -> float:
        """How many times the paper's hazards a zone revokes, from the other GPU types seen
        there (all but ``but``): their revocations against what their priors expected over
        their exposure, each prior counting as ``PRIOR_HOURS`` of exposure, as for a type's own
        hazard (one type seen alone: its own hazard over its prior).

        A storm is a zone running out of Spot capacity, not one GPU type's bad luck: a type
        not tried in a stormy zone is expected stormy too (else each untried type looks calm in
        turn, and the mix flapped between them, round nine).
        """
        seen = prior = expected = 0.0
        for gpu, z in dict.fromkeys([*self._exposure_h, *self._past.kinds]):
            if z == zone and gpu != (but or "").lower():
                rate = paper_hazard_per_h(gpu)
                past_events, past_hours, _, _ = self._past_kind((gpu, z))
                hours = self._exposure_h.get((gpu, z), 0.0) + past_hours
                seen += self._revocations.get((gpu, z), 0) + past_events
                prior += rate * PRIOR_HOURS
                expected += rate * (PRIOR_HOURS + hours)
        return (prior + seen) / expected if expected > 0 else 1.0

    def _shard_factor(self, shards: int) -> float:
        # Capacity of ``shards`` PS hosts over one's: each host serves its part of the vector
        # with the same fixed cost per call (two shards: ``two_shard_gain``).
        share = 2.0 * (1.0 - 1.0 / self.two_shard_gain)
        return 1.0 / (1.0 - share + share / max(1, shards))

    def observe_ps(self, shards: int, served: float, demand: float) -> bool:
        """``shards`` PS hosts served ``served`` global steps/s while their workers would have
        pushed ``demand`` had the PS kept up (the caller's estimate: fewer workers' rate grown
        in proportion, or their GPUs' rates). Returns whether the PS was the bottleneck (then
        the workers' own rates say more about the PS than their GPUs)."""
        if not (served > 0 and math.isfinite(served) and math.isfinite(demand)) or shards < 1:
            return False
        one = served / self._shard_factor(shards)
        if demand > 0 and served < SATURATED * demand:
            self._ps_at.append(one)
            return True
        self._ps_at_least = max(self._ps_at_least, one)
        return False

    @property
    def ps_steps_per_s_now(self) -> float | None:
        """One PS's capacity in global steps/s: the median measured while it was the
        bottleneck, else the prior; never below what it was seen to keep up with (None: no
        bottleneck known)."""
        seen = sorted(self._ps_at)
        at = seen[len(seen) // 2] if seen else self.ps_steps_per_s
        if at is None:
            return None
        return max(at, self._ps_at_least)

    def ps_capacity(self, shards: int) -> float:
        """Global steps/s that ``shards`` PS shards serve at most (inf: no bottleneck)."""
        one = self.ps_steps_per_s_now
        if one is None:
            return math.inf
        return one * self._shard_factor(shards)
