"""What the planner of a transient-aware policy plans with: kinds of worker, configurations of
them, what one is expected to deliver, and the plan chosen for a goal.

:class:`~transient_nb.policy.planner.Planner` makes them; the policy acts on them and writes
them in its ``policy-decision`` events (:func:`plan_fields`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from transient_nb.catalog.lifetimes import HOUR


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
