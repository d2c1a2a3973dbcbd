"""What the planner knows: hazards, step rates, start-ups and the PS's capacity, from priors and
observations."""

from __future__ import annotations

import math

import pytest

from tests.policy.policy_helpers import K80, K80_OD, P100, PS, V100
from transient_nb.policy.knowledge import PRIOR_HOURS, PlannerKnowledge, paper_hazard_per_h
from transient_nb.policy.plans import Kind


def test_hazards_come_from_the_papers_first_hour_and_follow_what_is_observed():
    assert paper_hazard_per_h("k80") == pytest.approx(-math.log(1 - 0.078))
    assert paper_hazard_per_h("V100") == pytest.approx(-math.log(1 - 0.273))
    planner = PlannerKnowledge([K80, K80_OD], PS)
    assert planner.hazard_per_h(K80_OD) == 0.0
    prior = planner.hazard_per_h(K80)
    # 4 revocations in 2 server-hours: (prior * PRIOR_HOURS + 4) / (PRIOR_HOURS + 2 h).
    planner.observe_exposure("k80", "us-central1-a", hours=2.0, revocations=4)
    assert planner.hazard_per_h(K80) == pytest.approx((prior * PRIOR_HOURS + 4) / (PRIOR_HOURS + 2))
    # Another zone keeps the prior; calm hours lower the rate again.
    other = Kind("k80", "us-east1-c", True, 0.256)
    assert planner.hazard_per_h(other) == pytest.approx(prior)
    planner.observe_exposure("k80", "us-east1-c", hours=98.0)
    assert planner.hazard_per_h(other) == pytest.approx(prior * PRIOR_HOURS / (PRIOR_HOURS + 98))


def test_step_rates_start_from_the_paper_and_follow_the_workers():
    planner = PlannerKnowledge([K80], PS)
    assert planner.rate("k80") == 4.56 and planner.rate("V100") == 15.6
    assert planner.rate("tpu") == 0.0
    for r in (5.0, 7.0, 6.0, float("nan"), -1.0):
        planner.observe_rate("k80", r)
    assert planner.rate("k80") == 6.0  # the median of what was seen; nonsense ignored


def test_the_ps_capacity_is_the_papers_plateau_and_a_second_shard_adds_three_quarters():
    planner = PlannerKnowledge([K80], PS)
    assert planner.ps_capacity(1) == pytest.approx(45.0)
    assert planner.ps_capacity(2) == pytest.approx(45.0 * 1.75)
    assert planner.ps_capacity(4) > planner.ps_capacity(2)
    assert PlannerKnowledge([K80], PS, ps_steps_per_s=None).ps_capacity(1) == math.inf


def test_the_ps_capacity_is_measured_where_the_ps_is_the_bottleneck():
    planner = PlannerKnowledge([V100], PS)
    # 8 V100s would push 125 steps/s; one PS served 30: it is the bottleneck, at 30.
    assert planner.observe_ps(1, served=30.0, demand=125.0)
    assert planner.ps_capacity(1) == pytest.approx(30.0)
    assert planner.ps_capacity(2) == pytest.approx(30.0 * 1.75)
    # Two shards serving 70 mean one serves 40; the median of what was measured counts.
    assert planner.observe_ps(2, served=70.0, demand=125.0)
    assert planner.observe_ps(1, served=35.0, demand=125.0)
    assert planner.ps_capacity(1) == pytest.approx(35.0)
    # Keeping up (within 15% of what was pushed) says the PS serves at least that much.
    assert not planner.observe_ps(1, served=50.0, demand=58.0)
    assert planner.ps_capacity(1) == pytest.approx(50.0)
    assert not planner.observe_ps(1, served=20.0, demand=20.0)  # a lower bound never lowers it
    assert planner.ps_capacity(1) == pytest.approx(50.0)
    for served, shards in ((float("nan"), 1), (-1.0, 1), (0.0, 1), (10.0, 0)):
        assert not planner.observe_ps(shards, served=served, demand=100.0)
    assert planner.ps_capacity(1) == pytest.approx(50.0)
    # A PS that keeps up with more than the paper's 45 (a faster host than the paper's)
    # raises the prior. With no bottleneck assumed, only a measured one bounds it.
    fast = PlannerKnowledge([V100], PS)
    assert not fast.observe_ps(1, served=80.0, demand=85.0)
    assert fast.ps_capacity(1) == pytest.approx(80.0)
    unbounded = PlannerKnowledge([V100], PS, ps_steps_per_s=None)
    assert not unbounded.observe_ps(1, served=80.0, demand=85.0)
    assert unbounded.ps_capacity(1) == math.inf
    assert unbounded.observe_ps(1, served=60.0, demand=125.0)
    assert unbounded.ps_capacity(1) == pytest.approx(80.0)  # it kept up with 80 before


def test_the_first_workers_start_ups_count_until_one_asked_for_later_trains():
    """The paper's prior (108 s, 19 s loading) until something is seen; the cluster's first
    workers' start-ups (started together, cold) until a worker asked for during the run
    trains; then only those."""
    planner = PlannerKnowledge([P100], 0.19)
    assert planner.startup_s == pytest.approx(108.5) and planner.load_s == 19.0
    for seconds, load in ((340.0, 250.0), (350.0, 260.0), (360.0, 270.0)):
        planner.observe_startup(seconds, load, first=True)
    assert (planner.startup_s, planner.load_s) == (350.0, 260.0)
    planner.observe_startup(220.0, 120.0)
    assert (planner.startup_s, planner.load_s) == (220.0, 120.0)
    planner.observe_startup(0.0, 0.0)  # nonsense is ignored
    planner.observe_startup(math.inf)
    planner.observe_startup(500.0, 600.0, first=True)  # a load longer than its start-up: not
    assert (planner.startup_s, planner.load_s) == (220.0, 120.0)


def test_a_zones_factor_sums_every_other_gpu_type_seen_there():
    """Two other types observed in a zone: their revocations, priors and exposures summed."""
    zone = "us-central1-a"
    planner = PlannerKnowledge([P100], 0.19)
    planner.observe_exposure("k80", zone, hours=1.0, revocations=3)
    planner.observe_exposure("v100", zone, hours=2.0, revocations=10)
    k, v = paper_hazard_per_h("k80"), paper_hazard_per_h("v100")
    assert planner.zone_factor(zone, but="p100") == pytest.approx(
        ((k + v) * PRIOR_HOURS + 13) / (k * (PRIOR_HOURS + 1) + v * (PRIOR_HOURS + 2))
    )


def test_the_ps_measured_at_its_bounds():
    """A two-shard bottleneck alone measures one PS (70 on two: 40); exactly 85% of the demand
    is keeping up; a slow PS (half a step a second) is measured as slow as it is."""
    planner = PlannerKnowledge([V100], PS)
    assert planner.observe_ps(2, served=70.0, demand=125.0)
    assert planner.ps_capacity(1) == pytest.approx(40.0)
    assert not PlannerKnowledge([V100], PS).observe_ps(1, served=17.0, demand=20.0)
    slow = PlannerKnowledge([K80], PS)
    assert slow.observe_ps(1, served=0.5, demand=0.9)
    assert slow.ps_capacity(1) == pytest.approx(0.5)


def test_reported_rates_at_their_bounds():
    """Only positive, finite reports count (a worker that reports 0 is not a rate); of an even
    number of reports, the upper middle one."""
    planner = PlannerKnowledge([K80], PS)
    for bad in (0.0, -1.0, math.inf, math.nan):
        planner.observe_rate("k80", bad)
    assert planner.rate("k80") == 4.56
    for r in (7.0, 5.0, 4.0, 6.0):
        planner.observe_rate("k80", r)
    assert planner.rate("k80") == 6.0


def test_a_users_model_replaces_the_papers_priors():
    planner = PlannerKnowledge([Kind("t4", "us-central1-a", True, 0.2)], 0.19)
    assert planner.ps_capacity(1) == 45.0 and planner.rate("k80") == 4.56
    planner.use_model(1_857_722, {"t4": 12.0})  # the paper's size: the same PS
    assert planner.ps_capacity(1) == pytest.approx(45.0)
    assert planner.ps_capacity(2) == pytest.approx(45.0 * 1.75)
    assert planner.rate("t4") == 12.0 and planner.rate("k80") == 0.0  # no ResNet-32 figure
    bigger = PlannerKnowledge([Kind("t4", "us-central1-a", True, 0.2)], 0.19)
    bigger.use_model(4 * 1_857_722)
    assert bigger.ps_capacity(1) < 45.0 / 3  # four times the bytes: under a third
    assert bigger.ps_capacity(2) / bigger.ps_capacity(1) > 1.75  # a second shard helps more
