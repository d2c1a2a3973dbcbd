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
from collections.abc import Iterable
from typing import Any

from transient_nb.catalog.lifetimes import HOUR
from transient_nb.policy.knowledge import PAPER_LOAD_S as PAPER_LOAD_S
from transient_nb.policy.knowledge import PRIOR_HOURS, PlannerKnowledge
from transient_nb.policy.knowledge import SATURATED as SATURATED
from transient_nb.policy.knowledge import paper_hazard_per_h as paper_hazard_per_h
from transient_nb.policy.plans import Configuration, Estimate, Kind, Plan
from transient_nb.policy.plans import kinds_from_catalog as kinds_from_catalog
from transient_nb.policy.plans import plan_fields as plan_fields

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


class Planner(PlannerKnowledge):
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
