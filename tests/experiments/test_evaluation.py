"""The policy's evaluation: its runs, its first choices and its verdicts (the runs themselves are
real paced clusters: tests/test_paper_benchmarks.py runs the tiny form, benchmarks/NOTES.md the
figures)."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from transient_nb.catalog.lifetimes import parse_preemption
from transient_nb.experiments import evaluation
from transient_nb.policy.learning import DEFAULT_MARGIN


def test_every_trace_is_a_lifetime_model_and_a_bad_one_is_refused_before_any_run():
    for spec in evaluation.TRACES.values():
        parse_preemption(spec)
    with pytest.raises(
        ValueError, match="trace 'stormy': use one of calm, paper, storm, zonal-storm"
    ):
        evaluation.trials(["calm", "stormy"])


def test_the_zonal_storm_rages_only_where_the_clusters_start():
    """Its storm is in us-central1-a, where every cluster starts; the zone it may move to is
    calm, priced alike, and one the trace's clusters accept (TransientCluster refuses a model
    that names a zone it cannot use)."""
    from transient_nb.catalog.lifetimes import HOUR, revoked_within
    from transient_nb.catalog.prices import PriceCatalog

    model = parse_preemption(evaluation.TRACES["zonal-storm"])
    (calm,) = evaluation.TRACE_ZONES["zonal-storm"]
    assert revoked_within(model, "p100", 0, zone="us-central1-a") == pytest.approx(
        1 - math.exp(-HOUR / 300)
    )
    assert revoked_within(model, "p100", 0, zone=calm) < 0.05
    catalog = PriceCatalog.load("paper-2019")
    for gpu in evaluation.GPUS:
        here = catalog.worker_price(gpu, "n1-standard-8", "us-central1-a")
        there = catalog.worker_price(gpu, "n1-standard-8", calm)
        assert (here.spot, here.on_demand) == (there.spot, there.on_demand)
    assert {z for z, _ in model.zones} <= {"us-central1-a", calm}
    assert all(evaluation.TRACE_ZONES.get(t, ()) == () for t in ("calm", "paper", "storm"))


def test_the_regional_storm_leaves_only_another_region_calm():
    """Both zones of the PS's region storm; us-east1-c, in another region, is calm, and every
    zone the trace's clusters may use is named by its model."""
    from transient_nb.catalog.lifetimes import revoked_within
    from transient_nb.training.emulation import region_of

    model = parse_preemption(evaluation.TRACES["regional-storm"])
    zones = ("us-central1-a", *evaluation.TRACE_ZONES["regional-storm"])
    stormy = [z for z in zones if revoked_within(model, "p100", 0, zone=z) > 0.99]
    calm = [z for z in zones if revoked_within(model, "p100", 0, zone=z) < 0.05]
    assert stormy == ["us-central1-a", "us-central1-b"] and calm == ["us-east1-c"]
    assert region_of(calm[0]) != region_of("us-central1-a")


def test_format_zones_says_joined_and_revoked_per_zone():
    assert evaluation.format_zones({}) == ""
    assert evaluation.format_zones({"a": (3, 2), "b": (1, 0)}) == "a 3/2, b 1/0"


def test_the_runs_of_a_trace_and_the_policys_first_choices():
    runs = evaluation.trials(["paper"])
    assert [r.label for r in runs] == [
        "static 8 K80",
        "static 4 P100",
        "static 4 V100",
        "static 4 P100 on demand",
        "static 3 P100 on demand",
        "reactive 4 P100",
        "policy deadline",
        "policy budget",
        "policy cost-per-step",
    ]
    assert {r.trace for r in runs} == {"paper"}
    first = {r.goal["goal"]: r.setup for r in runs if r.strategy == "policy"}
    # At the paper's prices a P100 is the cheapest step: cost per step takes P100s only.
    assert set(first["cost-per-step"].types) == {"p100"}
    # The planner's expectation meets the goal it was chosen for.
    planner = evaluation.planner()
    for goal, setup in first.items():
        from transient_nb.policy.planner import Configuration

        kinds = {k.gpu: k for k in planner.kinds}
        e = planner.estimate(
            Configuration.of({kinds[g]: n for g, n in setup.types.items()}, setup.shards),
            64_000,
        )
        # With the policy's margin to spare, as its own first round plans (else that round
        # changes what the cluster was just given).
        if goal == "deadline":
            assert e.eta_s <= evaluation.DEADLINE_H * 3600 * (1 - DEFAULT_MARGIN)
        if goal == "budget":
            assert e.cost <= evaluation.BUDGET * (1 - DEFAULT_MARGIN)
        assert setup.spot and setup.workers == sum(setup.types.values()) <= 8
    # The budget is met fastest with the PS split in two (the paper's plateau at 4 P100).
    assert first["budget"].shards == 2 and first["deadline"].shards == 1


def _row(trace, strategy, run, hours, cost, failed=""):
    return {
        "trace": trace,
        "strategy": strategy,
        "run": run,
        "hours": hours,
        "cost": cost,
        "steps_per_dollar": 64_000 / cost if cost else float("nan"),
        "failed": failed,
    }


def test_verdicts_compare_with_the_right_static_run_and_say_better_only_when_it_is():
    table = pd.DataFrame(
        [
            _row("paper", "static", "static 8 K80", 0.50, 1.10),
            _row("paper", "static", "static 4 P100", 0.40, 0.93),
            _row("paper", "static", "static 4 V100", 0.40, 1.40),
            _row("paper", "static", "static 2 K80", 0.0, 0.0, failed="every worker was revoked"),
            _row("paper", "reactive", "reactive 4 P100", 0.41, 0.95),
            _row("paper", "policy", "policy deadline", 0.49, 0.88),
            _row("paper", "policy", "policy budget", 0.41, 0.97),
            _row("paper", "policy", "policy cost-per-step", 0.49, 0.90),
        ]
    )
    deadline, budget, per_dollar = evaluation.verdicts(table, deadline_h=0.6, budget=1.0)
    # The cheapest static within 0.6 h is 4 P100 ($0.93): the policy's $0.88 is better.
    assert deadline.startswith("paper, deadline 0.6 h: policy 0.49 h $0.88")
    assert "static 4 P100: 0.40 h $0.93 -> better (cost)" in deadline
    # The fastest static within $1 is 4 P100 (0.40 h): the policy's 0.41 h is worse.
    assert "static 4 P100: 0.40 h $0.93 -> worse (time)" in budget
    assert per_dollar.endswith("-> better") and "reactive 4 P100" in per_dollar
    # No static run meets a goal: said so.
    (deadline,) = evaluation.verdicts(table[table["run"] != "policy budget"], deadline_h=0.1)[:1]
    assert deadline.endswith("(no static configuration met it)")
    # A policy that overshoots its deadline is not better, however cheap.
    late = table.copy()
    late.loc[late["run"] == "policy deadline", "hours"] = 0.7
    assert evaluation.verdicts(late, deadline_h=0.6)[0].endswith("-> worse")
    assert "missed the deadline" in evaluation.verdicts(late, deadline_h=0.6)[0]
    # Within 1%: as good, not better (one run of one seed each).
    even = table.copy()
    even.loc[even["run"] == "policy budget", "hours"] = 0.4005
    assert evaluation.verdicts(even, budget=1.0)[1].endswith("-> as good (time)")


def test_the_plateau_trials_start_the_policy_on_one_ps():
    """The PS-bottleneck experiment is that the policy finds the plateau and adds a shard: its
    first choice is on one PS, like the static cluster it is measured against (on two it would
    start past the plateau, 5 V100 on 2 shards, and show nothing)."""
    runs = evaluation.plateau_trials()
    starts = [(r.strategy, r.setup.types, r.setup.shards) for r in runs]
    assert starts == [
        ("static", {"v100": 8}, 1),
        ("policy", {"v100": 8}, 1),
        ("static", {"k80": 8}, 1),
        ("policy", {"k80": 8}, 1),
    ]
