"""The transient-aware policy against static and reactive clusters, on the paper emulation.

Issue 16's evaluation: the same emulated work (the paper's 64K ResNet-32 steps, each GPU type's
step time and the PS's capacity paced as :mod:`transient_nb.experiments.reproduce` does), the same seeds and
the same preemption traces, run by real worker processes on the local backend, by three
strategies:

- **static**: a fixed configuration whose revoked workers are not replaced (the paper's rule);
- **reactive**: a fixed configuration that replaces every revoked worker (today's default);
- **policy**: :class:`~transient_nb.policy.adaptive.TransientPolicy` with a goal. It starts with the
  configuration its planner chooses for the whole run, and from then on decides every
  ``interval`` from what it observes (step rates, revocations, progress, money), replacing
  revoked workers as the reactive cluster does.

Traces (:data:`TRACES`): ``calm`` (a mean Spot lifetime of a day), ``paper`` (each GPU type's
lifetime curve from the paper), ``storm`` (a mean lifetime of 5 minutes, near a worker's
start-up time, in every zone) and ``zonal-storm`` (that storm in the cluster's zone only, a calm
day in ``us-central1-b``, which every cluster of that trace may use: Spot capacity runs out zone
by zone, and the paper saw a day's K80 revocations range from 0 of 16 in one zone to 14 of 16 in
another). The calm zone is in the PS's region: workers there are as close to it.
``regional-storm``: the storm in both zones of the PS's region (us-central1-a and -b), calm in
us-east1-c, which is 1.48x slower for workers of a PS left in us-central1 (the paper's
cross-region measurement): the reactive cluster moves its workers there, the policy may move
the PS too (:meth:`~transient_nb.TransientCluster.move_ps`). Prices are the paper's
(``paper-2019``), so the figures compare with its tables.

What the table says, and what it cannot: each row is one run of one seed; the policy's first
choice is the planner's expectation, which the static configurations of :data:`STATIC` are not
(they are the paper's K80 cluster, the P100/V100 clusters of its speed curve, and the P100 one on
demand, which no storm revokes; the policy may run some of its workers on demand too). A worker's
start-up here includes this host's process start-up (seconds of wall time, minutes of simulated
time at the scaled clock), which replacements pay and the paper's did not.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from transient_nb.experiments.reproduce import PAPER_STEPS, Setup, format_types, run_setup
from transient_nb.policy.memory import Observations, PolicyMemory
from transient_nb.policy.planner import Planner, kinds_from_catalog

#: Preemption traces: name -> lifetime model (:func:`~transient_nb.catalog.lifetimes.parse_preemption`).
TRACES = {
    "calm": "exp:mean=24h",
    "paper": "paper",
    "storm": "exp:mean=300s",
    "zonal-storm": "zones:us-central1-a=exp:mean=300s;*=exp:mean=24h",
    "regional-storm": (
        "zones:us-central1-a=exp:mean=300s;us-central1-b=exp:mean=300s;*=exp:mean=24h"
    ),
}
#: The zones besides us-central1-a that the clusters of a trace may use (the same for every
#: strategy: the reactive cluster falls back there only when a zone runs out of GPUs).
TRACE_ZONES: dict[str, tuple[str, ...]] = {
    "zonal-storm": ("us-central1-b",),
    "regional-storm": ("us-central1-b", "us-east1-c"),
}

#: GPU types the policy may use, and the static configurations it is compared with.
GPUS = ("k80", "p100", "v100")
STATIC = (
    Setup("8 K80", "k80", 8, True),
    Setup("4 P100", "p100", 4, True),
    Setup("4 V100", "v100", 4, True),
    # Clusters a storm cannot touch, on demand (3.4x the price): the cheapest static one, and
    # the cheapest static one that makes 0.6 h in any trace (64K steps in 0.49 h).
    Setup("4 P100 on demand", "p100", 4, False),
    Setup("3 P100 on demand", "p100", 3, False),
)
#: The reactive cluster: the cheapest static one at the paper's prices, replacing what it loses.
REACTIVE = Setup("4 P100", "p100", 4, True)

#: The goals: a deadline (simulated hours) and a budget (dollars of the paper's 64K steps).
DEADLINE_H = 0.6
BUDGET = 1.0


@dataclass(frozen=True)
class Trial:
    """One run of the evaluation: a strategy on a trace."""

    trace: str
    strategy: str  # "static", "reactive" or "policy"
    setup: Setup
    goal: dict[str, Any] = field(default_factory=dict)
    gpus: tuple[str, ...] = GPUS  # what the policy may buy
    max_workers: int = 8
    memory: str | None = None  # the policy's memory file (what earlier runs saw)

    @property
    def label(self) -> str:
        what = self.goal.get("goal") if self.strategy == "policy" else self.setup.label
        return f"{self.strategy} {what}"


def planner(prices: str = "paper-2019", gpus: Sequence[str] = GPUS) -> Planner:
    """The planner the policy starts with: ``gpus`` at ``prices`` in us-central1-a, the paper's
    priors (step rates, first-hour hazards, PS plateau)."""
    from transient_nb.catalog.prices import PriceCatalog

    catalog = PriceCatalog.load(prices)
    kinds = kinds_from_catalog(catalog, list(gpus), ["us-central1-a"], "n1-standard-8")
    ps_hourly = float(catalog.machine_price("n1-standard-4", "us-central1-a").rate(False))
    return Planner(kinds, ps_hourly, ps_zone="us-central1-a")


def first_choice(
    goal: Mapping[str, Any],
    max_workers: int = 8,
    max_shards: int | None = None,
    past: Observations | None = None,
    **kwargs: Any,
) -> Setup:
    """The configuration the policy starts with: its planner's choice for the whole run, with
    the policy's margin kept in reserve (as its own first round plans; without it, the budget
    policy gave back a K80 it had just booted at once), on up to ``max_shards`` PS shards
    (default: as many as the policy may grow to); from what earlier runs saw, ``past``, where
    the policy keeps a memory."""
    from transient_nb.policy.goals import check_goal
    from transient_nb.policy.learning import DEFAULT_MARGIN, DEFAULT_MAX_SHARDS

    deadline_s, budget = check_goal(goal["goal"], goal.get("deadline"), goal.get("budget"))
    keep = 1 - DEFAULT_MARGIN
    chooser = planner(**kwargs)
    if past:
        chooser.remember(past)
    plan = chooser.choose(
        goal["goal"],
        PAPER_STEPS,
        max_workers=max_workers,
        max_shards=DEFAULT_MAX_SHARDS if max_shards is None else max_shards,
        deadline_s=None if deadline_s is None else deadline_s * keep,
        budget=None if budget is None else budget * keep,
    )
    mix = tuple((k.gpu, n) for k, n in plan.chosen.config.workers)
    shards = plan.chosen.config.shards
    return Setup(f"policy {goal['goal']}", mix[0][0], sum(n for _, n in mix), True, shards, mix=mix)


def goals(deadline_h: float = DEADLINE_H, budget: float = BUDGET) -> list[dict[str, Any]]:
    """The policy's goals of the evaluation."""
    return [
        {"goal": "deadline", "deadline": f"{deadline_h}h"},
        {"goal": "budget", "budget": budget},
        {"goal": "cost-per-step"},
    ]


def trials(
    traces: Iterable[str] = TRACES,
    *,
    static: Sequence[Setup] = STATIC,
    reactive: Sequence[Setup] = (REACTIVE,),
    policy_goals: Sequence[Mapping[str, Any]] | None = None,
    memory: str | None = None,
    history: str | None = None,
) -> list[Trial]:
    """Every run of the evaluation, trace by trace; ``memory``: the policy's memory file (its
    first configuration planned from it too, as it stands now). ``history`` is ``memory``'s
    old name (deprecated)."""
    from transient_nb.catalog.lifetimes import parse_preemption

    if history is not None:
        warnings.warn(
            "trials(history=) is now trials(memory=); pass memory= (history= goes in the next "
            "release).",
            DeprecationWarning,
            stacklevel=2,
        )
        memory = memory or history

    out = []
    traces = list(traces)
    for trace in traces:  # every trace checked before the first run starts
        if trace not in TRACES:
            raise ValueError(f"trace {trace!r}: use one of {', '.join(TRACES)}.")
        parse_preemption(TRACES[trace])
    for trace in traces:
        out += [Trial(trace, "static", s) for s in static]
        out += [Trial(trace, "reactive", s) for s in reactive]
        past = PolicyMemory(memory, "local").load() if memory else None
        for goal in goals() if policy_goals is None else policy_goals:
            start = first_choice(goal, past=past)
            out.append(Trial(trace, "policy", start, dict(goal), memory=memory))
    return out


def dynamic_trials() -> list[Trial]:
    """The paper's dynamic experiment as a policy: one transient K80 that the policy may grow to
    four K80 for the best cost per step, against the static K80 it starts as (the paper grew
    1 -> 4 K80 on a schedule: 40.8% faster and 21.5% cheaper than static)."""
    one = Setup("1 K80", "k80", 1, True, bill_ps=True)
    return [
        Trial("paper", "static", one),
        Trial("paper", "policy", one, {"goal": "cost-per-step"}, gpus=("k80",), max_workers=4),
    ]


def plateau_trials(v100_deadline_h: float = 0.3, k80_deadline_h: float = 0.55) -> list[Trial]:
    """The PS bottleneck (paper §5: one 4-vCPU PS serves about 45 global steps/s, two 1.75x
    that): 8 V100s (125 steps/s of GPUs) on one PS against a policy that must finish in
    ``v100_deadline_h``, which one PS cannot (64K steps at 45/s take 0.40 h) and two can; and
    8 K80s (36 steps/s, under the plateau) against a policy with a deadline they can make, for
    which a second PS host would only add its price."""
    v100 = Setup("8 V100", "v100", 8, True)
    k80 = Setup("8 K80", "k80", 8, True)
    out = []
    for setup, hours in ((v100, v100_deadline_h), (k80, k80_deadline_h)):
        goal = {"goal": "deadline", "deadline": f"{hours}h"}
        # On one PS, as the static cluster: the point is that the policy finds the plateau.
        start = first_choice(goal, max_shards=1, gpus=(setup.gpu,))
        out.append(Trial("calm", "static", setup))
        out.append(Trial("calm", "policy", start, goal, gpus=(setup.gpu,)))
    return out


def run_trial(
    trial: Trial,
    *,
    steps: int,
    wall_pace: float = 0.4,
    seed: int = 0,
    interval: float = 1.0,
    emulate: str = "paper",
) -> dict[str, Any]:
    """Run one trial; its row (a run that could not finish is a row with its reason).
    ``emulate``: the paced GPUs and PS (e.g. ``"paper,ps=90"``: a PS twice the paper's)."""
    adapt = None
    if trial.strategy == "policy":
        adapt = {
            **trial.goal,
            "gpus": list(trial.gpus),
            "max_workers": trial.max_workers,
            "interval": interval,
            # None: the configured policy.memory; a trial without one keeps none.
            "memory": trial.memory or False,
        }
    row: dict[str, Any] = {"trace": trial.trace, "strategy": trial.strategy, "run": trial.label}
    try:
        out = run_setup(
            trial.setup,
            steps=steps,
            wall_pace=wall_pace,
            seed=seed,
            lifetimes=TRACES[trial.trace],
            fallback_zones=TRACE_ZONES.get(trial.trace, ()),
            replace=trial.strategy != "static",
            adapt=adapt,
            emulate=emulate,
        )
    except RuntimeError as exc:
        return {**row, "start": format_types(trial.setup.types), "failed": str(exc)}
    acted = [d for d in out["decisions"] if d.get("acted")]
    return {
        **row,
        "start": format_types(trial.setup.types),
        "end": format_types(out["final_mix"])
        + "".join(f" ({n} {g} on demand)" for g, n in out.get("final_on_demand", {}).items()),
        "shards": out["ps_hosts"],
        "ps_zone": out.get("ps_zone") or "",  # where the PS ended (the policy may move it)
        "changes": len(acted),
        "zones": format_zones(out["zones"]),
        "hours": out["hours"],
        "cost": out["cost"],
        "steps_per_dollar": PAPER_STEPS / out["cost"] if out["cost"] > 0 else float("nan"),
        "revocations": out["revocations"],
        "behind": out["behind"],
        "failed": "",
    }


def format_zones(zones: Mapping[str, tuple[int, int]]) -> str:
    """``"us-central1-a 9/8, us-east1-c 4/0"``: workers joined / revoked in each zone.

    Examples
    --------
    >>> format_zones({"us-central1-a": (9, 8), "us-east1-c": (4, 0)})
    'us-central1-a 9/8, us-east1-c 4/0'
    """
    return ", ".join(f"{zone} {joined}/{revoked}" for zone, (joined, revoked) in zones.items())


#: Figures within this fraction of each other are as good (one run of one seed each).
SAME = 0.01


def _compare(ours: float, theirs: float, lower_is_better: bool = True) -> str:
    """``"better"``, ``"as good"`` or ``"worse"``, within :data:`SAME`."""
    if not lower_is_better:
        ours, theirs = -ours, -theirs
    if ours < theirs - SAME * abs(theirs):
        return "better"
    return "as good" if ours <= theirs + SAME * abs(theirs) else "worse"


def verdicts(
    table: pd.DataFrame, deadline_h: float = DEADLINE_H, budget: float = BUDGET
) -> list[str]:
    """The issue's three claims, checked on ``table`` (rows of :func:`run_trial`), per trace:
    each says ``better``, ``as good`` (within 1%), ``worse``, or that the policy missed its
    goal."""
    out = []
    for trace, rows in table.groupby("trace", sort=False):
        done = rows[rows["failed"] == ""]
        static = done[done["strategy"] == "static"]

        def policy(goal: str, rows: pd.DataFrame = done) -> pd.Series | None:
            hit = rows[rows["run"] == f"policy {goal}"]
            return None if hit.empty else hit.iloc[0]

        for goal, limit, bound, measure, head, missed, none, against, what in (
            (
                "deadline",
                deadline_h,
                "hours",
                "cost",
                f"deadline {deadline_h} h",
                "missed the deadline",
                "no static configuration met it",
                "the cheapest static that meets it",
                "cost",
            ),
            (
                "budget",
                budget,
                "cost",
                "hours",
                f"budget ${budget:.2f}",
                "over the budget",
                "no static configuration stayed within it",
                "the fastest static within it",
                "time",
            ),
        ):
            # Deadline: the cheapest static run within the hours; budget: the fastest within the
            # dollars. The policy must stay within the same bound to be better.
            p = policy(goal)
            if p is None:
                continue
            ok = static[static[bound] <= limit]
            line = f"{trace}, {head}: policy {p['hours']:.2f} h ${p['cost']:.2f}"
            if p[bound] > limit:
                line += f": {missed}"
            if ok.empty:
                line += f" ({none})"
            else:
                best = ok.sort_values(measure).iloc[0]
                verdict = (
                    "worse"
                    if p[bound] > limit
                    else f"{_compare(p[measure], best[measure])} ({what})"
                )
                line += (
                    f" against {against}, {best['run']}: "
                    f"{best['hours']:.2f} h ${best['cost']:.2f} -> {verdict}"
                )
            out.append(line)
        p = policy("cost-per-step")
        reactive = done[done["strategy"] == "reactive"]
        if p is not None and not reactive.empty:
            r = reactive.iloc[0]
            out.append(
                f"{trace}, progress per dollar: policy {p['steps_per_dollar']:.0f} steps/$ "
                f"against {r['run']} {r['steps_per_dollar']:.0f} -> "
                + _compare(p["steps_per_dollar"], r["steps_per_dollar"], lower_is_better=False)
            )
    return out
