"""The transient-aware policy's decision rules, on synthetic event streams and a recording cluster."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pytest

from tests.policy.policy_helpers import (
    K80,
    K80_OD,
    P100,
    P100_OD,
    T0,
    V100,
    V100_OD,
    RecordingCluster,
    ZonedCluster,
    _deadline_policy,
    _estimate,
    _Loop,
    _od_vm,
    _outdone,
    _policy,
    _saturate,
    _scaled_stream,
    _storm_stream,
    _stormy_central,
    _vm,
    _zoned,
)
from transient_nb.policy.adaptive import TransientPolicy
from transient_nb.policy.learning import PS_MOVE_SETTLE
from transient_nb.policy.planner import Configuration, Estimate, Kind, Plan, Planner

#: What a policy announces once it stopped: no goal, no budget, no history.
STOPPED = {
    "kind": "policy",
    "goal": None,
    "deadline_s": None,
    "budget": None,
    "history": None,
    "remembered_h": None,
}


def test_no_run_no_decision_and_progress_comes_from_the_run():
    cluster = RecordingCluster({"k80": 1})
    policy = _policy(cluster, "cost-per-step")
    assert policy.recommend(T0) is None
    cluster.add("train-started", T0, run="r", steps=64_000)
    cluster.add("metrics", T0 + 5, run="r", step=4_000, shard=0)
    policy.observe(cluster.monitor.events)
    assert policy.remaining_steps() == 60_000
    cluster.add("metrics", T0 + 9, run="r", step=64_000, shard=0)
    policy.observe(cluster.monitor.events)
    assert policy.remaining_steps() == 0 and policy.recommend(T0) is None


def test_a_deadline_the_cluster_would_miss_makes_it_grow_and_says_why():
    cluster = RecordingCluster({"k80": 1})
    policy = _policy(cluster, "deadline", deadline="1h")
    cluster.add("train-started", time.time(), run="r", steps=64_000)
    plan = asyncio.run(policy.adapt())
    assert plan is not None and plan.feasible and plan.chosen.eta_s <= 3600
    assert plan.current is not None and plan.current.eta_s > 3600  # 1 K80 needs ~4 h
    assert len(cluster.scaled) == 1 and sum(cluster.scaled[0].values()) > 1
    (decision,) = cluster.posted
    assert decision["kind"] == "policy-decision" and decision["acted"] is True
    assert decision["mix"] == cluster.scaled[0] and "ETA" in decision["reason"]
    assert decision["reason"].startswith(plan.chosen.config.describe())
    p1, p2, p3 = decision["p_lose_1h"]
    assert 1 > p1 > p2 > p3 > 0
    # The next round finds the cluster as planned: nothing to change, nothing new to say.
    again = asyncio.run(policy.adapt())
    assert again is not None and len(cluster.scaled) == 1 and len(cluster.posted) == 1


def test_a_time_scaled_paced_run_is_planned_on_the_simulated_clock_in_emulated_steps():
    """A local cluster at time_scale=60 whose run stands for 100x its steps must get the plan of
    the run it emulates: the same rate, hazard, deadline left and steps left, not wall-clock
    ones (which would make a K80 look 60/100 as fast and the deadline 60x as far)."""
    plain, plan = _scaled_stream(1.0, 1.0)
    scaled, scaled_plan = _scaled_stream(60.0, 100.0)
    assert scaled.planner.rate("k80") == pytest.approx(plain.planner.rate("k80")) == 6.0
    assert scaled.planner.hazard_per_h(K80) == pytest.approx(plain.planner.hazard_per_h(K80))
    assert scaled.step_scale == 100.0 and scaled.time_scale == 60.0
    assert plan is not None and scaled_plan is not None
    # The deadline left, with 10% of it to spare (the margin).
    assert scaled_plan.limit == pytest.approx(plan.limit) == pytest.approx((3600 - 960) * 0.9)
    assert scaled_plan.chosen.config == plan.chosen.config
    # Within 0.1%: a trainer's first report comes 2 wall seconds after it trained, 120
    # simulated seconds at time_scale=60, which the hours its place was observed include.
    assert scaled_plan.chosen.eta_s == pytest.approx(plan.chosen.eta_s, rel=1e-3)


def test_a_near_equal_mix_is_not_worth_a_change():
    cluster = RecordingCluster({"k80": 8})
    policy = _policy(cluster, "deadline", deadline="10h", hysteresis=0.5)
    cluster.add("train-started", time.time(), run="r", steps=64_000)
    plan = asyncio.run(policy.adapt())
    assert plan is not None and plan.meets(plan.current)  # 8 K80s meet 10 h
    # Whatever is cheaper, it is not 50% cheaper: keep the cluster as it is.
    assert plan.chosen.cost > plan.current.cost * 0.5
    assert cluster.scaled == [] and cluster.posted[0]["acted"] is False


def test_a_budget_counts_what_was_spent_already():
    rich, poor = RecordingCluster({"k80": 1}), RecordingCluster({"k80": 1}, spent=9.5)
    plans = []
    for cluster in (rich, poor):
        policy = _policy(cluster, "budget", budget=10.0)
        cluster.add("train-started", time.time(), run="r", steps=64_000)
        policy.observe(cluster.monitor.events)
        plans.append(policy.recommend())
    # Planned with 10% of what is left to spare (the margin).
    assert plans[0].limit == pytest.approx(9.0) and plans[1].limit == pytest.approx(0.45)
    # $10 buy the plateau; the $0.50 left after spending $9.50 buy no way to finish.
    assert plans[0].feasible and plans[0].chosen.cost <= 9.0
    assert not plans[1].feasible and plans[1].chosen.cost > 0.45
    with pytest.raises(ValueError, match=r"margin=1\.5 must be a fraction from 0 to below 1"):
        _policy(rich, "budget", budget=10.0, margin=1.5)


def test_a_ps_slower_than_the_papers_gets_a_second_shard_once_measured():
    """8 K80s push 36.5 steps/s, under the paper's plateau of 45: by the prior one PS makes a
    deadline of 32 steps/s. This PS serves 20: measured, a second host is added."""
    cluster = RecordingCluster({"k80": 8})
    policy = TransientPolicy(
        cluster, "deadline", deadline=64_000 / 32.0 / 0.9, planner=Planner([K80_OD], 0.19)
    )
    now = time.time()
    cluster.add("train-started", now, run="r", steps=64_000, elastic_shards=True)
    asyncio.run(policy.adapt())
    assert cluster.ps_scaled == []
    _saturate(cluster, "k80", served=20.0, at=now)
    plan = asyncio.run(policy.adapt())
    assert plan is not None and plan.feasible and plan.chosen.config.shards == 2
    assert cluster.ps_scaled == [2] and policy.planner.ps_capacity(1) == pytest.approx(20.0)
    assert cluster.posted[-1]["ps_bottleneck"] is True
    assert cluster.posted[-1]["ps_capacity"] == pytest.approx(35.0)


def test_a_ps_that_keeps_up_with_the_deadline_gets_no_second_shard():
    """A PS host faster than the paper's: 8 V100s push 125 steps/s and it serves 90, more
    than the 60 the deadline needs. The paper's 45 would have bought a second host."""
    cluster = RecordingCluster({"v100": 8})
    policy = TransientPolicy(
        cluster, "deadline", deadline=64_000 / 60.0, planner=Planner([V100_OD], 0.19)
    )
    now = time.time()
    cluster.add("train-started", now, run="r", steps=64_000, elastic_shards=True)
    _saturate(cluster, "v100", served=90.0, at=now)
    plan = asyncio.run(policy.adapt())
    assert plan is not None and plan.feasible and plan.chosen.config.shards == 1
    assert cluster.ps_scaled == [] and policy.planner.ps_capacity(1) == pytest.approx(90.0)


@pytest.mark.parametrize(
    "kind, elastic, shards",
    [(V100_OD, True, 2), (V100_OD, False, 1), (K80_OD, True, 1)],
    ids=["v100-elastic-run", "v100-run-with-fixed-shards", "k80"],
)
def test_a_ps_shard_is_added_at_the_plateau_for_a_run_that_follows_it(kind, elastic, shards):
    """The paper's plateau: 8 V100s need more than one PS's ~45 steps/s to make a deadline of
    60 steps/s, so the policy adds a PS host (before the workers) for a run started without
    shards=; a run with fixed shards would not use one, and 8 K80s stay under the plateau."""
    cluster = RecordingCluster({kind.gpu: 8})
    policy = TransientPolicy(
        cluster, "deadline", deadline=64_000 / 60.0, planner=Planner([kind], 0.19)
    )
    started = {"elastic_shards": True} if elastic else {}
    now = time.time()
    cluster.add("train-started", now, run="r", steps=64_000, **started)
    plan = asyncio.run(policy.adapt())  # the paper's plateau decides before any measurement
    assert plan is not None and plan.chosen.config.shards == shards
    assert cluster.ps_scaled == ([2] if shards == 2 else [])
    assert cluster.ps_hosts == shards
    decision = cluster.posted[-1]
    assert decision["shards"] == shards
    assert decision["reason"].startswith(plan.chosen.config.describe())
    assert ("2 PS shards" in decision["reason"]) == (shards == 2)
    # Nothing more to do next round; and a PS never gives a shard back, even when the plan
    # would do without one (the steps are nearly done: one PS is enough for what is left).
    cluster.add("metrics", time.time(), run="r", step=63_990, shard=0)
    asyncio.run(policy.adapt())
    assert cluster.ps_scaled == ([2] if shards == 2 else []) and cluster.ps_hosts == shards
    assert policy.last is not None and policy.last.chosen.config.shards == shards


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_deadline_policy_grows_a_real_cluster_during_a_run(cleanup: None) -> None:
    from tests.conftest import of_kind, wait_for_sync
    from transient_nb import TransientCluster, train

    with TransientCluster(
        workers={"t4": 1}, preemption="none", provisioning_delay=0, max_workers=3
    ) as cluster:
        cluster.wait_for_workers(timeout=120)
        run = train(cluster, model="resnet8", data="digits", steps=100_000, eval_images=100)
        try:
            # 100,000 steps in 10 minutes needs far more than one worker's pace: grow.
            policy = cluster.adapt(
                goal="deadline", deadline="10m", gpus=["t4", "v100"], interval="1s"
            )
            decision = wait_for_sync(
                lambda: of_kind(cluster.monitor.events, "policy-decision", acted=True),
                timeout=120,
            )[0]
            assert decision["goal"] == "deadline" and "ETA" in decision["reason"]
            assert sum(decision["mix"].values()) == 3  # as many as max_workers allows
            wanted = {g: n for g, n in decision["mix"].items() if n}
            assert {g: n for g, n in cluster.mix.items() if n} == wanted
            cluster.wait_for_workers(3, timeout=120)

            # The trainers of the new workers contribute to the same run.
            def trainers() -> int:
                by_gpu = run.summary().get("by_gpu") or {}
                return sum(int(v.get("workers", 0)) for v in by_gpu.values())

            wait_for_sync(lambda: trainers() >= 3, timeout=120)
            assert policy.last is not None and policy.last.goal == "deadline"
            assert cluster.adapt(None) is None  # stopped; the cluster keeps its mix
            assert {g: n for g, n in cluster.mix.items() if n} == wanted
        finally:
            run.stop()


def test_by_default_it_chooses_among_the_mix_and_the_fallbacks_at_catalog_prices():
    from transient_nb.catalog.prices import PriceCatalog

    catalog = PriceCatalog.load("paper-2019")
    cluster = SimpleNamespace(
        mix={"k80": 1, "v100": 1},
        gpu="k80",
        placement=SimpleNamespace(fallback_gpus=["p100", "k80"]),
        catalog=catalog,
        zone="us-central1-a",
        machine_type="n1-standard-4",
        ps_machine_type="n1-standard-4",
        spot=True,
        limits=SimpleNamespace(max_workers=None),
    )
    policy = TransientPolicy(cluster, "cost-per-step")
    # Each type Spot, then on demand (a Spot cluster's policy may buy some on demand).
    assert [(k.gpu, k.spot) for k in policy.planner.kinds] == [
        ("k80", True),
        ("v100", True),
        ("p100", True),
        ("k80", False),
        ("v100", False),
        ("p100", False),
    ]
    k80, k80_od = policy.planner.kinds[0], policy.planner.kinds[3]
    price = catalog.worker_price("k80", "n1-standard-4", cluster.zone)
    assert k80.hourly == price.rate(True) and k80_od.hourly == price.rate(False)
    assert k80_od.hourly > 2 * k80.hourly
    spot_only = TransientPolicy(cluster, "cost-per-step", on_demand=False)
    assert all(k.spot for k in spot_only.planner.kinds) and len(spot_only.planner.kinds) == 3
    cluster.spot = False  # an on-demand cluster: its kinds are on demand, once each
    assert [k.spot for k in TransientPolicy(cluster, "cost-per-step").planner.kinds] == [False] * 3
    cluster.spot = True
    assert policy.max_workers == 8  # no limit: the default
    assert policy.planner.ps_zone == "us-central1-a"  # where the cluster puts its PS hosts
    with pytest.raises(ValueError, match="None of the GPU types \\['tpu'\\]"):
        TransientPolicy(cluster, "cost-per-step", gpus=["tpu"])


def test_a_goal_no_mix_can_meet_changes_the_mix_only_for_a_clearly_faster_one():
    """Under a storm no mix meets a 1 h deadline: the policy must not trade one miss for a
    near-equal one (each change boots VMs and gives working ones back), only for a clear gain."""
    from transient_nb.policy.planner import Configuration, Plan

    cluster = RecordingCluster({"k80": 4})
    policy = _policy(cluster, "deadline", deadline="1h")
    p = policy.planner

    def estimate(n_k80: int, n_v100: int = 0) -> Any:
        return p.estimate(Configuration.of({K80: n_k80, V100: n_v100}), 400_000)

    def plan(new: Any, now: Any) -> Plan:
        return Plan("deadline", new, now, "", feasible=False, candidates=[], limit=3600.0)

    now = estimate(4, 1)
    near = estimate(8)  # 8% faster, and missing too
    assert not plan(near, now).meets(near) and 0.9 < near.eta_s / now.eta_s < 1
    assert policy.worth_changing(plan(near, now)) is False
    far = estimate(6, 2)  # clearly faster, still missing
    assert far.eta_s < now.eta_s * 0.9 and policy.worth_changing(plan(far, now)) is True
    # A mix that meets it is always worth it.
    quick = p.estimate(Configuration.of({K80: 6, V100: 2}), 64_000)
    assert plan(quick, now).meets(quick) and policy.worth_changing(plan(quick, now)) is True


def test_new_workers_go_to_the_zone_that_revokes_less():
    """One price in both zones. After its t4s are revoked again and again in us-central1-a, the
    policy sends new t4 workers, replacements included, to us-east1-c, and says so."""
    cluster, policy, home, other = _zoned((0.2, 0.2))
    policy.observe(cluster.monitor.events)
    assert policy.current().counts == {home: 4}
    now = time.time()
    for i in range(40):  # 40 revoked after 90 s each in the first zone: one an hour's storm
        name = f"s-{i}"
        t = now - 3600 + 90 * i
        fields = {"worker": name, "role": "worker", "gpu": "t4", "zone": home.zone, "spot": True}
        cluster.add("requested", t, **fields)
        cluster.add("running", t, **fields)
        cluster.add("preempted", t + 90, **fields)
    plan = asyncio.run(policy.adapt())
    assert plan is not None and plan.chosen.config.counts.get(other, 0) >= 1
    assert policy.planner.hazard_per_h(home) > 10 * policy.planner.hazard_per_h(other)
    assert cluster.placement.preferred_zones == {"t4": "us-east1-c"}
    assert [p.zone for p in cluster.placement.candidates("t4")] == ["us-east1-c", "us-central1-a"]
    (decision,) = cluster.posted
    assert decision["acted"] is True and decision["zones"] == {"t4": "us-east1-c"}
    assert "us-east1-c" in decision["reason"]
    # The four still running count where they are; the rest of the mix where new ones go.
    n = cluster.mix["t4"]
    assert n >= 4 and policy.current().counts == {home: 4, **({other: n - 4} if n > 4 else {})}
    cluster.scale({"t4": n + 2})
    assert policy.current().counts == {home: 4, other: n - 2}


def test_a_zone_is_not_changed_without_a_reason_and_a_cheaper_one_is_taken():
    cluster, policy, _, _ = _zoned((0.2, 0.2))
    asyncio.run(policy.adapt())
    assert cluster.placement.preferred_zones == {}  # same price, same odds: the cluster's own zone
    cheaper, policy, _, other = _zoned((0.3, 0.2))
    plan = asyncio.run(policy.adapt())
    assert plan is not None and policy.zones_of(plan) == {"t4": other.zone}
    assert cheaper.placement.preferred_zones == {"t4": "us-east1-c"}


def test_a_storm_makes_a_deadline_policy_run_its_workers_on_demand():
    """Four workers at most, 0.52 h for 64K steps, under the storm above. The model expects a
    Spot P100 up 46% of the time (exponential lifetimes); its workers trained 23% of their
    places' time, and the planner expects 28%: 4 Spot P100 miss the deadline, and one Spot
    beside three on demand adds too little. The policy asks for all four on demand (their
    start-up counted), says so with both figures, and once they run counts them on demand."""
    cluster = RecordingCluster({"p100": 4})
    policy = _deadline_policy(cluster)
    t = time.time() - 24 * 400 - 600
    _storm_stream(cluster, t)
    for i in range(24, 28):
        _vm(cluster, f"w-{i}", "p100", t + 24 * 400)
    plan = asyncio.run(policy.adapt())
    assert plan is not None and plan.feasible
    assert plan.current is not None and not plan.meets(plan.current)  # 4 Spot P100: too slow
    model = policy.planner.model_availability(P100)
    assert model == pytest.approx(0.46, abs=0.01)
    # 24 places of 388-390 s, 88 s trained each (the first counted from its training), and
    # the four placed at the end, which trained from their first report.
    assert policy.planner.availability(P100) == pytest.approx(0.28, abs=0.02)
    assert plan.chosen.config.counts == {P100_OD: 4}
    assert cluster.scaled == [{"p100": 4}] and cluster.on_demand_scaled == [{"p100": 4}]
    (decision,) = [e for e in cluster.posted if e["kind"] == "policy-decision"]
    assert decision["acted"] is True and decision["on_demand"] == {"p100": 4}
    assert "4 p100 in us-central1-a (on demand)" in decision["reason"]
    observed, by_model = decision["availability"]["p100@us-central1-a"]
    assert observed == pytest.approx(policy.planner.availability(P100), abs=1e-4)
    assert by_model == pytest.approx(model, abs=1e-4)
    # The Spot workers given back, four on-demand ones running: as planned.
    now = time.time()
    for i in range(24, 28):
        cluster.add("deleted", now, worker=f"w-{i}", role="worker", gpu="p100")
    for i in range(28, 32):
        _vm(cluster, f"w-{i}", "p100", now, spot=False)
    policy.observe(cluster.monitor.events)
    again = policy.recommend()
    assert again is not None and again.current is not None
    assert again.current.config.counts == {P100_OD: 4}


@pytest.mark.parametrize("storm", [True, False])
def test_the_ps_moves_to_the_region_where_the_workers_are_worth_running(storm):
    """A storm in the PS's zone (24 P100 revoked after 5 minutes each): the cheapest steps are
    P100s in calm us-east1-c, 1.48x slower with the PS in us-central1-a. Moved there, they step
    at their GPU's speed: the policy moves the PS and says so. Calm, the workers stay by the PS
    and the PS stays where it is."""
    here = Kind("p100", "us-central1-a", True, 0.43)
    there = Kind("p100", "us-east1-c", True, 0.43)
    cluster = ZonedCluster({"p100": 3})
    planner = Planner([here, there], 0.19, ps_zone="us-central1-a")
    policy = TransientPolicy(cluster, "cost-per-step", planner=planner)
    t = time.time() - 24 * 300 - 600
    cluster.add("running", t, worker="ps-0", role="ps", zone="us-central1-a")
    if storm:
        for i in range(24):
            _vm(cluster, f"w-{i}", "p100", t + i * 300)
            cluster.add("preempted", t + i * 300 + 300, worker=f"w-{i}", role="worker")
    cluster.add("train-started", t + 24 * 300, run="r", steps=64_000)
    plan = asyncio.run(policy.adapt())
    assert plan is not None
    (decision,) = [e for e in cluster.posted if e["kind"] == "policy-decision"]
    if not storm:
        assert cluster.moves == [] and decision["ps_zone"] == "us-central1-a"
        assert all(k.zone == "us-central1-a" for k in plan.chosen.config.counts)
        return
    assert [zone for zone, _ in cluster.moves] == ["us-east1-c"]
    assert cluster.moves[0][1].startswith("PS moved to us-east1-c: ")
    assert decision["acted"] is True and decision["ps_zone"] == "us-east1-c"
    assert decision["reason"].startswith("PS moved to us-east1-c: ")
    assert all(k.zone == "us-east1-c" for k in plan.chosen.config.counts)
    assert cluster.preferred == {"p100": "us-east1-c"}
    # The move was worth it: the same workers cost 1.48x less per step by the PS.
    far = Planner([here, there], 0.19, ps_zone="us-central1-a")
    assert plan.chosen.cost_per_step < far.estimate(plan.chosen.config, 64_000).cost_per_step / 1.3
    # Under way, no second move; once the log says it began, the planner plans from there.
    cluster.ps_move_zone = "us-east1-c"
    cluster.add("ps-move", time.time(), zone_from="us-central1-a", zone="us-east1-c")
    policy._acted_at = None
    asyncio.run(policy.adapt())
    assert len(cluster.moves) == 1 and policy.planner.ps_zone == "us-east1-c"


def test_no_ps_move_right_after_one_nor_where_the_run_ends_first():
    """A move that pays (above) is not made within two start-ups of the last one (the workers
    asked for before it are still landing), nor when the cluster as it is would finish before a
    new PS host serves a step."""
    cluster = ZonedCluster({"p100": 3})
    now = time.time()
    policy = _stormy_central(cluster, now - 24 * 300 - 600)
    policy.observe(cluster.monitor.events)
    plan = policy.recommend(now)
    assert plan is not None and policy.ps_move(plan, now) is not None
    startup = policy.planner.startup_s
    cluster.add("ps-move", now - 1.9 * startup, zone_from="us-east1-c", zone="us-central1-a")
    cluster.add("ps-moved", now - 1.8 * startup, zone_from="us-east1-c", zone="us-central1-a")
    policy.observe(cluster.monitor.events)
    assert policy.ps_move(plan, now) is None
    assert policy.ps_move(plan, now + 0.2 * startup) is not None
    # 40 steps left: the three P100s take them in less than a PS host's start-up.
    cluster.add("metrics", now, run="r", shard=0, step=64_000 - 40)
    policy.observe(cluster.monitor.events)
    late = policy.recommend(now + startup)
    assert late is not None and late.current is not None
    assert late.current.liveput * startup >= 40
    assert policy.ps_move(late, now + startup) is None


def test_no_ps_move_while_one_is_under_way_nor_where_no_other_region_is_allowed():
    """Even against a plan any move would beat: no second move while the cluster moves its PS
    (before the log says the move began), and none on a cluster that may place workers in no
    other region (no replacement policy, or zones of the PS's region only): the PS goes only
    where its workers may follow."""
    now = float(int(time.time()))
    cluster = ZonedCluster({"p100": 3})
    policy = _stormy_central(cluster, now - 24 * 300 - 600)
    policy.observe(cluster.monitor.events)
    plan = policy.recommend(now)
    assert plan is not None
    outdone = _outdone(plan)
    move = policy.ps_move(outdone, now)
    assert move is not None and move[0] == "us-east1-c"
    cluster.ps_move_zone = "us-east1-c"  # asked for, no ps-move event yet
    assert policy.ps_move(outdone, now) is None
    cluster.ps_move_zone = None
    cluster.placement = SimpleNamespace(zones=lambda: ["us-central1-a", "us-central1-b"])
    assert policy.ps_move(outdone, now) is None
    # A cluster with no replacement policy (its workers go to its own zone only), which knows no
    # PS moves either.
    del cluster.placement, cluster.ps_move_zone
    assert policy.ps_move(outdone, now) is None
    assert policy.planner.ps_zone == "us-central1-a"  # weighed elsewhere, planned here


def test_a_ps_move_waits_its_settle_time_after_the_last_one_on_the_clusters_clock():
    """``PS_MOVE_SETTLE`` start-ups after the last move, and not a moment sooner, another one
    may be weighed: on a cluster at time scale 4, the prior's 2 x 108.5 simulated s are 54.25
    wall s."""
    now = float(int(time.time()))
    cluster = ZonedCluster({"p100": 3})
    cluster.time_scale = 4.0
    policy = _stormy_central(cluster, now - (24 * 300 + 600) / 4)
    settle = PS_MOVE_SETTLE * policy.planner.startup_s / 4
    assert settle == 54.25
    cluster.add("ps-move", now - settle, zone_from="us-east1-c", zone="us-central1-a")
    policy.observe(cluster.monitor.events)
    plan = policy.recommend(now)
    assert plan is not None
    assert policy.ps_move(plan, now - 0.25) is None
    move = policy.ps_move(plan, now)
    assert move is not None and move[0] == "us-east1-c"
    later = policy.ps_move(plan)  # at the time of the call, later still
    assert later is not None and later[0] == "us-east1-c"


def test_the_ps_moves_to_the_best_of_two_other_regions_with_a_plan_made_there_for_now():
    """Two calm regions beside the stormy one, P100s dearer in us-east1-c than in us-west1-b:
    the PS goes to us-west1-b, though us-east1-c would pay too and the cluster lists it first.
    The plan made there is for the deadline left at the time asked, as the plan here, and counts
    the workers left in us-central1-a 1.48x slower."""
    west = Kind("p100", "us-west1-b", True, 0.38)
    now = float(int(time.time()))
    cluster = ZonedCluster({"p100": 3}, zones=["us-central1-a", "us-east1-c", "us-west1-b"])
    policy = _stormy_central(cluster, now - 24 * 300 - 600, west, goal="deadline", deadline="10h")
    policy.observe(cluster.monitor.events)
    later = now + 1800
    plan = policy.recommend(later)
    assert plan is not None and plan.current is not None
    move = policy.ps_move(plan, later)
    assert move is not None and move[0] == "us-west1-b"
    there = move[1]
    assert there.limit == pytest.approx(plan.limit)
    assert there.current is not None
    assert there.current.liveput == pytest.approx(plan.current.liveput / 1.48)


def test_by_default_it_weighs_every_zone_the_cluster_may_use_and_prices_its_ps_on_demand():
    """A cluster with no mix, no fallback types and no limit: its own type in its zone and each
    fallback zone; its PS host billed on demand; up to 8 workers; one PS shard, the one a
    cluster that says none has; its workers asked for (``_target``) where it places them."""
    from transient_nb.catalog.prices import PriceCatalog

    catalog = PriceCatalog.load("paper-2019")
    cluster = SimpleNamespace(
        gpu="k80",
        placement=SimpleNamespace(fallback_zones=["us-east1-c"]),
        catalog=catalog,
        zone="us-central1-a",
        machine_type="n1-standard-4",
        ps_machine_type="n1-standard-4",
        spot=True,
    )
    policy = TransientPolicy(cluster, "cost-per-step", on_demand=False)
    kinds = policy.planner.kinds
    assert [(k.gpu, k.zone, k.spot) for k in kinds] == [
        ("k80", "us-central1-a", True),
        ("k80", "us-east1-c", True),
    ]
    ps = catalog.machine_price("n1-standard-4", "us-central1-a")
    assert policy.planner.ps_hourly == ps.rate(False) != ps.rate(True)
    assert policy.max_workers == 8
    assert policy.current() == Configuration.of({})
    cluster._target = 2
    assert policy.current() == Configuration.of({kinds[0]: 2}, 1)
    with pytest.raises(ValueError, match=r"by the catalog: give gpus= types the catalog knows\."):
        TransientPolicy(cluster, "cost-per-step", gpus=["tpu"])


def test_the_current_configuration_counts_live_vms_then_those_to_come_spot_or_on_demand():
    """Six P100 asked for, three of them on demand, one on demand and two Spot running (one
    whose events do not say Spot: the default): two more on demand and one Spot to come. A type
    the planner cannot buy is left out, one with no on-demand workers asked for is Spot, the
    PS shards are the cluster's, and VMs beyond what the mix asks for do not count."""
    p100_od, k80_od = Kind("p100", P100.zone, False, 1.46), Kind("k80", K80.zone, False, 0.45)
    cluster = RecordingCluster({"t4": 2, "p100": 6, "k80": 1})
    cluster.on_demand = {"p100": 3}
    cluster.ps_hosts = 2
    cluster.zone = P100.zone
    policy = TransientPolicy(
        cluster, "cost-per-step", planner=Planner([P100, p100_od, K80, k80_od], 0.19)
    )
    _od_vm(cluster, "w-0", "p100", T0, zone=P100.zone, spot=False)
    _od_vm(cluster, "w-1", "p100", T0, zone=P100.zone)
    _od_vm(cluster, "w-2", "p100", T0, zone=P100.zone, spot=True)
    policy.observe(cluster.monitor.events)
    assert policy.current() == Configuration.of({p100_od: 3, P100: 3, K80: 1}, 2)
    cluster.mix = {"p100": 2}  # scaled down: the VMs given back are not gone yet
    assert policy.current() == Configuration.of({p100_od: 1, P100: 1}, 2)


def test_better_compares_the_goals_own_measure_and_a_tie_is_no_gain():
    """Without hysteresis: a tie in the goal's measure is no reason to change; a deadline both
    meet is about money, not time; a budget both keep is about time, one both exceed about
    money."""
    policy = _policy(RecordingCluster({"k80": 1}), "cost-per-step", hysteresis=0.0)
    old = _estimate(1, 500.0, 5.0)

    def better(goal: str, new: Estimate, limit: float | None = None) -> bool:
        return policy.better(Plan(goal, new, old, "", limit=limit), new, old)

    assert not better("cost-per-step", _estimate(2, 400.0, 5.0))
    assert better("cost-per-step", _estimate(2, 400.0, 4.9))
    assert not better("deadline", _estimate(2, 400.0, 5.0), limit=1000.0)  # sooner, as dear
    assert better("deadline", _estimate(2, 600.0, 4.9), limit=1000.0)
    assert not better("deadline", _estimate(2, 500.0, 1.0), limit=100.0)  # both miss: as late
    assert better("budget", _estimate(2, 400.0, 6.0), limit=10.0)  # both keep it: sooner
    assert not better("budget", _estimate(2, 500.0, 4.0), limit=10.0)
    assert better("budget", _estimate(2, 600.0, 4.9), limit=1.0)  # both over: cheaper
    assert not better("budget", _estimate(2, 400.0, 5.0), limit=1.0)


def test_a_change_is_worth_it_from_a_cluster_that_trains_nothing_not_from_a_slow_one():
    """A plan with no current configuration is no change; from a cluster whose workers train
    nothing any other mix is one; from one that trains a little, only a better one."""
    policy = _policy(RecordingCluster({"k80": 1}), "deadline", deadline="1h")
    new = _estimate(2, 5000.0, 5.0)

    def plan(now: Estimate | None) -> Plan:
        return Plan("deadline", new, now, "", feasible=False, limit=3600.0)

    assert policy.worth_changing(plan(None)) is False
    assert policy.worth_changing(plan(_estimate(1, 5000.0, 5.0, liveput=0.0))) is True
    assert policy.worth_changing(plan(_estimate(1, 5000.0, 5.0, liveput=0.5))) is False


def test_a_plans_mix_zones_and_on_demand_workers_add_up_each_type_over_its_zones():
    """Two zones of one type: the mix is their sum, as are its on-demand workers; the type's
    zone is the one with most of it, the earlier kind on a tie."""
    ke = Kind("k80", "us-east1-c", True, 0.256)
    kco, keo = Kind("k80", K80.zone, False, 0.45), Kind("k80", ke.zone, False, 0.45)
    policy = TransientPolicy(
        RecordingCluster({"k80": 1}), "cost-per-step", planner=Planner([K80, ke, kco, keo], 0.19)
    )

    def plan(counts: dict[Kind, int]) -> Plan:
        chosen = Estimate(Configuration.of(counts), 1.0, 1.0, 1.0, 1.0)
        return Plan("cost-per-step", chosen, None, "")

    tie = plan({K80: 2, ke: 2})
    assert policy.mix_of(tie) == {"k80": 4} and policy.zones_of(tie) == {"k80": K80.zone}
    dear = plan({kco: 1, keo: 2, K80: 1})
    assert policy.on_demand_of(dear) == {"k80": 3} and policy.zones_of(dear) == {"k80": ke.zone}


@pytest.mark.parametrize(
    "spot, on_demand_kinds, asked",
    [
        (True, True, [{"k80": 0}]),  # a Spot cluster that may buy on demand: none this time
        (None, True, [{"k80": 0}]),  # a cluster that does not say: Spot
        (True, False, []),  # no on-demand kind to buy
        (False, True, []),  # an on-demand cluster: all its workers are
    ],
    ids=["spot", "spot-by-default", "spot-only", "on-demand-cluster"],
)
def test_a_change_says_how_many_run_on_demand_only_where_the_cluster_weighs_it(
    spot: bool | None, on_demand_kinds: bool, asked: list[dict[str, int]]
):
    """A Spot cluster whose planner may buy on-demand workers is told how many of each type run
    on demand (0 for a type with none, its on-demand workers swapped back for Spot ones); any
    other cluster is scaled by its mix alone."""
    cluster = RecordingCluster({"k80": 1})
    if spot is None:
        del cluster.spot
    else:
        cluster.spot = spot
    kinds = [K80, Kind("k80", K80.zone, False, 0.45)] if on_demand_kinds else [K80]
    policy = TransientPolicy(cluster, "deadline", deadline="1h", planner=Planner(kinds, 0.143))
    cluster.add("train-started", time.time(), run="r", steps=64_000)
    plan = asyncio.run(policy.adapt())
    assert plan is not None and len(cluster.scaled) == 1
    assert policy.on_demand_of(plan) == {}
    assert cluster.on_demand_scaled == asked


def test_a_deadline_left_is_a_second_at_least_and_a_ps_shard_is_never_given_back():
    """Past its deadline a run is planned to finish within a second; a cluster with two PS
    shards is planned with two at least."""
    cluster = RecordingCluster({"k80": 8})
    cluster.ps_hosts = 2
    policy = _policy(cluster, "deadline", deadline="1h")
    policy.started_at = T0
    cluster.add("train-started", T0, run="r", steps=64_000, elastic_shards=True)
    policy.observe(cluster.monitor.events)
    plan = policy.recommend(T0 + 7200)
    assert plan is not None and plan.limit == 1.0
    assert plan.candidates and all(c.config.shards >= 2 for c in plan.candidates)


def test_no_ps_move_while_a_change_settles_nor_within_the_settle_time_of_the_policys_own():
    """The storm that makes a PS move pay: no move while the last change settles; once the
    policy moved the PS, no other move (even against a plan any move beats) for two
    start-ups."""
    cluster = ZonedCluster({"p100": 3})
    policy = _stormy_central(cluster, time.time() - 24 * 300 - 600)
    policy._acted_at = time.time()
    asyncio.run(policy.adapt())
    assert cluster.moves == []
    policy._acted_at = None
    plan = asyncio.run(policy.adapt())
    assert plan is not None and [zone for zone, _ in cluster.moves] == ["us-east1-c"]
    assert policy.ps_move(_outdone(plan)) is None


def test_the_ps_is_planned_where_a_move_takes_it_and_back_where_the_move_failed():
    """A failed move with none under way changes nothing; once a move began, the PS is planned
    in its new zone whatever comes next, and back in its old one if the move failed."""
    cluster = RecordingCluster({"p100": 1})
    planner = Planner([P100], 0.19, ps_zone="us-central1-a")
    policy = TransientPolicy(cluster, "cost-per-step", planner=planner)
    cluster.add("ps-move-failed", T0, zone="us-east1-c")
    policy.observe(cluster.monitor.events)
    assert planner.ps_zone == "us-central1-a"
    cluster.add("ps-move", T0, zone_from="us-central1-a", zone="us-east1-c")
    cluster.add("train-started", T0, run="r", steps=64_000)
    policy.observe(cluster.monitor.events)
    assert planner.ps_zone == "us-east1-c"
    cluster.add("ps-move-failed", T0 + 60, zone="us-east1-c")
    policy.observe(cluster.monitor.events)
    assert planner.ps_zone == "us-central1-a"


def test_a_started_policy_announces_its_goal_and_decides_each_round_even_after_a_bad_one(
    caplog: pytest.LogCaptureFixture,
):
    """Started, the policy says its goal in the log, then decides every interval: a round that
    fails is logged, with the cluster's name (``?`` for one without), and the next one runs.
    Stopped, it cancels its rounds and says no goal is on; stopped quietly, it says nothing; a
    policy never started has nothing to stop."""
    cluster = RecordingCluster({"k80": 1})
    cluster.loop = _Loop()
    policy = _policy(cluster, "deadline", deadline="1h", interval=0.001)
    policy.stop()
    assert cluster.loop.callbacks == []
    cluster.add("train-started", time.time(), run="r", steps=64_000)
    rounds: list[Any] = []
    adapt = policy.adapt

    async def flaky() -> Plan | None:
        rounds.append(None)
        if len(rounds) == 1:
            raise RuntimeError("a bad round of a cluster without a name")
        if len(rounds) == 2:
            cluster.name = "c-1"
            raise RuntimeError("a bad round of c-1")
        return await adapt()

    policy.adapt = flaky  # type: ignore[method-assign]
    policy.start()
    ((start, args),) = cluster.loop.callbacks

    async def run() -> None:
        await start(*args)
        for _ in range(1000):
            if len(rounds) >= 3:
                break
            await asyncio.sleep(0.001)
        policy.stop()
        (cancel, _), (announce, off) = cluster.loop.callbacks[1:]
        cancel()
        await announce(*off)

    with caplog.at_level("ERROR", logger="transient_nb.policy.adaptive"):
        asyncio.run(run())
    assert len(rounds) >= 3
    failed = [r for r in caplog.records if r.levelname == "ERROR"]
    assert [r.getMessage() for r in failed] == [
        "Policy round of ? failed",
        "Policy round of c-1 failed",
    ]
    assert all(r.exc_info is not None for r in failed)
    announced, decided, stopped = (cluster.posted[0], cluster.posted[1], cluster.posted[-1])
    assert announced == {
        "kind": "policy",
        "goal": "deadline",
        "deadline_s": 3600,
        "budget": None,
        "history": None,
        "remembered_h": 0.0,
    }
    assert decided["kind"] == "policy-decision" and decided["acted"] is True
    assert stopped == STOPPED
    assert policy._task is None
    quiet = _policy(cluster, "cost-per-step")
    task = SimpleNamespace(cancel=lambda: None)
    quiet._task = task  # type: ignore[assignment]
    cluster.loop.callbacks.clear()
    quiet.stop(announce=False)
    assert cluster.loop.callbacks == [(task.cancel, ())] and quiet._task is None


def test_a_policy_announced_on_a_closing_cluster_goes_on():
    """The scheduler may be closing with the cluster: the policy's announcement failing is no
    error."""

    class Closing(RecordingCluster):
        async def _post(self, kind: str, **fields: Any) -> None:
            raise OSError("closing")

    policy = _policy(Closing({"k80": 1}), "budget", budget=5.0)
    asyncio.run(policy._announce("budget"))


def test_a_budget_policy_announces_its_budget_and_none_once_stopped():
    """The views show the budget that is on, and none once the policy stopped."""
    cluster = RecordingCluster({"k80": 1})
    policy = _policy(cluster, "budget", budget=5.0)
    asyncio.run(policy._announce("budget"))
    asyncio.run(policy._announce(None))
    assert cluster.posted == [
        {
            "kind": "policy",
            "goal": "budget",
            "deadline_s": None,
            "budget": 5.0,
            "history": None,
            "remembered_h": 0.0,
        },
        STOPPED,
    ]


def test_a_users_model_is_planned_from_its_size_and_flops_not_resnet_32s():
    """A run of a user's model says its parameters and FLOPs (train-started): the PS's prior
    capacity scales with the model's size, each GPU type's prior rate is its FLOP-based
    estimate; a built-in run keeps the paper's figures."""
    from transient_nb.catalog.prices import PriceCatalog
    from transient_nb.training.estimate import reference_flops, worker_rate

    paper = PriceCatalog.load("paper-2019")
    cluster = RecordingCluster({"k80": 2})
    cluster.catalog = paper  # type: ignore[attr-defined]
    policy = _policy(cluster, "cost-per-step")
    builtin = _policy(RecordingCluster({"k80": 2}), "cost-per-step")
    builtin.cluster.add("train-started", T0, run="r", steps=1000, parameters=466_906)
    builtin.observe(builtin.cluster.monitor.events)
    assert builtin.planner.rate("k80") == 4.56 and builtin.planner.ps_capacity(1) == 45.0
    # Ten times the paper's model's FLOPs per sample, a fifth of its parameters, batch 64.
    flops = 10 * reference_flops()
    cluster.add(
        "train-started", T0, run="r", steps=1000, parameters=1_857_722 // 5, batch_size=64,
        flops_per_sample=flops, operators=400, loss="mse",
    )  # fmt: skip
    policy.observe(cluster.monitor.events)
    want, _ = worker_rate(paper, "k80", flops, 64, 400)
    assert policy.planner.rate("k80") == pytest.approx(want)
    assert want == pytest.approx(4.56 * 128 / 64 / 10)  # the paper's K80 rate, scaled
    assert policy.planner.ps_capacity(1) > 45.0 * 2.5  # a fifth of the bytes: much more
