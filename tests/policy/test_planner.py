"""The planner: liveput, hazards, the PS plateau and goal choices, on synthetic observations."""

from __future__ import annotations

import math

import pytest

from tests.policy.policy_helpers import K80, K80_OD, P100, P100_OD, PS, V100, V100_OD
from transient_nb.catalog.prices import PriceCatalog
from transient_nb.policy.memory import Observations
from transient_nb.policy.planner import (
    NEAR_EQUAL,
    PRIOR_HOURS,
    Configuration,
    Kind,
    Planner,
    kinds_from_catalog,
    paper_hazard_per_h,
    plan_fields,
)


def test_liveput_is_the_expected_rate_under_preemptions_capped_by_the_ps():
    planner = Planner([K80, V100, K80_OD, V100_OD], PS, startup_s=100.0)
    # On demand: no revocations, the sum of the rates (K80 scales linearly to 8, as the paper).
    assert planner.liveput(Configuration.of({K80_OD: 8})) == pytest.approx(8 * 4.56)
    # Fast GPUs hit the single PS's plateau; a second shard lifts it.
    assert planner.liveput(Configuration.of({V100_OD: 8})) == pytest.approx(45.0)
    assert planner.liveput(Configuration.of({V100_OD: 8}, shards=2)) == pytest.approx(78.75)
    # Spot: each worker is up mttf / (mttf + startup) of the time.
    p = planner.availability(K80)
    mttf = 3600 / planner.hazard_per_h(K80)
    assert p == pytest.approx(mttf / (mttf + 100.0)) and 0.97 < p < 1
    assert planner.liveput(Configuration.of({K80: 1})) == pytest.approx(p * 4.56)
    assert planner.liveput(Configuration.of({K80: 3})) == pytest.approx(3 * p * 4.56)
    # Below the cap in expectation but above it when all are up: exact, not min(E[sum], cap).
    three = Configuration.of({V100: 3})
    q = planner.availability(V100)
    exact = sum(math.comb(3, k) * q**k * (1 - q) ** (3 - k) * min(k * 15.6, 45.0) for k in range(4))
    assert planner.liveput(three) == pytest.approx(exact)
    assert planner.liveput(three) < min(3 * q * 15.6, 45.0)
    assert planner.liveput(Configuration.of({})) == 0.0


def test_the_chance_of_losing_k_workers_within_an_hour():
    planner = Planner([K80, K80_OD], PS)
    q = 1 - math.exp(-planner.hazard_per_h(K80))
    two = Configuration.of({K80: 2, K80_OD: 3})  # on-demand ones are never revoked
    assert planner.p_lose_at_least(two, 0) == pytest.approx(1.0)
    assert planner.p_lose_at_least(two, 1) == pytest.approx(1 - (1 - q) ** 2)
    assert planner.p_lose_at_least(two, 2) == pytest.approx(q**2)
    assert planner.p_lose_at_least(two, 3) == pytest.approx(0.0)
    q2 = 1 - math.exp(-planner.hazard_per_h(K80) * 2)
    assert planner.p_lose_at_least(two, 1, within_s=7200) == pytest.approx(1 - (1 - q2) ** 2)


def test_the_frontier_stops_adding_workers_the_ps_cannot_serve():
    planner = Planner([V100_OD], PS)
    one_shard = [c for c in planner.frontier(max_workers=8, max_shards=2) if c.shards == 1]
    # 3 V100s reach 45 steps/s (46.8 > 45): a 4th adds nothing, so the path ends at 3.
    assert [c.size for c in one_shard] == [1, 2, 3]
    two_shards = [c for c in planner.frontier(max_workers=8, max_shards=2) if c.shards == 2]
    assert [c.size for c in two_shards] == [1, 2, 3, 4, 5, 6]


def test_a_deadline_gets_the_cheapest_configuration_that_meets_it():
    planner = Planner([K80, V100], PS)
    steps = 64_000
    loose = planner.choose("deadline", steps, max_workers=8, deadline_s=10 * 3600)
    tight = planner.choose("deadline", steps, max_workers=8, deadline_s=1.0 * 3600)
    assert loose.feasible and tight.feasible
    assert loose.chosen.eta_s <= 10 * 3600 and tight.chosen.eta_s <= 3600
    assert loose.chosen.cost <= tight.chosen.cost * (1 + NEAR_EQUAL)
    # Nothing more than NEAR_EQUAL cheaper meets it, and of what is that near, none is expected
    # to lose fewer workers an hour.
    meet = [e for e in tight.candidates if e.eta_s <= 3600]
    cheapest = min(e.cost for e in meet)
    assert tight.chosen.cost <= cheapest * (1 + NEAR_EQUAL)
    for e in meet:
        if e.cost <= cheapest * (1 + NEAR_EQUAL):
            assert planner.revocations_per_h(e.config) >= planner.revocations_per_h(
                tight.chosen.config
            )
    impossible = planner.choose("deadline", steps, max_workers=2, deadline_s=60)
    assert not impossible.feasible and "no configuration meets the deadline" in impossible.reason
    assert impossible.chosen.eta_s == min(e.eta_s for e in impossible.candidates)


def test_a_budget_gets_the_fastest_configuration_within_it():
    planner = Planner([K80, V100], PS)
    plan = planner.choose("budget", 64_000, max_workers=8, budget=1.5)
    assert plan.feasible and plan.chosen.cost <= 1.5
    for e in plan.candidates:
        if e.cost <= 1.5:
            # Nothing within the budget is more than 1% faster (what is that near is as fast).
            assert e.eta_s >= plan.chosen.eta_s / 1.01 - 1e-6
            if e.eta_s <= min(c.eta_s for c in plan.candidates if c.cost <= 1.5) * 1.01:
                assert e.cost >= plan.chosen.cost - 1e-9
    poor = planner.choose("budget", 64_000, max_workers=8, budget=0.01)
    assert not poor.feasible and poor.chosen.cost == min(e.cost for e in poor.candidates)


def test_a_budget_does_not_pay_for_a_fraction_of_a_percent_beyond_the_ps_plateau():
    """At the paper's prices 4 P100 already reach the PS plateau; 5 K80 + 3 P100 are 0.1%
    faster and 31% dearer. Within a budget that allows both, the cheaper one is chosen."""
    kinds = kinds_from_catalog(
        PriceCatalog.load("paper-2019"), ["k80", "p100"], ["us-central1-a"], "n1-standard-8"
    )
    planner = Planner(kinds, PS)
    plan = planner.choose("budget", 64_000, max_workers=8, max_shards=1, budget=1.5)
    fastest = min(e.eta_s for e in plan.candidates if e.cost <= 1.5)
    assert plan.chosen.eta_s <= fastest * 1.01
    dearer = [e for e in plan.candidates if e.cost <= 1.5 and e.cost > plan.chosen.cost * 1.2]
    assert any(e.eta_s < plan.chosen.eta_s for e in dearer)  # what the old rule bought
    assert plan.chosen.cost < 1.0


def test_cost_per_step_and_the_reason_against_the_current_configuration():
    planner = Planner([K80, V100], PS)
    now = Configuration.of({K80: 1})
    plan = planner.choose("cost-per-step", 64_000, max_workers=8, current=now)
    best = min(e.cost_per_step for e in plan.candidates)
    assert plan.chosen.cost_per_step <= best * (1 + NEAR_EQUAL)
    assert now in [e.config for e in plan.candidates]  # staying is always weighed
    assert plan.reason.startswith(plan.chosen.config.describe() + ": ETA ")
    assert " -> " in plan.reason and "$/h" in plan.reason
    fields = plan_fields(plan)
    assert fields["goal"] == "cost-per-step" and fields["reason"] == plan.reason
    assert sum(fields["workers"].values()) == plan.chosen.config.size


def test_a_second_shard_is_bought_for_v100s_near_the_plateau_not_for_k80s():
    steps = 64_000
    fast = Planner([V100_OD], PS).choose(
        "deadline", steps, max_workers=8, deadline_s=steps / 60.0
    )  # needs 60 steps/s: above one PS's 45
    assert fast.feasible and fast.chosen.config.shards == 2
    slow = Planner([K80_OD], PS).choose(
        "deadline", steps, max_workers=8, deadline_s=steps / 30.0
    )  # 30 steps/s: 7 K80s, below the plateau
    # K80s scale linearly below it, and the PS host's price is shared by more of them: all 8
    # are cheapest (the paper's lesson), and a second PS host would only add its price.
    assert slow.feasible and slow.chosen.config.shards == 1 and slow.chosen.config.size == 8


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"goal": "fastest"}, "goal='fastest': use one of deadline, budget, cost-per-step"),
        ({"goal": "deadline"}, "needs a positive deadline, not None"),
        ({"goal": "deadline", "deadline_s": -5}, "needs a positive deadline, not -5"),
        ({"goal": "budget", "budget": 0}, "needs a positive budget in dollars, not 0"),
    ],
)
def test_bad_goals_are_refused_with_what_to_do(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Planner([K80], PS).choose(remaining_steps=1000, max_workers=4, **kwargs)


def test_no_kinds_and_kinds_without_rates_are_refused():
    with pytest.raises(ValueError, match="at least one kind"):
        Planner([], PS)
    with pytest.raises(ValueError, match="no kind of worker has a step rate"):
        Planner([Kind("tpu", "z", True, 1.0)], PS).choose("cost-per-step", 10, max_workers=2)


def test_a_worker_far_from_the_ps_steps_slower_and_is_chosen_only_for_a_reason():
    """The paper: workers in another region than the PS trained up to 48% slower. The planner
    weighs that against what another zone offers (here: a storm at home)."""
    near = Kind("p100", "us-central1-b", True, 0.551)
    far = Kind("p100", "us-east1-c", True, 0.551)
    planner = Planner([near, far], PS, ps_zone="us-central1-a", ps_steps_per_s=None)
    assert planner.kind_rate(near) == 12.2
    assert planner.kind_rate(far) == pytest.approx(12.2 / 1.48)
    one_near, one_far = Configuration.of({near: 1}), Configuration.of({far: 1})
    assert planner.liveput(one_far) == pytest.approx(planner.liveput(one_near) / 1.48)
    # Without the PS's zone placement is not weighed.
    assert Planner([near, far], PS).kind_rate(far) == 12.2
    # One price, one hazard: the near zone.
    plan = planner.choose("cost-per-step", 64_000, max_workers=4, max_shards=1)
    assert {k.zone for k, _ in plan.chosen.config.workers} == {"us-central1-b"}
    # A storm at home: with a revocation every 5 minutes per worker a near worker is still up
    # 71% of the time (a boot of 89.5 s, then 19 s of its lifetime loading), more than a far
    # one's 1/1.48 = 68%: it stays; with one every 2 minutes (up 51% of the time) the far zone
    # is worth its slowness.
    planner.observe_exposure("p100", "us-central1-b", hours=4.0 - PRIOR_HOURS, revocations=50)
    assert planner.availability(near) == pytest.approx(0.714, abs=0.001)
    plan = planner.choose("cost-per-step", 64_000, max_workers=4, max_shards=1)
    assert {k.zone for k, _ in plan.chosen.config.workers} == {"us-central1-b"}
    planner.observe_exposure("p100", "us-central1-b", hours=0.0, revocations=60)
    assert planner.availability(near) == pytest.approx(0.514, abs=0.001)
    plan = planner.choose("cost-per-step", 64_000, max_workers=4, max_shards=1)
    assert {k.zone for k, _ in plan.chosen.config.workers} == {"us-east1-c"}
    # A far worker's report is kept as a near one's rate.
    planner.observe_rate("p100", 10.0, zone="us-east1-c")
    planner.observe_rate("p100", 10.0, zone="us-central1-b")
    planner.observe_rate("p100", 10.0, zone=None)
    assert sorted(planner._observed_rates["p100"]) == pytest.approx([10.0, 10.0, 14.8])


def test_an_expensive_ps_is_shared_by_fast_workers_that_the_greedy_path_would_miss():
    """Adding workers one at a time by their own liveput per dollar walks the cheap K80s (40
    steps/s per $/h against a V100's 35) and never weighs the PS host every worker shares: at
    $1/h for the PS, 3 V100 at its capacity cost 35% less a step than 4 K80."""
    k80, v100 = Kind("k80", "z", False, 0.115), Kind("v100", "z", False, 0.45)
    planner = Planner([k80, v100], 1.0)
    plan = planner.choose("cost-per-step", 64_000, max_workers=4, max_shards=1)
    assert plan.chosen.config == Configuration.of({v100: 3})
    four_k80 = planner.estimate(Configuration.of({k80: 4}), 64_000)
    assert plan.chosen.cost_per_step < 0.7 * four_k80.cost_per_step


def test_staying_is_weighed_and_a_plan_never_advises_a_worse_configuration():
    """Whatever the cluster runs now, the plan's choice is expected at least as good per step
    (within NEAR_EQUAL, where it prefers fewer revocations), or the same."""
    kinds = [
        Kind("k80", "a", True, 0.256),
        Kind("p100", "a", True, 0.551),
        Kind("v100", "b", True, 0.861),
    ]
    planner = Planner(kinds, 0.6, ps_zone="a")
    planner.observe_exposure("p100", "a", hours=1.0, revocations=12)
    for counts in [(4, 0, 0), (0, 3, 0), (1, 1, 1), (0, 0, 4), (2, 2, 0)]:
        now = Configuration.of(dict(zip(kinds, counts, strict=True)))
        plan = planner.choose("cost-per-step", 64_000, max_workers=4, max_shards=1, current=now)
        assert plan.current is not None and now in [e.config for e in plan.candidates]
        assert plan.chosen.cost_per_step <= plan.current.cost_per_step * (1 + NEAR_EQUAL)
    # A configuration outside the bounds is not kept for being the current one.
    big = Configuration.of({kinds[0]: 8})
    plan = planner.choose("cost-per-step", 64_000, max_workers=4, max_shards=1, current=big)
    assert plan.chosen.config.size <= 4


def test_under_a_storm_near_equal_sizes_go_to_the_one_that_loses_fewest_workers():
    """A revocation every 5 minutes per worker and start-ups of 5 minutes: the model's dollars
    per step are nearly flat from 3 P100 on one PS to 8 on two (round eight's runaway grew to
    8). Within NEAR_EQUAL of the best, the fewest revocations an hour win."""
    catalog = PriceCatalog.load("paper-2019")
    kinds = kinds_from_catalog(catalog, ["k80", "p100", "v100"], ["us-central1-a"], "n1-standard-8")
    planner = Planner(kinds, PS)
    for kind in kinds:
        planner.observe_exposure(kind.gpu, kind.zone, hours=10.0, revocations=120)
    planner.observe_startup(300.0)
    plan = planner.choose("cost-per-step", 64_000, max_workers=8, max_shards=2)
    best = min(plan.candidates, key=lambda e: e.cost_per_step)
    assert best.config.size == 8 and best.config.shards == 2  # what the model alone prefers
    assert plan.chosen.config.describe() == "3 p100 in us-central1-a, 1 PS shard"
    assert plan.chosen.cost_per_step <= best.cost_per_step * (1 + NEAR_EQUAL)
    assert planner.revocations_per_h(plan.chosen.config) == pytest.approx(
        3 / 8 * planner.revocations_per_h(best.config)
    )
    # Calm, the same sizes are not near-equal and the best is kept.
    calm = Planner(kinds, PS)
    plan = calm.choose("cost-per-step", 64_000, max_workers=8, max_shards=2)
    assert plan.chosen.cost_per_step == min(e.cost_per_step for e in plan.candidates)


def test_a_storm_in_a_zone_is_expected_of_every_gpu_type_there():
    """Round nine's flapping: under a storm on its P100s, the policy moved to 8 K80, then 2
    V100, then back, each untried type looking calm by its prior. A zone's revocations now
    scale the priors of the types not tried there yet (the paper's ratios between types kept)."""
    catalog = PriceCatalog.load("paper-2019")
    zones = ["us-central1-a", "us-central1-b"]
    kinds = kinds_from_catalog(catalog, ["k80", "p100", "v100"], zones, "n1-standard-8")
    planner = Planner(kinds, PS)
    by = {(k.gpu, k.zone): k for k in kinds}
    planner.observe_exposure("p100", "us-central1-a", hours=1.5, revocations=18)
    planner.observe_startup(300.0)
    p100_prior = paper_hazard_per_h("p100")
    factor = (p100_prior * PRIOR_HOURS + 18) / (p100_prior * (PRIOR_HOURS + 1.5))
    assert planner.zone_factor("us-central1-a") == pytest.approx(factor)
    assert planner.zone_factor("us-central1-a", but="p100") == 1.0  # its own data counts once
    for gpu in ("k80", "v100"):
        assert planner.hazard_per_h(by[(gpu, "us-central1-a")]) == pytest.approx(
            paper_hazard_per_h(gpu) * factor
        )
        assert planner.hazard_per_h(by[(gpu, "us-central1-b")]) == pytest.approx(
            paper_hazard_per_h(gpu)
        )
    assert planner.hazard_per_h(by[("p100", "us-central1-a")]) == pytest.approx(
        (p100_prior * PRIOR_HOURS + 18) / (PRIOR_HOURS + 1.5)
    )
    # In its own zone, no other type is expected to be worth a change (the policy's 10%).
    now = Configuration.of({by[("p100", "us-central1-a")]: 3})
    near = Planner([k for k in kinds if k.zone == "us-central1-a"], PS)
    near.observe_exposure("p100", "us-central1-a", hours=1.5, revocations=18)
    near.observe_startup(300.0)
    plan = near.choose("cost-per-step", 64_000, max_workers=8, max_shards=1, current=now)
    assert plan.current is not None
    assert plan.chosen.cost_per_step > 0.9 * plan.current.cost_per_step
    # A calm zone nearby is: the P100s are expected to live there.
    plan = planner.choose("cost-per-step", 64_000, max_workers=8, max_shards=1, current=now)
    assert plan.current is not None
    assert {k.zone for k, _ in plan.chosen.config.workers} == {"us-central1-b"}
    assert plan.chosen.cost_per_step < 0.9 * plan.current.cost_per_step


def _stormy(planner: Planner) -> Planner:
    """12 revocations an hour per P100 observed, and 300 s start-ups (the paper's 19 s of them
    loading): a Spot worker up 48% of the time."""
    planner.observe_exposure("p100", "us-central1-a", hours=2.0 - PRIOR_HOURS, revocations=24)
    for _ in range(3):
        planner.observe_startup(300.0)
    return planner


def test_a_deadline_spot_misses_in_a_storm_is_met_with_on_demand_workers_beside_spot():
    """At most 4 workers and 0.45 h for 64K steps. Calm, 4 Spot P100 make it (0.40 h); in a
    storm they would take 0.76 h, and 4 on demand cost $2.38. The planner keeps one Spot
    P100 beside three on demand: within the deadline, 8% cheaper than all on demand."""
    deadline = 0.45 * 3600
    calm = Planner([P100, P100_OD], 0.19).choose(
        "deadline", 64_000, max_workers=4, max_shards=1, deadline_s=deadline
    )
    assert calm.chosen.config.counts == {P100: 4}
    storm = _stormy(Planner([P100, P100_OD], 0.19))
    spot = storm.estimate(Configuration.of({P100: 4}), 64_000)
    dear = storm.estimate(Configuration.of({P100_OD: 4}), 64_000)
    assert spot.eta_s > deadline and dear.eta_s <= deadline
    plan = storm.choose("deadline", 64_000, max_workers=4, max_shards=1, deadline_s=deadline)
    assert plan.feasible and plan.chosen.eta_s <= deadline
    assert plan.chosen.config.counts == {P100: 1, P100_OD: 3}
    assert plan.chosen.cost < dear.cost * 0.93
    assert "3 p100 in us-central1-a (on demand)" in plan.reason
    assert plan_fields(plan)["workers"] == {
        "p100@us-central1-a": 1,
        "p100@us-central1-a:on-demand": 3,
    }
    # For the best price per step, the storm's Spot P100 (up 2/3 of the time at 29% of the
    # on-demand price) still beat on-demand ones: none is bought.
    cheap = storm.choose("cost-per-step", 64_000, max_workers=4, max_shards=1)
    assert all(k.spot for k in cheap.chosen.config.counts)


def test_availability_weighs_what_the_workers_showed_against_the_model():
    """The model expects a storm's Spot P100 up 48% of the time. Its workers held their places
    3 h and trained 0.6 h of them (20%): the planner expects what they showed, the model
    counting as half an hour; on-demand workers, and kinds not observed, keep the model's."""
    storm = _stormy(Planner([P100, P100_OD], 0.19))
    model = storm.availability(P100)
    assert model == pytest.approx(storm.model_availability(P100)) == pytest.approx(0.48, abs=0.01)
    storm.observe_availability("P100", "us-central1-a", held_h=3.0, trained_h=0.6)
    expected = (model * PRIOR_HOURS + 0.6) / (PRIOR_HOURS + 3.0)
    assert storm.availability(P100) == pytest.approx(expected) == pytest.approx(0.24, abs=0.01)
    assert storm.model_availability(P100) == pytest.approx(model)
    assert storm.availability(P100_OD) == 1.0
    assert storm.availability(Kind("p100", "us-east1-c", True, 0.43)) < 1.0
    # Totals, not increments: the next observation replaces this one; nonsense is ignored.
    storm.observe_availability("p100", "us-central1-a", held_h=3.0, trained_h=1.5)
    assert storm.availability(P100) == pytest.approx((model * PRIOR_HOURS + 1.5) / 3.5)
    for held, trained in ((0.0, 0.0), (math.nan, 1.0), (1.0, math.inf)):
        storm.observe_availability("p100", "us-central1-a", held_h=held, trained_h=trained)
    assert storm.availability(P100) == pytest.approx((model * PRIOR_HOURS + 1.5) / 3.5)
    # Trained more than held (clocks): no more than always up.
    storm.observe_availability("p100", "us-central1-a", held_h=1.0, trained_h=2.0)
    assert storm.availability(P100) <= 1.0


def test_spot_workers_that_trained_less_than_the_model_expects_make_a_deadline_on_demand():
    """The deadline of the test above: the model alone keeps one Spot P100 beside three on
    demand. Where the storm's Spot P100s trained a fifth of their time, a Spot worker adds
    little: all four on demand."""
    deadline = 0.45 * 3600
    storm = _stormy(Planner([P100, P100_OD], 0.19))
    storm.observe_availability("p100", "us-central1-a", held_h=3.0, trained_h=0.6)
    plan = storm.choose("deadline", 64_000, max_workers=4, max_shards=1, deadline_s=deadline)
    assert plan.feasible and plan.chosen.config.counts == {P100_OD: 4}


def test_cost_per_step_counts_the_start_up_of_a_change():
    """Under the storm, with Spot P100s seen training a fifth of their time, six on demand on
    two PS shards cost 26% less per step than three Spot ones once they run. A change to them
    pays their start-up (300 s, billed): with 20,000 steps left it costs more per step than
    staying, with 640,000 less."""
    storm = _stormy(Planner([P100, P100_OD], 0.19))
    storm.observe_availability("p100", "us-central1-a", held_h=3.0, trained_h=0.6)
    now, dear = Configuration.of({P100: 3}), Configuration.of({P100_OD: 6}, 2)
    stay = storm.estimate(now, 20_000)
    steady = storm.estimate(dear, 20_000)
    assert steady.cost_per_step < 0.75 * stay.cost_per_step
    assert stay.cost_per_step == pytest.approx(stay.hourly / 3600 / stay.liveput)
    change = storm.estimate(dear, 20_000, current=now)
    assert change.cost_per_step == pytest.approx(change.cost / 20_000)
    assert change.cost_per_step > stay.cost_per_step
    plan = storm.choose("cost-per-step", 20_000, max_workers=6, max_shards=2, current=now)
    assert plan.current is not None and plan.chosen.config != dear
    # Nothing is worth the policy's 10% hysteresis: no change.
    assert plan.chosen.cost_per_step > 0.9 * plan.current.cost_per_step
    late = storm.estimate(dear, 640_000, current=now)
    assert late.cost_per_step < 0.8 * storm.estimate(now, 640_000).cost_per_step


def test_observations_at_their_bounds():
    """What counts and what does not, at the edges: a start-up must be positive and finite, a
    load from 0 to the start-up itself; half an hour of places counts; a start-up that is all
    load leaves no boot, and a Spot worker is then up exp(-load / mttf) of the time."""
    planner = Planner([P100], 0.19)
    for bad in (0.0, -1.0, math.inf, math.nan):
        planner.observe_startup(bad, 0.0)
    assert planner.startup_s == pytest.approx(108.5) and planner.load_s == 19.0
    planner.observe_startup(0.5, 0.5)
    assert (planner.startup_s, planner.load_s) == (0.5, 0.5)
    for seconds, load in ((200.0, 0.0), (300.0, 300.0)):
        other = Planner([P100], 0.19)
        other.observe_startup(seconds, load)
        assert (other.startup_s, other.load_s) == (seconds, load)
    whole = Planner([P100], 0.19)
    whole.observe_startup(200.0, 200.0)
    mttf = 3600 / whole.hazard_per_h(P100)
    assert whole.model_availability(P100) == pytest.approx(math.exp(-200.0 / mttf), rel=1e-12)
    before = whole.availability(P100)
    whole.observe_availability("p100", "us-central1-a", held_h=0.5, trained_h=0.1)
    assert whole.availability(P100) == pytest.approx((before * PRIOR_HOURS + 0.1) / 1.0)


def test_on_demand_beside_spot_is_a_candidate_of_each_size_for_each_type_and_zone():
    other = Kind("p100", "us-east1-c", True, 0.43)
    planner = Planner([P100, P100_OD, other], 0.19)
    mixed = [c for c in planner.frontier(max_workers=4, max_shards=1) if len(c.counts) == 2]
    pairs = {(c.counts.get(P100_OD, 0), c.counts.get(P100, 0)) for c in mixed}
    # Every split of up to 4 workers between the two kinds of the same type and zone.
    assert {(1, 1), (1, 2), (1, 3), (2, 1), (2, 2), (3, 1)} <= pairs
    # Never on demand beside Spot of another zone (the greedy walk may mix Spot zones).
    assert not any(P100_OD in c.counts and other in c.counts for c in mixed)


def test_a_change_late_in_a_run_pays_the_start_up_of_the_workers_it_adds():
    """2,000 steps left for 3 P100 (55 s) and 50 s to the deadline. Alone, 4 P100 would make it
    (41 s); but a fourth worker joins after a start-up (108 s by the paper's prior), after the
    three have finished: no change meets the deadline sooner than staying, and staying is the
    cheapest of the closest."""
    planner = Planner([P100, P100_OD], 0.19)
    now = Configuration.of({P100: 3})
    four = Configuration.of({P100: 4})
    assert planner.estimate(four, 2_000).eta_s < 50 < planner.estimate(now, 2_000).eta_s
    late = planner.estimate(four, 2_000, current=now)
    assert late.eta_s == pytest.approx(planner.estimate(now, 2_000).eta_s)
    plan = planner.choose(
        "deadline", 2_000, max_workers=4, max_shards=1, deadline_s=50.0, current=now
    )
    assert plan.chosen.config == now and not plan.feasible
    # Early, the start-up is worth it: 64K steps, 0.45 h, 4 P100 from 3 (the fourth after 108 s).
    early = planner.estimate(four, 64_000, current=now)
    alone = planner.estimate(four, 64_000)
    assert early.eta_s == pytest.approx(
        planner.startup_s + (64_000 - planner.liveput(now) * planner.startup_s) / alone.liveput
    )
    plan = planner.choose(
        "deadline", 64_000, max_workers=4, max_shards=1, deadline_s=0.45 * 3600, current=now
    )
    assert plan.chosen.config == four


def test_a_storm_takes_the_load_out_of_a_workers_lifetime():
    """A cycle is a boot and a lifetime; the worker trains from its load on, if it lives that
    long. 300 s lifetimes, 90 s boots and 210 s of loading: up 300 * exp(-0.7) / 390 = 38% of
    the time, not 300 / 600 = 50% (the whole start-up taken as down, the whole lifetime up)."""
    planner = Planner([P100], 0.19)
    assert planner.load_s == 19.0 and planner.startup_s == pytest.approx(108.5)
    planner.observe_exposure("p100", "us-central1-a", hours=1000.0, revocations=12_000)
    planner.observe_startup(300.0, load_s=210.0)
    assert planner.hazard_per_h(P100) == pytest.approx(12.0, rel=3e-3)
    assert planner.availability(P100) == pytest.approx(300 * math.exp(-0.7) / 390, rel=3e-3)
    # Nothing observed of the load: the paper's 19 s, never more than the start-up.
    assert Planner([P100], 0.19, startup_s=10.0).load_s == 10.0
    planner.observe_startup(300.0, load_s=400.0)  # more than the start-up: not a load
    assert planner._observed_loads == [210.0]


# -- exact arithmetic: on-demand K80s at 4 steps/s, no PS bound -----------------------------------
K80_A = Kind("k80", "a", False, 0.5)


def _exact(*kinds: Kind, ps_hourly: float = 0.0) -> Planner:
    """A planner whose estimates are exact: 4 steps/s per K80 on demand, no PS bound."""
    return Planner(list(kinds) or [K80_A], ps_hourly, steps_per_s={"k80": 4.0}, ps_steps_per_s=None)


def test_the_reason_reads_the_eta_and_the_price_against_the_current_configuration():
    """What users read of a decision: the ETA from now to the chosen one, the change in dollars
    an hour, the expected cost; "never" for a cluster that does not train."""
    planner = _exact(ps_hourly=0.1)
    plan = planner.choose(
        "cost-per-step", 7200, max_workers=2, current=Configuration.of({K80_A: 1})
    )
    # Staying: 0.5 h at $0.60/h; two: the second after 108.5 s, 0.27 h at $1.10/h.
    assert plan.reason == (
        "2 k80 in a (on demand), 1 PS shard: ETA 0.50 h -> 0.27 h, +0.50 $/h, "
        "expected $0.29 to finish"
    )
    plan = planner.choose("cost-per-step", 7200, max_workers=2)
    assert plan.reason == (
        "2 k80 in a (on demand), 1 PS shard: ETA 0.25 h, 1.10 $/h, expected $0.28 to finish"
    )
    idle = Configuration.of({Kind("tpu", "a", False, 1.0): 1})  # no step rate: never done
    plan = planner.choose("cost-per-step", 7200, max_workers=2, current=idle)
    assert plan.reason.startswith("2 k80 in a (on demand), 1 PS shard: ETA never -> 0.28 h, ")
    plan = planner.choose("deadline", 7200, max_workers=2, deadline_s=60.0)
    assert not plan.feasible
    assert plan.reason == (
        "2 k80 in a (on demand), 1 PS shard: ETA 0.25 h, 1.10 $/h, expected $0.28 to finish"
        " (no configuration meets the deadline: the closest one)"
    )


def test_a_plan_knows_its_limit_and_what_meets_it():
    """The policy asks a plan whether an estimate meets its goal (to keep or change the
    cluster): the deadline in seconds, the budget in dollars, at the limit included."""
    planner = _exact()
    plan = planner.choose("deadline", 7200, max_workers=2, deadline_s=900.0)
    assert plan.limit == 900.0 and plan.feasible
    two = planner.estimate(Configuration.of({K80_A: 2}), 7200)  # 900 s, $0.25
    one = planner.estimate(Configuration.of({K80_A: 1}), 7200)  # 1800 s, $0.25
    assert plan.meets(two) and not plan.meets(one)
    plan = planner.choose("budget", 7200, max_workers=2, budget=0.25)
    assert plan.limit == 0.25 and plan.feasible
    assert plan.meets(one) and plan.meets(two)  # within the money, however slow
    assert not plan.meets(planner.estimate(Configuration.of({K80_A: 1}), 7201))
    # Cost per step has no limit, even when a budget is passed along: every estimate meets it.
    plan = planner.choose("cost-per-step", 7200, max_workers=2, budget=0.01)
    assert plan.limit is None and plan.feasible is True and plan.meets(one)
    assert "no configuration meets" not in plan.reason


def test_ties_go_to_the_faster_for_cost_and_budget_and_to_the_cheaper_for_a_deadline():
    """With no PS to share, K80s on demand cost the same per step at every size: the fastest
    is taken; a deadline no one meets gets the fastest, and of equally fast, the cheapest."""
    planner = _exact()
    plan = planner.choose("cost-per-step", 7200, max_workers=4)
    assert plan.chosen.config == Configuration.of({K80_A: 4})
    poor = planner.choose("budget", 7200, max_workers=4, budget=0.1)  # all cost $0.25
    assert not poor.feasible and poor.chosen.config == Configuration.of({K80_A: 4})
    exact = planner.choose("deadline", 7200, max_workers=2, deadline_s=900.0)
    assert exact.feasible and exact.chosen.eta_s == 900.0  # met at the second itself
    dear = Kind("k80", "b", False, 0.6)
    plan = _exact(dear, K80_A).choose("deadline", 7200, max_workers=1, deadline_s=60.0)
    assert not plan.feasible and plan.chosen.config == Configuration.of({K80_A: 1})


def test_the_search_bounds_of_a_choice():
    """Two PS shards at most unless asked for more; a running PS's shards are a floor; the
    cluster's current configuration is weighed even of a kind no longer offered; what never
    trains is never a candidate."""
    steps = 64_000
    planner = Planner([V100_OD], PS)
    assert {c.shards for c in planner.frontier(max_workers=2)} == {1, 2}
    # 90 steps/s: more than two shards serve (78.75); three serve 105.
    plan = planner.choose("deadline", steps, max_workers=8, deadline_s=steps / 90.0)
    assert not plan.feasible and plan.chosen.config.shards == 2
    three = planner.choose("deadline", steps, max_workers=8, max_shards=3, deadline_s=steps / 90)
    assert three.feasible and three.chosen.config.shards == 3
    floor = planner.choose("cost-per-step", steps, max_workers=4, min_shards=2, max_shards=2)
    assert {e.config.shards for e in floor.candidates} == {2}
    # A floor above the search's ceiling: the floor.
    assert {c.shards for c in planner.frontier(4, max_shards=1, min_shards=2)} == {2}
    assert {c.shards for c in planner.frontier(2, max_shards=0, min_shards=0)} == {1}
    old = Configuration.of({V100: 1})  # Spot V100s are not offered any more
    plan = Planner([K80], PS).choose("cost-per-step", steps, max_workers=4, current=old)
    assert old in [e.config for e in plan.candidates]
    idle = Configuration.of({Kind("tpu", "us-central1-a", False, 1.0): 2})
    plan = Planner([K80], PS).choose("cost-per-step", steps, max_workers=4, extra=[idle])
    assert idle not in [e.config for e in plan.candidates]
    assert all(e.liveput > 0 for e in plan.candidates)


def test_a_deadline_must_be_positive_but_may_be_short():
    """Zero seconds left is no deadline to plan for; half a second is one (missed: the
    closest configuration)."""
    with pytest.raises(ValueError, match="needs a positive deadline, not 0"):
        Planner([K80], PS).choose("deadline", 1000, max_workers=2, deadline_s=0)
    plan = Planner([K80], PS).choose("deadline", 1000, max_workers=2, deadline_s=0.5)
    assert not plan.feasible and plan.limit == 0.5


def test_workers_slower_than_a_step_a_second_are_planned_for():
    """A slow worker (0.5 steps/s, a large model) still trains: finite ETAs and costs, its
    start-up counted in a change, a frontier of its sizes beside a cheaper fast kind."""
    slow = Kind("k80", "a", False, 1.0)
    fast = Kind("v100", "a", False, 0.5)
    planner = Planner([slow], 0.0, steps_per_s={"k80": 0.5, "v100": 4.0}, ps_steps_per_s=None)
    one = planner.estimate(Configuration.of({slow: 1}), 100)
    assert (one.liveput, one.eta_s, one.cost) == (0.5, 200.0, pytest.approx(200 / 3600))
    two = planner.estimate(Configuration.of({slow: 2}), 100, current=Configuration.of({slow: 1}))
    assert two.eta_s == pytest.approx(108.5 + (100 - 0.5 * 108.5) / 1.0)
    plan = planner.choose("cost-per-step", 100, max_workers=1)
    assert plan.chosen.config == Configuration.of({slow: 1})
    both = Planner([slow, fast], 0.0, steps_per_s={"k80": 0.5, "v100": 4.0}, ps_steps_per_s=None)
    frontier = both.frontier(max_workers=3, max_shards=1)
    assert {c.size for c in frontier if c.counts.keys() == {slow}} == {1, 2, 3}
    planner.observe_rate("k80", 0.25)  # slower still than its prior: seen, it counts
    assert planner.rate("k80") == 0.25


def test_a_configuration_that_never_trains_never_finishes_and_costs_without_end():
    """No workers (or none with a rate): an infinite ETA and cost, free PS or not, from
    scratch or as a change from the current cluster."""
    for planner in (_exact(), _exact(ps_hourly=0.1)):
        for current in (None, Configuration.of({K80_A: 1})):
            e = planner.estimate(Configuration.of({}), 1000, current=current)
            assert e.liveput == 0 and e.eta_s == math.inf and e.cost == math.inf
            assert e.cost_per_step == math.inf
    idle = Configuration.of({Kind("tpu", "a", False, 1.0): 1})
    e = _exact().estimate(idle, 1000, current=Configuration.of({K80_A: 1}))
    assert e.eta_s == math.inf and e.cost == math.inf


def test_a_change_keeps_the_shards_and_workers_it_has_until_the_new_ones_start():
    """Until the added workers start, the kept ones train on the shards kept (two here: 62.4
    steps/s, not one shard's 45); workers of a kind the cluster has none of add nothing then."""
    planner = Planner([V100_OD], PS)
    now, more = Configuration.of({V100_OD: 4}, 2), Configuration.of({V100_OD: 5}, 2)
    assert planner.liveput(now) == pytest.approx(62.4)
    wait = planner.startup_s
    e = planner.estimate(more, 64_000, current=now)
    assert e.eta_s == pytest.approx(wait + (64_000 - 62.4 * wait) / planner.liveput(more))
    exact = _exact()
    other = Configuration.of({Kind("k80", "b", False, 0.6): 1})
    e = exact.estimate(other, 7200, current=Configuration.of({K80_A: 1}))
    assert e.eta_s == pytest.approx(exact.startup_s + 7200 / 4.0)


def test_the_frontiers_shapes():
    """The candidates: each kind alone on every shard count, the greedy walk's mixes near the
    PS's plateau (by liveput per dollar), and on-demand beside Spot of each split within
    ``max_workers`` (on-demand alone only where it adds liveput)."""
    k80 = Kind("k80", "us-central1-a", False, 0.9)
    planner = Planner([V100_OD, k80], PS)
    frontier = planner.frontier(max_workers=8, max_shards=2)
    # Two shards: 5 V100 (78 steps/s), then a K80 for the last 0.75 of 78.75.
    assert Configuration.of({V100_OD: 5, k80: 1}, 2) in frontier
    assert Configuration.of({k80: 1}, 2) in frontier
    # Cheap per dollar first, then the kind that adds more per dollar near the plateau.
    fast = Kind("v100", "z", False, 0.1)  # 100 steps/s per $/h
    cheap = Kind("k80", "z", False, 0.05)  # 80
    walk = Planner([fast, cheap], PS, steps_per_s={"v100": 10.0, "k80": 4.0})
    mixes = [c for c in walk.frontier(max_workers=6, max_shards=1) if len(c.counts) == 2]
    assert mixes == [Configuration.of({fast: 4, cheap: 1}), Configuration.of({fast: 4, cheap: 2})]
    other = Kind("p100", "us-east1-c", True, 0.43)
    planner = Planner([P100_OD, other, P100], 0.19)
    frontier = planner.frontier(max_workers=4, max_shards=2)
    assert all(c.size <= 4 for c in frontier)
    for shards in (1, 2):
        assert Configuration.of({P100_OD: 1, P100: 1}, shards) in frontier
    alone = Planner([V100, V100_OD], PS).frontier(max_workers=6, max_shards=1)
    assert sorted(c.size for c in alone if c.counts.keys() == {V100_OD}) == [1, 2, 3]


def test_what_earlier_runs_saw_adds_to_this_runs_observations():
    """Remembered revocations, hours and places count as this run's own for the hazards, the
    zone's factor and the availability; remembered start-ups stand until a worker asked for in
    this run trains, before the first workers'. What the planner reports is its own only."""
    zone = "us-central1-a"
    past = Observations(
        {("p100", zone): (6.0, 1.0, 2.0, 0.5), ("k80", zone): (3.0, 1.5, 0.0, 0.0)},
        (250.0, 260.0, 270.0),
        (150.0, 160.0, 170.0),
    )
    planner = Planner([P100, P100_OD], 0.19)
    planner.remember(past)
    k80 = paper_hazard_per_h("k80")
    assert planner.zone_factor(zone, but="p100") == pytest.approx(
        (k80 * PRIOR_HOURS + 3) / (k80 * (PRIOR_HOURS + 1.5))
    )
    prior = paper_hazard_per_h("p100") * planner.zone_factor(zone, but="p100")
    assert planner.hazard_per_h(P100) == pytest.approx((prior * PRIOR_HOURS + 6) / 1.5)
    model = planner.model_availability(P100)
    assert planner.availability(P100) == pytest.approx((model * PRIOR_HOURS + 0.5) / 2.5)
    planner.observe_startup(400.0, 300.0, first=True)
    assert (planner.startup_s, planner.load_s) == (260.0, 160.0)
    assert planner.observations() == Observations()
    # This run's own add to them.
    planner.observe_exposure("k80", zone, hours=0.5, revocations=1)
    assert planner.zone_factor(zone, but="p100") == pytest.approx(
        (k80 * PRIOR_HOURS + 4) / (k80 * (PRIOR_HOURS + 2.0))
    )
    planner.observe_exposure("p100", zone, hours=0.5, revocations=2)
    prior = paper_hazard_per_h("p100") * planner.zone_factor(zone, but="p100")
    assert planner.hazard_per_h(P100) == pytest.approx((prior * PRIOR_HOURS + 8) / 2.0)
    planner.observe_availability("p100", zone, held_h=1.0, trained_h=0.4)
    model = planner.model_availability(P100)
    assert planner.availability(P100) == pytest.approx((model * PRIOR_HOURS + 0.9) / 3.5)
    planner.observe_startup(200.0, 100.0)
    assert (planner.startup_s, planner.load_s) == (200.0, 100.0)
    planner.observe_availability("v100", zone, held_h=1.0, trained_h=0.5)
    seen = planner.observations()
    assert seen == Observations(
        {
            ("k80", zone): (1.0, 0.5, 0.0, 0.0),
            ("p100", zone): (2.0, 0.5, 1.0, 0.4),
            ("v100", zone): (0.0, 0.0, 1.0, 0.5),
        },
        (200.0,),
        (100.0,),
    )
    assert list(seen.kinds) == [("k80", zone), ("p100", zone), ("v100", zone)]


def test_losing_at_least_a_negative_number_of_workers_is_certain():
    """The caller's ``k`` may come from a difference: below zero, certain."""
    planner = Planner([K80], PS)
    assert planner.p_lose_at_least(Configuration.of({K80: 2}), -1) == 1.0


def test_refusals_say_what_is_wrong_in_full():
    """The messages users read when a planner cannot be made or cannot plan."""
    with pytest.raises(ValueError, match=r"^The planner needs at least one kind of worker to "):
        Planner([], PS)
    with pytest.raises(ValueError, match=r"^No configuration trains at all: no kind of worker"):
        Planner([Kind("tpu", "z", True, 1.0)], PS).choose("cost-per-step", 10, max_workers=2)


def test_a_budget_counts_exactly_one_percent_slower_as_as_fast():
    """The budget's band of equal speed includes its bound: 1010 s against the fastest's
    1000 s is as fast, and the cheaper one is taken."""
    fast, cheap = Kind("v100", "a", False, 1.0), Kind("k80", "a", False, 0.5)
    planner = Planner(
        [fast, cheap], 0.0, steps_per_s={"v100": 1010.0, "k80": 1000.0}, ps_steps_per_s=None
    )
    plan = planner.choose("budget", 1_010_000, max_workers=1, max_shards=1, budget=1.0)
    assert sorted(e.eta_s for e in plan.candidates) == [1000.0, 1010.0]
    assert plan.chosen.config == Configuration.of({cheap: 1})


def test_a_run_with_no_steps_left_is_done_now_whatever_the_change():
    """The planner's public API with nothing left to train: every configuration, one that keeps
    none of the current workers included, finishes now for nothing (it divided by the kept
    workers' liveput, 0, and raised)."""
    planner = Planner([K80, V100], 0.143)
    current = Configuration.of({K80: 1}, 1)
    new = planner.estimate(Configuration.of({V100: 1}, 1), 0, current=current)
    assert (new.eta_s, new.cost) == (0.0, 0.0)
    plan = planner.choose("cost-per-step", 0, max_workers=2, current=current)
    assert plan.chosen.eta_s == 0.0
