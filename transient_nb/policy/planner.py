"""The planner of a transient-aware policy: what a cluster configuration is expected to deliver.

A *configuration* is how many workers of each kind (GPU type, zone, Spot or not) and how many PS
shards (one PS host each). The planner turns the cluster's knowledge into expectations:

- **Step rates** per GPU type: the paper's measurements (or the emulation's table) as the prior,
  replaced by what the workers report (``worker-metrics``) once they do.
- **Revocation hazards** per GPU type and zone: a rate per hour whose prior comes from the
  paper's lifetime CDFs (the first hour's revocations), scaled by how much more the zone revoked
  the other GPU types seen there than their priors expected, and updated with the preemptions
  observed over the exposure so far (a gamma-Poisson update: ``(prior_rate * prior_hours +
  revocations) / (prior_hours + exposed_hours)``).
- **The PS's capacity**: global steps/s that ``shards`` PS hosts serve at most (the paper's plateau
  near 45 with one, ~1.75x with two; see :meth:`transient_nb.training.emulation.Emulation.ps_service_s`)
  as the prior, measured live (:meth:`Planner.observe_ps`): where the PS serves clearly fewer
  steps than its workers would push if it kept up, it is the bottleneck and what it serves is
  its capacity; where it keeps up, its capacity is at least what it serves.

From these it computes a configuration's **liveput** (Parcae's term): the expected global steps/s
over the likely preemption scenarios, not the rate of the moment. Each worker is up with the
probability its kind is (:meth:`Planner.availability`: the model's fraction, a lost worker
replaced after a start-up, weighed against the fraction of their time its workers were seen to
train), and the cluster serves ``min(sum of the rates of the workers up, PS capacity)``; the expectation is
exact, over the joint binomial distribution of workers up per kind. It also computes the
probability of losing at least ``k`` workers within an hour (the paper's "cluster failure
probability", from per-server revocation probabilities), the expected time and money to a number
of steps, and :meth:`Planner.choose`, the configuration that best meets a goal:

- ``"deadline"``: the cheapest expected to finish by the deadline;
- ``"budget"``: the fastest expected to stay within the budget (of those within 1% of the
  fastest, the cheapest);
- ``"cost-per-step"``: the lowest expected dollars per step.

Candidates are the frontier a greedy search builds, for every shard count: from no workers, add
the kind of worker that adds the most liveput per dollar per hour, one at a time, up to
``max_workers``; every size of each kind alone; and on-demand workers of a kind beside Spot
ones of the same type and zone (a deadline a storm makes Spot alone miss). The planner is pure (no cluster, no clock): the policy feeds it observations and
acts on its answers; tests drive it with synthetic metric streams.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from transient_nb.catalog.lifetimes import HOUR, PAPER_STARTUP_S, paper_curve
from transient_nb.policy.history import Observations
from transient_nb.training.emulation import (
    CROSS_REGION_SLOWDOWN,
    PAPER_PS_STEPS_PER_S,
    PAPER_TWO_SHARD_GAIN,
    Emulation,
    cross_region,
    parse_emulation,
)

#: The goals :meth:`Planner.choose` understands.
GOALS = ("deadline", "budget", "cost-per-step")

#: For the budget goal: configurations expected to finish within this fraction of the fastest
#: are as fast (the cheapest of them is chosen).
SAME_SPEED = 0.01

#: Configurations expected within this fraction of the best in the goal's measure (cost per step,
#: or the cost of a deadline) are as good: of those, the one with the fewest expected revocations
#: per hour is chosen (the paper's revocation-aware sizing). Under a storm the model's dollars per
#: step are nearly flat in the cluster's size (3 P100 on one PS within 1.1% of 8 P100 on two),
#: while every worker more is another replacement an hour to boot, join and pay for, and more
#: exposure to the model's own errors: the larger one ran away (round eight).
NEAR_EQUAL = 0.02

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


@dataclass(frozen=True)
class Kind:
    """One kind of worker the policy can ask for.

    Parameters
    ----------
    gpu, zone, spot
        What the backend is asked for.
    hourly
        USD per hour of one such worker (GPU and machine).
    """

    gpu: str
    zone: str
    spot: bool
    hourly: float

    def __str__(self) -> str:
        return f"{self.gpu} in {self.zone}" + ("" if self.spot else " (on demand)")


@dataclass(frozen=True)
class Configuration:
    """Workers per kind and PS shards (one PS host each)."""

    workers: tuple[tuple[Kind, int], ...]
    shards: int = 1

    @classmethod
    def of(cls, workers: Mapping[Kind, int], shards: int = 1) -> Configuration:
        """A configuration from a mapping (kinds with 0 workers dropped; stable order)."""
        items = tuple(
            sorted(((k, n) for k, n in workers.items() if n > 0), key=lambda kn: str(kn[0]))
        )
        return cls(items, shards)

    @property
    def counts(self) -> dict[Kind, int]:
        return dict(self.workers)

    @property
    def size(self) -> int:
        return sum(n for _, n in self.workers)

    def describe(self) -> str:
        """E.g. ``"2 k80 in us-central1-a + 1 v100 in us-central1-a, 1 PS shard"``."""
        parts = [f"{n} {k}" for k, n in self.workers] or ["no workers"]
        return " + ".join(parts) + f", {self.shards} PS shard" + ("s" if self.shards > 1 else "")


@dataclass
class Estimate:
    """What the planner expects of one configuration."""

    config: Configuration
    liveput: float  # expected global steps/s
    hourly: float  # USD per hour, PS hosts included
    eta_s: float  # expected seconds to the remaining steps (inf when nothing trains)
    cost: float  # expected USD to the remaining steps
    steps: float = 0.0  # the remaining steps (0: unknown)

    @property
    def cost_per_step(self) -> float:
        """Expected USD per step over the steps left, a change's start-up included (its new
        workers billed while they start); without the steps, at the configuration's liveput.

        At its liveput alone, a storm's three Spot P100 looked 12% dearer per step than six
        P100 on demand, and the policy swapped them while the six would take 0.06 h to start
        at $8.87 an hour: $2.04 to finish against $1.80 for staying (round eleven)."""
        if self.liveput <= 0:
            return math.inf
        if self.steps > 0 and math.isfinite(self.cost):
            return self.cost / self.steps
        return self.hourly / HOUR / self.liveput


@dataclass
class Plan:
    """The configuration chosen for a goal, the estimate behind it, and why."""

    goal: str
    chosen: Estimate
    current: Estimate | None
    reason: str
    feasible: bool = True
    candidates: list[Estimate] = field(default_factory=list, repr=False)
    #: The seconds (deadline) or dollars (budget) the goal allowed; None for cost-per-step.
    limit: float | None = None

    def meets(self, e: Estimate) -> bool:
        """Whether ``e`` is expected to meet this plan's goal (always, for cost-per-step)."""
        if self.limit is None:
            return True
        return (e.eta_s if self.goal == "deadline" else e.cost) <= self.limit


class Planner:
    """Expectations of cluster configurations, from prices, rates, hazards and the PS.

    Parameters
    ----------
    kinds
        The kinds of worker that can be bought (prices included).
    ps_hourly
        USD per hour of one PS host.
    steps_per_s
        Prior step rate of one worker per GPU type (default: the paper's emulation table).
    ps_steps_per_s
        Global steps/s one PS serves at most (default: the paper's 45); None: no bottleneck.
    two_shard_gain
        How much faster two PS shards serve than one (default: the paper's 1.75).
    startup_s
        Prior seconds from asking for a Spot worker to its training (default: the paper's 81-98 s
        boot, midpoint, plus 19 s of warm restart, the load); the median observed replaces it.
    ps_zone
        Where the PS runs: a worker in another region steps ``cross_region_slowdown`` times
        slower (default: the paper's 1.48). None: placement is not weighed.
    """

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
        """Start from what earlier runs saw (:class:`~transient_nb.policy.history.PolicyHistory`):
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

    # -- what it expects ------------------------------------------------------------------------
    def model_availability(self, kind: Kind) -> float:
        """Long-run fraction of time a (replaced-when-lost) worker of ``kind`` is up, by the
        model: its hazard, start-up and load."""
        hazard = self.hazard_per_h(kind)
        if hazard <= 0:
            return 1.0
        # A cycle is a boot (asked for to running) and a lifetime (running to revoked); the
        # worker trains from ``load_s`` into its lifetime, if it lives that long. With
        # exponential lifetimes of mean ``mttf``: mttf * exp(-load / mttf) of each cycle's
        # boot + mttf. Counting the whole start-up as downtime and the whole lifetime as up
        # took the load twice as up: under a storm whose lifetimes were near the start-up, a
        # Spot worker trained a third of the time, not the half expected (round ten).
        mttf_s = HOUR / hazard
        load = self.load_s
        boot = max(0.0, self.startup_s - load)
        return mttf_s * math.exp(-load / mttf_s) / (boot + mttf_s)

    def availability(self, kind: Kind) -> float:
        """Fraction of time a (replaced-when-lost) worker of ``kind`` is up: the model's
        (:meth:`model_availability`) counting as ``PRIOR_HOURS`` of a worker's time, and the
        fraction observed (:meth:`observe_availability`) over the hours observed.

        What the model leaves out, its workers show: under a storm on a shared host the
        model expected Spot P100s up 38% of the time and they trained 15% (starts that
        contend with each other, revocations while booting, lifetimes that are not
        exponential); a deadline planned on 38% was missed by a third (round ten).
        """
        model = self.model_availability(kind)
        if not kind.spot:
            return model
        key = (kind.gpu.lower(), kind.zone)
        held, trained = self._held.get(key, (0.0, 0.0))
        _, _, past_held, past_trained = self._past_kind(key)
        return (model * PRIOR_HOURS + trained + past_trained) / (PRIOR_HOURS + held + past_held)

    def liveput(self, config: Configuration) -> float:
        """Expected global steps/s of ``config`` over the preemption scenarios (see module)."""
        cap = self.ps_capacity(config.shards)
        dists = []
        for kind, n in config.workers:
            p, r = self.availability(kind), self.kind_rate(kind)
            dists.append(
                [(math.comb(n, k) * p**k * (1 - p) ** (n - k), k * r) for k in range(n + 1)]
            )
        total = 0.0
        for combo in itertools.product(*dists) if dists else [()]:
            prob = math.prod(c[0] for c in combo)
            total += prob * min(sum(c[1] for c in combo), cap)
        return total

    def hourly(self, config: Configuration) -> float:
        """USD per hour of ``config``, its PS hosts included."""
        return sum(k.hourly * n for k, n in config.workers) + self.ps_hourly * config.shards

    def estimate(
        self, config: Configuration, remaining_steps: float, current: Configuration | None = None
    ) -> Estimate:
        """Liveput, price, and expected time and money to ``remaining_steps`` of ``config``.

        ``current``: the configuration the cluster has now. Changing to ``config`` takes time:
        the workers it adds (of each kind, those beyond the current ones) and a PS shard it
        adds work only after a start-up, and until then the workers kept train alone. Late in a
        run no change is worth a start-up it cannot earn back (a storm's deadline policy, round
        ten, swapped in seven on-demand workers for its last 42 of 640 steps).
        """
        live = self.liveput(config)
        hourly = self.hourly(config)
        eta = math.inf if live <= 0 else remaining_steps / live
        if current is not None and live > 0 and config != current:
            have = current.counts
            kept = Configuration.of(
                {k: min(n, have.get(k, 0)) for k, n in config.workers},
                min(config.shards, current.shards),
            )
            kept_live = self.liveput(kept) if kept.size else 0.0
            wait = self.startup_s
            if kept != config and kept_live * wait < remaining_steps:
                eta = wait + (remaining_steps - kept_live * wait) / live
            elif kept != config:
                # Done before the new workers would join (with no steps left: done now).
                eta = remaining_steps / kept_live if remaining_steps > 0 else 0.0
        cost = hourly * eta / HOUR if live > 0 else math.inf
        return Estimate(config, live, hourly, eta, cost, float(remaining_steps))

    def revocations_per_h(self, config: Configuration) -> float:
        """Expected revocations per hour of ``config``'s workers (each replaced when lost)."""
        return sum(n * self.hazard_per_h(kind) for kind, n in config.workers)

    def p_lose_at_least(self, config: Configuration, k: int, within_s: float = HOUR) -> float:
        """Probability that at least ``k`` of ``config``'s workers are revoked within ``within_s``.

        Per-server revocation probabilities ``1 - exp(-hazard * t)``, combined exactly (the
        number revoked is a sum of independent Bernoulli draws).
        """
        probs = []
        for kind, n in config.workers:
            q = 1.0 - math.exp(-self.hazard_per_h(kind) * within_s / HOUR)
            probs += [q] * n
        dist = [1.0]  # dist[j]: probability that exactly j are revoked so far
        for q in probs:
            dist = [
                (dist[j] if j < len(dist) else 0.0) * (1 - q) + (dist[j - 1] * q if j >= 1 else 0.0)
                for j in range(len(dist) + 1)
            ]
        return float(sum(dist[k:])) if k >= 0 else 1.0

    # -- what it chooses ------------------------------------------------------------------------
    def frontier(
        self, max_workers: int, max_shards: int = 2, min_shards: int = 1
    ) -> list[Configuration]:
        """Candidate configurations: for every shard count, the greedy path and every size of
        one kind alone (see module)."""
        out: list[Configuration] = []
        for shards in range(max(1, min_shards), max(1, min_shards, max_shards) + 1):
            # The greedy step weighs a worker's own price only, not the PS hosts' that every
            # worker shares: with a dear PS it walks the cheap slow kind, while fewer fast
            # workers reach the PS's capacity for less a step. Each kind alone is cheap to add.
            for kind in self.kinds:
                live = 0.0
                for n in range(1, max_workers + 1):
                    alone = Configuration.of({kind: n}, shards)
                    more = self.liveput(alone)
                    if more - live <= 1e-12:
                        break  # the PS is saturated: more of this kind add nothing
                    out.append(alone)
                    live = more
            counts: dict[Kind, int] = {}
            for _ in range(max_workers):
                base = Configuration.of(counts, shards)
                base_live = self.liveput(base)

                def gain(
                    kind: Kind,
                    base_live: float = base_live,
                    counts: dict[Kind, int] = counts,
                    shards: int = shards,
                ) -> float:
                    bigger = Configuration.of({**counts, kind: counts.get(kind, 0) + 1}, shards)
                    return (self.liveput(bigger) - base_live) / max(kind.hourly, 1e-9)

                best = max(self.kinds, key=gain)
                if gain(best) <= 1e-12:
                    break  # the PS is saturated: more workers add nothing
                counts[best] = counts.get(best, 0) + 1
                out.append(Configuration.of(counts, shards))
            # On-demand workers beside Spot ones of the same type and zone: the greedy walk
            # never takes the dear kind while the cheap one still adds liveput, but under a
            # storm Spot workers are up only part of the time, and a deadline Spot alone misses
            # may be met by a few on-demand workers with Spot ones beside them.
            for dear in (k for k in self.kinds if not k.spot):
                for cheap in self.kinds:
                    if not cheap.spot or (cheap.gpu, cheap.zone) != (dear.gpu, dear.zone):
                        continue
                    for m, n in itertools.product(range(1, max_workers), repeat=2):
                        if m + n <= max_workers:
                            out.append(Configuration.of({dear: m, cheap: n}, shards))
        return list(dict.fromkeys(out))

    def choose(
        self,
        goal: str,
        remaining_steps: float,
        *,
        max_workers: int,
        max_shards: int = 2,
        min_shards: int = 1,
        deadline_s: float | None = None,
        budget: float | None = None,
        current: Configuration | None = None,
        extra: Iterable[Configuration] = (),
    ) -> Plan:
        """The configuration that best meets ``goal`` for the steps left.

        Parameters
        ----------
        goal
            ``"deadline"`` (needs ``deadline_s``: seconds left), ``"budget"`` (needs ``budget``:
            dollars left) or ``"cost-per-step"``.
        remaining_steps
            Global steps still to train.
        max_workers, max_shards, min_shards
            Bounds of the search (a running PS cannot give back a shard: ``min_shards``).
        current
            The cluster's configuration now: the reason compares against it.
        extra
            More candidates to weigh (e.g. the static configurations of an experiment).
        """
        if goal not in GOALS:
            raise ValueError(f"goal={goal!r}: use one of {', '.join(GOALS)}.")
        if goal == "deadline" and not (deadline_s is not None and deadline_s > 0):
            raise ValueError(f"goal='deadline' needs a positive deadline, not {deadline_s!r}.")
        if goal == "budget" and not (budget is not None and budget > 0):
            raise ValueError(f"goal='budget' needs a positive budget in dollars, not {budget!r}.")
        # The current configuration is always a candidate: a plan must never advise a change
        # to something the model itself expects to be worse than staying.
        here = (
            [current]
            if current is not None
            and 0 < current.size <= max_workers
            and min_shards <= current.shards <= max(min_shards, max_shards)
            else []
        )
        configs = list(
            dict.fromkeys([*self.frontier(max_workers, max_shards, min_shards), *extra, *here])
        )
        estimates = [self.estimate(c, remaining_steps, current) for c in configs]
        estimates = [e for e in estimates if e.liveput > 0]
        if not estimates:
            raise ValueError("No configuration trains at all: no kind of worker has a step rate.")
        now = self.estimate(current, remaining_steps) if current is not None else None
        limit = deadline_s if goal == "deadline" else budget if goal == "budget" else None
        feasible = True
        if limit is None:  # cost-per-step
            best = min(e.cost_per_step for e in estimates)
            chosen = self._calmest(
                [e for e in estimates if e.cost_per_step <= best * (1 + NEAR_EQUAL)],
                lambda e: (e.cost_per_step, e.eta_s),
            )
        else:
            # Deadline: the cheapest within the time, else the fastest. Budget: the fastest
            # within the money, else the cheapest.
            def bounded(e: Estimate) -> float:
                return e.eta_s if goal == "deadline" else e.cost

            def other(e: Estimate) -> float:
                return e.cost if goal == "deadline" else e.eta_s

            ok = [e for e in estimates if bounded(e) <= limit]
            feasible = bool(ok)
            if ok and goal == "budget":
                # Beyond the PS plateau, configurations finish within a fraction of a percent
                # of each other at very different prices: among those within SAME_SPEED of the
                # fastest, take the cheapest (5 K80 + 3 P100 is not worth 31% over 4 P100 for
                # 0.1% of speed).
                fastest = min(e.eta_s for e in ok)
                ok = [e for e in ok if e.eta_s <= fastest * (1 + SAME_SPEED)]
                chosen = min(ok, key=lambda e: (e.cost, e.eta_s))
            elif ok:
                cheapest = min(e.cost for e in ok)
                chosen = self._calmest(
                    [e for e in ok if e.cost <= cheapest * (1 + NEAR_EQUAL)],
                    lambda e: (e.cost, e.eta_s),
                )
            else:
                chosen = min(estimates, key=lambda e: (bounded(e), other(e)))
        reason = _reason(chosen, now, goal, feasible)
        return Plan(goal, chosen, now, reason, feasible, estimates, limit)

    def _calmest(self, near: list[Estimate], measure: Any) -> Estimate:
        """Of near-equal estimates, the one with the fewest expected revocations per hour (ties:
        the better ``measure``)."""
        return min(near, key=lambda e: (round(self.revocations_per_h(e.config), 9), measure(e)))


def _hours(seconds: float) -> str:
    return "never" if not math.isfinite(seconds) else f"{seconds / HOUR:.2f} h"


def _reason(chosen: Estimate, now: Estimate | None, goal: str, feasible: bool) -> str:
    """E.g. ``"2 k80 in us-central1-a, 1 PS shard: ETA 1.90 h -> 1.20 h, +$0.44/h"``."""
    text = chosen.config.describe()
    if now is not None:
        text += (
            f": ETA {_hours(now.eta_s)} -> {_hours(chosen.eta_s)}, "
            f"{chosen.hourly - now.hourly:+.2f} $/h"
        )
    else:
        text += f": ETA {_hours(chosen.eta_s)}, {chosen.hourly:.2f} $/h"
    text += f", expected ${chosen.cost:.2f} to finish"
    if not feasible:
        text += f" (no configuration meets the {goal}: the closest one)"
    return text


def kinds_from_catalog(
    catalog: Any, gpus: Sequence[str], zones: Sequence[str], machine_type: str, spot: bool = True
) -> list[Kind]:
    """Every (GPU type, zone) pair the catalog prices, as :class:`Kind` (others skipped)."""
    out = []
    for gpu, zone in itertools.product(gpus, zones):
        try:
            price = catalog.worker_price(gpu, machine_type, zone)
        except ValueError:
            continue
        out.append(Kind(gpu, zone, spot, float(price.rate(spot))))
    return out


def plan_fields(plan: Plan) -> dict[str, Any]:
    """The fields of a plan for a ``policy-decision`` event."""
    e = plan.chosen
    return {
        "goal": plan.goal,
        "workers": {
            f"{k.gpu}@{k.zone}" + ("" if k.spot else ":on-demand"): n for k, n in e.config.workers
        },
        "shards": e.config.shards,
        "liveput": round(e.liveput, 4),
        "hourly": round(e.hourly, 4),
        "eta_s": None if not math.isfinite(e.eta_s) else round(e.eta_s, 1),
        "expected_cost": None if not math.isfinite(e.cost) else round(e.cost, 4),
        "feasible": plan.feasible,
        "reason": plan.reason,
    }
