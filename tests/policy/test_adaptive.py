"""The transient-aware policy's decision rules, on synthetic event streams and a recording cluster."""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import Sequence
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest

from transient_nb.policy.adaptive import (
    FIRST_REPORT_S,
    PS_MOVE_SETTLE,
    TransientPolicy,
    check_goal,
    parse_goal,
)
from transient_nb.policy.planner import PRIOR_HOURS, Configuration, Estimate, Kind, Plan, Planner

K80 = Kind("k80", "us-central1-a", True, 0.256)
V100 = Kind("v100", "us-central1-a", True, 0.861)
P100 = Kind("p100", "us-central1-a", True, 0.43)
T0 = 1_000_000.0


class RecordingCluster:
    """What the policy uses of a TransientCluster: the event log, cost, mix, scale, _post."""

    def __init__(self, mix: dict[str, int], spent: float = 0.0):
        self.monitor = SimpleNamespace(events=[])
        self.mix = dict(mix)
        self.gpu = next(iter(mix))
        self.ps_hosts = 1
        self.limits = SimpleNamespace(max_workers=8)
        self.spent = spent
        self.scaled: list[dict[str, int]] = []
        self.ps_scaled: list[int] = []
        self.spot = True
        self.on_demand: dict[str, int] = {}
        self.on_demand_scaled: list[dict[str, int]] = []
        self.posted: list[dict[str, Any]] = []

    def cost(self) -> Any:
        return SimpleNamespace(total=self.spent)

    def scale(self, mix: dict[str, int], on_demand: dict[str, int] | None = None) -> None:
        self.scaled.append(dict(mix))
        self.mix = {g: n for g, n in mix.items() if n}
        if on_demand is not None:
            self.on_demand = dict(on_demand)
            self.on_demand_scaled.append(dict(on_demand))

    def scale_ps(self, n: int) -> None:
        self.ps_scaled.append(n)
        self.ps_hosts = n

    async def _post(self, kind: str, **fields: Any) -> None:
        self.posted.append({"kind": kind, **fields})

    def add(self, kind: str, t: float, **fields: Any) -> None:
        self.monitor.events.append({"kind": kind, "time": t, **fields})


def _vm(cluster: RecordingCluster, name: str, gpu: str, t: float, spot: bool = True) -> None:
    fields = {"worker": name, "role": "worker", "gpu": gpu, "zone": "us-central1-a", "spot": spot}
    cluster.add("requested", t, **fields)
    cluster.add("running", t, **fields)


def _ps_window(cluster: RecordingCluster, t: float, **fields: Any) -> None:
    """Shard 0's ``metrics`` of run ``r``: what the PS served in a window (``updates`` steps)."""
    cluster.add("metrics", t, run="r", shard=0, **fields)


def _policy(cluster: RecordingCluster, goal: str, **kw: Any) -> TransientPolicy:
    return TransientPolicy(cluster, goal, planner=Planner([K80, V100], 0.143), **kw)


def test_it_learns_rates_from_the_trainers_and_hazards_from_revocations():
    cluster = RecordingCluster({"k80": 2})
    policy = _policy(cluster, "cost-per-step")
    _vm(cluster, "w-0", "k80", T0)
    _vm(cluster, "w-1", "k80", T0)
    for i, t in enumerate([T0 + 10, T0 + 20, T0 + 30]):
        cluster.add("worker-metrics", t, worker="w-0", local_step=60 * i, step=0)
    policy.observe(cluster.monitor.events)
    assert policy.planner.rate("k80") == 4.56  # held until the PS says it kept up
    _ps_window(cluster, T0 + 30, step=120, active_workers=1, updates=40, steps_per_s=6.0)
    policy.observe(cluster.monitor.events)
    assert policy.planner.rate("k80") == pytest.approx(6.0)  # 60 local steps per 10 s
    prior = policy.planner.hazard_per_h(K80)
    # w-1 revoked after half an hour, w-0 deleted (scaled away) after an hour: 1 revocation in
    # 1.5 server-hours.
    cluster.add("preempted", T0 + 1800, worker="w-1", role="worker", gpu="k80")
    cluster.add("deleted", T0 + 3600, worker="w-0", role="worker", gpu="k80")
    policy.observe(cluster.monitor.events)
    assert policy.planner.hazard_per_h(K80) == pytest.approx(
        (prior * PRIOR_HOURS + 1) / (PRIOR_HOURS + 1.5)
    )
    # Seen events are not counted twice.
    policy.observe(cluster.monitor.events)
    assert policy.planner.hazard_per_h(K80) == pytest.approx(
        (prior * PRIOR_HOURS + 1) / (PRIOR_HOURS + 1.5)
    )


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


def _scaled_stream(time_scale: float, step_scale: float) -> tuple[TransientPolicy, Any]:
    """One K80 trainer's stream as a cluster at ``time_scale`` records it for a run whose steps
    each stand for ``step_scale`` emulated ones: 6 emulated steps per simulated second, one
    revocation after 30 simulated minutes, 16 simulated minutes into a 1 h deadline."""
    import json

    cluster = RecordingCluster({"k80": 2})
    cluster.time_scale = time_scale
    policy = _policy(cluster, "deadline", deadline="1h")
    policy.started_at = T0
    hp = json.dumps({"emulate_step_scale": step_scale})
    cluster.add("train-started", T0, run="r", steps=round(64_000 / step_scale), hparams=hp)
    _vm(cluster, "w-0", "k80", T0)
    _vm(cluster, "w-1", "k80", T0)
    wall = 1 / time_scale  # wall seconds per simulated second
    for i in range(3):  # 3000 emulated steps each 500 simulated seconds
        local = round(3000 * i / step_scale)
        cluster.add("worker-metrics", T0 + 500 * i * wall, worker="w-0", local_step=local)
    served = 6.0 * time_scale / step_scale  # wall steps/s: 6 emulated steps/s, as w-0 does
    _ps_window(cluster, T0 + 1000 * wall, step=0, updates=40, steps_per_s=served)
    cluster.add("preempted", T0 + 1800 * wall, worker="w-1", role="worker", gpu="k80")
    policy.observe(cluster.monitor.events)
    return policy, policy.recommend(now=T0 + 960 * wall)


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


V100_OD = Kind("v100", "us-central1-a", False, 2.48)
K80_OD = Kind("k80", "us-central1-a", False, 0.45)


def _saturate(cluster: RecordingCluster, gpu: str, served: float, at: float) -> None:
    """8 ``gpu`` workers pushing for 10 s, and the PS's metrics: ``served`` global steps/s."""
    for i in range(8):
        _vm(cluster, f"w-{i}", gpu, at)
        for t in (at, at + 10):  # each its share of what the PS serves
            local = round(served / 8 * (t - at))
            cluster.add("worker-metrics", t, worker=f"w-{i}", local_step=local, step=0)
    _ps_window(cluster, at + 10, step=10, active_workers=8, updates=40, steps_per_s=served)


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


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"goal": "speed"}, "goal='speed': use one of deadline, budget, cost-per-step"),
        ({"goal": "deadline"}, "needs deadline= a positive duration such as '2h', not None"),
        ({"goal": "deadline", "deadline": "soon"}, "not 'soon'"),
        ({"goal": "budget", "budget": -1}, "needs budget= a positive number of dollars, not -1"),
        ({"goal": "budget", "budget": True}, "not True"),
        ({"goal": "cost-per-step", "max_shards": 0}, "max_shards=0 must be a whole number"),
        ({"goal": "cost-per-step", "max_shards": 1.5}, "max_shards=1.5 must be a whole number"),
    ],
)
def test_bad_goals_are_refused_before_anything_changes(kwargs, match):
    cluster = RecordingCluster({"k80": 1})
    with pytest.raises(ValueError, match=match):
        TransientPolicy(cluster, planner=Planner([K80], 0.1), **kwargs)
    assert cluster.scaled == [] and cluster.posted == []


# -- one real run: the policy grows a local cluster to meet a deadline --------------------------


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_deadline_policy_grows_a_real_cluster_during_a_run(cleanup: None) -> None:
    from conftest import of_kind, wait_for_sync

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
        policy=SimpleNamespace(fallback_gpus=["p100", "k80"]),
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


def test_it_learns_the_start_up_and_lets_a_change_settle_for_that_long():
    cluster = RecordingCluster({"k80": 1})
    cluster.time_scale = 10.0
    policy = _policy(cluster, "deadline", deadline="1h")
    assert policy.planner.startup_s == pytest.approx(108.5)  # the paper's prior
    now = time.time()
    _vm(cluster, "w-old", "k80", now - 60)  # asked for before the run: its wait is not one
    cluster.add("train-started", now - 40, run="r", steps=64_000)
    _vm(cluster, "w-0", "k80", now - 30)
    cluster.add("joined", now - 20, worker="w-0")  # joined, but not training yet
    policy.observe(cluster.monitor.events)
    assert policy.planner.startup_s == pytest.approx(108.5)
    # Its trainer's first report, 2 s of training after it started: 27 wall s at time scale
    # 10 from the request to training, 270 s.
    cluster.add("worker-metrics", now - 1, worker="w-0", local_step=4, step=4)
    cluster.add("worker-metrics", now - 1, worker="w-old", local_step=90, step=94)
    plan = asyncio.run(policy.adapt())
    assert policy.planner._observed_startups == [pytest.approx(270.0)]
    # Its VM ran at once (requested and running together): all of it was loading.
    assert policy.planner._observed_loads == [pytest.approx(270.0)]
    assert policy.planner.startup_s == pytest.approx(270.0)
    assert plan is not None and len(cluster.scaled) == 1  # 1 K80 misses 1 h: it grows
    # Something undoes the change at once (a revocation, a user): the policy waits until a
    # start-up (27 wall s here) has passed before it changes the mix again.
    cluster.mix = {"k80": 1}
    asyncio.run(policy.adapt())
    assert len(cluster.scaled) == 1 and policy.settling()
    assert not policy.settling(now=time.time() + 27.5)
    policy._acted_at = time.time() - 28
    asyncio.run(policy.adapt())
    assert len(cluster.scaled) == 2 and cluster.scaled[1] == cluster.scaled[0]


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


def _zoned(prices: tuple[float, float]) -> tuple[RecordingCluster, TransientPolicy, Kind, Kind]:
    """Four t4 workers in us-central1-a, a run under way, and a fallback zone the cluster may use."""
    from transient_nb.policy.placement import ReplacementPolicy

    home = Kind("t4", "us-central1-a", True, prices[0])
    other = Kind("t4", "us-east1-c", True, prices[1])
    cluster = RecordingCluster({"t4": 4})
    cluster.zone = "us-central1-a"
    cluster.policy = ReplacementPolicy("t4", "us-central1-a", True, fallback_zones=["us-east1-c"])
    policy = TransientPolicy(cluster, "cost-per-step", planner=Planner([home, other], 0.143))
    now = time.time()
    cluster.add("train-started", now - 7200, run="r", steps=64_000)
    for i in range(4):
        _vm(cluster, f"w-{i}", "t4", now - 3600)
    return cluster, policy, home, other


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
    assert cluster.policy.preferred_zones == {"t4": "us-east1-c"}
    assert [p.zone for p in cluster.policy.candidates("t4")] == ["us-east1-c", "us-central1-a"]
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
    assert cluster.policy.preferred_zones == {}  # same price, same odds: the cluster's own zone
    cheaper, policy, _, other = _zoned((0.3, 0.2))
    plan = asyncio.run(policy.adapt())
    assert plan is not None and policy.zones_of(plan) == {"t4": other.zone}
    assert cheaper.policy.preferred_zones == {"t4": "us-east1-c"}


def test_the_ps_zone_and_the_rates_of_far_workers_come_from_the_event_log():
    """The PS host may have fallen back to another zone: its ``running`` event says where. A
    worker in another region reports a slower rate, which the planner keeps as a near one's."""
    near = Kind("p100", "us-central1-a", True, 0.551)
    far = Kind("p100", "us-east1-c", True, 0.551)
    cluster = RecordingCluster({"p100": 2})
    policy = TransientPolicy(
        cluster, "cost-per-step", planner=Planner([near, far], 0.143, ps_zone="us-central1-a")
    )
    cluster.add("running", T0, worker="ps-0", role="ps", zone="us-central1-b")
    cluster.add("running", T0, worker="ps-1", role="ps", zone="us-west1-b")  # not shard 0's
    fields = {"worker": "w-0", "role": "worker", "gpu": "p100", "zone": "us-east1-c"}
    cluster.add("requested", T0, **fields)
    cluster.add("running", T0, **fields)
    cluster.add("worker-metrics", T0 + 10, worker="w-0", local_step=100)
    cluster.add("worker-metrics", T0 + 20, worker="w-0", local_step=200)  # 10 steps/s, far
    _ps_window(cluster, T0 + 20, step=200, updates=40, steps_per_s=10.0)
    policy.observe(cluster.monitor.events)
    assert policy.planner.ps_zone == "us-central1-b"
    assert policy.planner.rate("p100") == pytest.approx(10.0 * 1.48)
    assert policy.planner.kind_rate(far) == pytest.approx(10.0)


def test_the_ps_capacity_and_the_bottleneck_are_learned_from_the_ps_metrics():
    """Where adding workers stops adding steps, the PS is the bottleneck: one V100 had 15.5
    steps/s served, eight have 30. The PS's capacity is 30, and the workers' rates of that
    moment (30/8 each) are not their GPUs'."""
    cluster = RecordingCluster({"v100": 8})
    policy = _policy(cluster, "cost-per-step")
    cluster.add("train-started", T0, run="r", steps=64_000, shards=1)
    names = [f"w-{i}" for i in range(8)]
    for name in names:
        _vm(cluster, name, "v100", T0)
    # One worker pushing at its GPU's rate; another one still loading (registered with the PS,
    # active there, but not reporting yet: not counted).
    cluster.add("worker-metrics", T0, worker="w-0", local_step=0, step=0)
    cluster.add("worker-metrics", T0 + 10, worker="w-0", local_step=156, step=0)
    _ps_window(cluster, T0 + 10, step=156, active_workers=2, updates=40, steps_per_s=15.5)
    policy.observe(cluster.monitor.events)
    assert not policy._ps_bottleneck and policy.planner.rate("v100") == pytest.approx(15.6)
    assert policy.planner.ps_capacity(1) == pytest.approx(45.0)  # the prior: nothing above it
    # Eight pushing for 10 s: 30 steps/s served, not the 124 that 8 x 15.5 would be. Their
    # reports of that window (3.75 steps/s each) are the PS's share, not their GPUs' rate.
    for t in (T0 + 20, T0 + 30):
        for name in names:
            cluster.add("worker-metrics", t, worker=name, local_step=int(3.75 * (t - T0)))
    _ps_window(cluster, T0 + 30, step=900, active_workers=8, updates=40, steps_per_s=30.0)
    policy.observe(cluster.monitor.events)
    assert policy._ps_bottleneck
    assert policy.planner.ps_capacity(1) == pytest.approx(30.0)
    assert policy.planner.rate("v100") == pytest.approx(15.6)
    plan = asyncio.run(policy.adapt())
    assert plan is not None
    (decision,) = [e for e in cluster.posted if e["kind"] == "policy-decision"]
    assert decision["ps_bottleneck"] is True
    assert decision["ps_capacity"] == pytest.approx(
        policy.planner.ps_capacity(plan.chosen.config.shards), abs=0.01
    )
    # Four left, served 55 steps/s where one had 15.5 (62 in proportion): within 15%, the PS
    # keeps up, so it serves at least that much, and their rates count again.
    for w in names[4:]:
        cluster.add("preempted", T0 + 33, worker=w, role="worker", gpu="v100")
    for name in names[:4]:
        cluster.add("worker-metrics", T0 + 40, worker=name, local_step=int(3.75 * 30) + 125)
    _ps_window(cluster, T0 + 40, step=1200, active_workers=4, updates=40, steps_per_s=55.0)
    policy.observe(cluster.monitor.events)
    assert not policy._ps_bottleneck
    assert policy.planner.ps_capacity(1) == pytest.approx(55.0)
    assert policy.planner.rate("v100") == pytest.approx(12.5)
    # Served more than the workers counted can push (one pushing has not reported yet): no
    # verdict, and no sample that would make four look short later.
    cluster.add("worker-metrics", T0 + 40.5, worker=names[0], local_step=240)
    cluster.add("preempted", T0 + 40.6, worker=names[1], role="worker", gpu="v100")
    cluster.add("preempted", T0 + 40.6, worker=names[2], role="worker", gpu="v100")
    cluster.add("preempted", T0 + 40.6, worker=names[3], role="worker", gpu="v100")
    _ps_window(cluster, T0 + 40.7, step=1250, updates=40, steps_per_s=54.0)
    policy.observe(cluster.monitor.events)
    assert not policy._ps_bottleneck and (1, 1) in policy._served
    assert policy._served[(1, 1)] == [15.5]
    for name in names[1:4]:  # back (the test's shortcut: the same names)
        _vm(cluster, name, "v100", T0 + 40.8)
    # Short windows are judged together, 40 steps at least with the same workers pushing: one
    # of 8 steps that reads 30 steps/s is no bottleneck by itself (one step more or less in a
    # window is 12% here); five of them at 30, 30, 30, 30, 80 are (34 steps/s over the 40 steps,
    # under 85% of the 62 that one worker's 15.5 grown to four would be).
    for i, served in enumerate((30.0, 30.0, 30.0, 30.0, 80.0)):
        t = T0 + 41 + i
        for name in names[:4]:
            cluster.add("worker-metrics", t, worker=name, local_step=240 + round(8.6 * (i + 1)))
        _ps_window(cluster, t, step=1300 + i, updates=8, steps_per_s=served)
        policy.observe(cluster.monitor.events)
        assert policy._ps_bottleneck == (i == 4)


def _storm_stream(cluster: RecordingCluster, t: float) -> None:
    """24 P100 revoked 5 minutes after their VM ran, each the replacement of the one before
    (the first excepted), each training 300 s after it was asked for (210 s of them loading):
    88 s of training in each 390 s place."""
    fields = {"role": "worker", "gpu": "p100", "zone": "us-central1-a", "spot": True}
    cluster.add("train-started", t, run="r", steps=64_000)
    for i in range(24):
        # Each runs 90 s after it was asked for, trains 300 s after (its first report comes
        # 2 s later), and is revoked 300 s after it ran.
        asked = t + i * 400
        if i:
            cluster.add("replacement-requested", asked, worker=f"w-{i - 1}", role="worker")
        cluster.add("requested", asked, worker=f"w-{i}", **fields)
        cluster.add("running", asked + 90, worker=f"w-{i}", **fields)
        cluster.add("worker-metrics", asked + 302, worker=f"w-{i}", local_step=0)
        cluster.add("preempted", asked + 390, worker=f"w-{i}", **fields)


def test_a_storm_makes_a_deadline_policy_run_its_workers_on_demand():
    """Four workers at most, 0.52 h for 64K steps, under the storm above. The model expects a
    Spot P100 up 46% of the time (exponential lifetimes); its workers trained 23% of their
    places' time, and the planner expects 28%: 4 Spot P100 miss the deadline, and one Spot
    beside three on demand adds too little. The policy asks for all four on demand (their
    start-up counted), says so with both figures, and once they run counts them on demand."""
    p100 = Kind("p100", "us-central1-a", True, 0.43)
    p100_od = Kind("p100", "us-central1-a", False, 1.46)
    cluster = RecordingCluster({"p100": 4})
    policy = TransientPolicy(
        cluster,
        "deadline",
        deadline="0.52h",
        max_workers=4,
        margin=0.0,
        planner=Planner([p100, p100_od], 0.19),
    )
    t = time.time() - 24 * 400 - 600
    _storm_stream(cluster, t)
    for i in range(24, 28):
        _vm(cluster, f"w-{i}", "p100", t + 24 * 400)
    plan = asyncio.run(policy.adapt())
    assert plan is not None and plan.feasible
    assert plan.current is not None and not plan.meets(plan.current)  # 4 Spot P100: too slow
    model = policy.planner.model_availability(p100)
    assert model == pytest.approx(0.46, abs=0.01)
    # 24 places of 388-390 s, 88 s trained each (the first counted from its training), and
    # the four placed at the end, which trained from their first report.
    assert policy.planner.availability(p100) == pytest.approx(0.28, abs=0.02)
    assert plan.chosen.config.counts == {p100_od: 4}
    assert cluster.scaled == [{"p100": 4}] and cluster.on_demand_scaled == [{"p100": 4}]
    (decision,) = [e for e in cluster.posted if e["kind"] == "policy-decision"]
    assert decision["acted"] is True and decision["on_demand"] == {"p100": 4}
    assert "4 p100 in us-central1-a (on demand)" in decision["reason"]
    observed, by_model = decision["availability"]["p100@us-central1-a"]
    assert observed == pytest.approx(policy.planner.availability(p100), abs=1e-4)
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
    assert again.current.config.counts == {p100_od: 4}


def test_the_first_workers_start_up_is_their_request_to_training_less_their_wait_for_the_run():
    """Workers asked for before the run: w-0 asked at 0, running at 90, joined at 150, the run
    started at 400, trained at 480: 90 + 60 + 80 = 230 s of start-up (140 of them loading), not
    the 250 s it waited for the run. w-1 joined after the run started: all of it counts. Then a
    worker asked for during the run trains: its start-up is the one that counts."""
    cluster = RecordingCluster({"p100": 2})
    policy = TransientPolicy(cluster, "cost-per-step", planner=Planner([P100], 0.19))
    fields = {"role": "worker", "gpu": "p100", "zone": "us-central1-a", "spot": True}
    t = 1000.0
    for name, asked, ran, joined in (("w-0", 0, 90, 150), ("w-1", 0, 300, 420)):
        cluster.add("requested", t + asked, worker=name, **fields)
        cluster.add("running", t + ran, worker=name, **fields)
        cluster.add("joined", t + joined, worker=name, **fields)
    cluster.add("train-started", t + 400, run="r", steps=64_000)
    cluster.add("worker-metrics", t + 480 + FIRST_REPORT_S, worker="w-0", local_step=0)
    policy.observe(cluster.monitor.events)
    assert (policy.planner.startup_s, policy.planner.load_s) == (230.0, 140.0)
    cluster.add("worker-metrics", t + 500 + FIRST_REPORT_S, worker="w-1", local_step=0)
    policy.observe(cluster.monitor.events)
    # Medians of (230, 500) and (140, 200): the upper ones.
    assert (policy.planner.startup_s, policy.planner.load_s) == (500.0, 200.0)
    # A worker asked for during the run, trained 200 s later (120 s after it ran).
    cluster.add("requested", t + 600, worker="w-2", **fields)
    cluster.add("running", t + 680, worker="w-2", **fields)
    cluster.add("worker-metrics", t + 800 + FIRST_REPORT_S, worker="w-2", local_step=0)
    policy.observe(cluster.monitor.events)
    assert (policy.planner.startup_s, policy.planner.load_s) == (200.0, 120.0)
    # A worker's second report is no start-up.
    cluster.add("worker-metrics", t + 900, worker="w-0", local_step=40)
    policy.observe(cluster.monitor.events)
    assert (policy.planner.startup_s, policy.planner.load_s) == (200.0, 120.0)


def test_a_spot_place_counts_from_a_replacement_request_and_from_training_otherwise():
    """Observed availability, event by event: a replacement's place from its request, another
    worker's from its training; one given back before it trained is left out; on-demand
    workers are not counted; places still held count to now."""
    p100 = Kind("p100", "us-central1-a", True, 0.43)
    cluster = RecordingCluster({"p100": 2})
    policy = TransientPolicy(cluster, "cost-per-step", planner=Planner([p100], 0.19), max_workers=2)
    fields = {"role": "worker", "gpu": "p100", "zone": "us-central1-a", "spot": True}
    t = 1000.0
    cluster.add("train-started", t, run="r", steps=64_000)
    # w-0: there at the start, trains from 100 s, revoked at 500 s: 400 s held, all trained.
    cluster.add("running", t, worker="w-0", **fields)
    cluster.add("worker-metrics", t + 100 + FIRST_REPORT_S, worker="w-0", local_step=0)
    cluster.add("preempted", t + 500, worker="w-0", **fields)
    # w-1 replaces it at 510 s, trains from 810 s, still up at 1010 s: 500 s held, 200 trained.
    cluster.add("replacement-requested", t + 510, worker="w-0", role="worker")
    cluster.add("requested", t + 510, worker="w-1", **fields)
    cluster.add("running", t + 600, worker="w-1", **fields)
    cluster.add("worker-metrics", t + 810 + FIRST_REPORT_S, worker="w-1", local_step=0)
    # w-2, asked for by a scale-up, given back before it trained: left out.
    cluster.add("requested", t + 520, worker="w-2", **fields)
    cluster.add("deleted", t + 700, worker="w-2", **fields)
    # w-3, a replacement revoked while it booted: 100 s held, none trained.
    cluster.add("replacement-requested", t + 530, worker="w-x", role="worker")
    cluster.add("requested", t + 530, worker="w-3", **fields)
    cluster.add("preempted", t + 630, worker="w-3", **fields)
    # w-4, an on-demand replacement: not counted.
    cluster.add("replacement-requested", t + 540, worker="w-y", role="worker")
    cluster.add("requested", t + 540, worker="w-4", **{**fields, "spot": False})
    policy.observe(cluster.monitor.events)
    policy.observe_places(now=t + 1010)
    held, trained = policy.planner._held[("p100", "us-central1-a")]
    assert held * 3600 == pytest.approx(400 + 500 + 100)
    assert trained * 3600 == pytest.approx(400 + 200)


class ZonedCluster(RecordingCluster):
    """A cluster that may place workers in ``zones``: by default us-central1-a (its PS's) and
    us-east1-c."""

    def __init__(self, mix: dict[str, int], zones: Sequence[str] = ("us-central1-a", "us-east1-c")):
        super().__init__(mix)
        self.ps_move_zone = None
        self.moves: list[tuple[str, str]] = []
        self.preferred: dict[str, str] = {}
        self.policy = SimpleNamespace(
            zones=lambda: list(zones),
            prefer_zone=lambda gpu, zone: self.preferred.__setitem__(gpu, zone),
        )

    def move_ps(self, zone: str, reason: str = "") -> None:
        self.moves.append((zone, reason))


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


def _stormy_central(
    cluster: ZonedCluster,
    t: float,
    *far: Kind,
    goal: str = "cost-per-step",
    run: dict[str, Any] | None = None,
    **kw: Any,
) -> TransientPolicy:
    """The storm of the test above, the PS in us-central1-a: a move to us-east1-c (or to the
    zone of a ``far`` kind) pays. On the cluster's clock (its ``time_scale``: simulated seconds
    per wall second); ``run``: more fields of its ``train-started``."""
    here = Kind("p100", "us-central1-a", True, 0.43)
    there = Kind("p100", "us-east1-c", True, 0.43)
    planner = Planner([here, there, *far], 0.19, ps_zone="us-central1-a")
    policy = TransientPolicy(cluster, goal, planner=planner, **kw)
    wall = 1 / getattr(cluster, "time_scale", 1.0)  # wall seconds per simulated second
    cluster.add("running", t, worker="ps-0", role="ps", zone="us-central1-a")
    for i in range(24):
        _vm(cluster, f"w-{i}", "p100", t + i * 300 * wall)
        cluster.add("preempted", t + (i * 300 + 300) * wall, worker=f"w-{i}", role="worker")
    cluster.add("train-started", t + 24 * 300 * wall, run="r", steps=64_000, **(run or {}))
    return policy


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


def _outdone(plan: Plan) -> Plan:
    """``plan`` with its choice ten times as dear: a plan any other region's would beat."""
    return replace(plan, chosen=replace(plan.chosen, cost=10 * plan.chosen.cost))


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
    cluster.policy = SimpleNamespace(zones=lambda: ["us-central1-a", "us-central1-b"])
    assert policy.ps_move(outdone, now) is None
    # A cluster with no replacement policy (its workers go to its own zone only), which knows no
    # PS moves either.
    del cluster.policy, cluster.ps_move_zone
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


def test_no_ps_move_where_the_cluster_finishes_within_a_ps_hosts_start_up():
    """However much better the plan elsewhere, a PS is not moved for steps the cluster as it is
    trains before a new PS host would serve one: counted in the steps the run stands for. A
    cluster stepping 4 emulated steps/s trains 434 in the prior's 108.5 s start-up: 217 steps of
    a run paced 2 emulated steps each are left to it, 218 are not."""
    now = float(int(time.time()))
    cluster = ZonedCluster({"p100": 3})
    hparams = '{"emulate_step_scale": 2}'
    policy = _stormy_central(cluster, now - 24 * 300 - 600, run={"hparams": hparams})
    assert policy.planner.startup_s == 108.5

    def outdone_stepping_4_per_s() -> Plan:
        policy.observe(cluster.monitor.events)
        plan = policy.recommend(now)
        assert plan is not None and plan.current is not None
        return replace(_outdone(plan), current=replace(plan.current, liveput=4.0))

    cluster.add("metrics", now, run="r", shard=0, step=64_000 - 218)
    move = policy.ps_move(outdone_stepping_4_per_s(), now)
    assert move is not None and move[0] == "us-east1-c"
    cluster.add("metrics", now, run="r", shard=0, step=64_000 - 217)
    assert policy.ps_move(outdone_stepping_4_per_s(), now) is None


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


def _spot_p100_policy(cluster: RecordingCluster) -> TransientPolicy:
    return TransientPolicy(cluster, "cost-per-step", planner=Planner([P100], 0.19), max_workers=4)


def test_a_place_counts_the_fractions_of_a_second_it_was_held_and_trained():
    """A place is what its worker held and trained, to the fraction of a second, nothing more:
    one revoked half a second into its training trained half a second, one revoked a quarter of
    a second after its request held a quarter of one."""
    cluster = RecordingCluster({"p100": 2})
    policy = _spot_p100_policy(cluster)
    fields = {"role": "worker", "gpu": "p100", "zone": "us-central1-a", "spot": True}
    t = 1000.0
    cluster.add("train-started", t, run="r", steps=64_000)
    cluster.add("replacement-requested", t, worker="w-x", role="worker")
    cluster.add("requested", t, worker="w-0", **fields)
    cluster.add("running", t + 90, worker="w-0", **fields)
    cluster.add("worker-metrics", t + 300 + FIRST_REPORT_S, worker="w-0", local_step=0)
    cluster.add("preempted", t + 300.5, worker="w-0", **fields)
    cluster.add("replacement-requested", t + 400, worker="w-0", role="worker")
    cluster.add("requested", t + 400, worker="w-1", **fields)
    cluster.add("preempted", t + 400.25, worker="w-1", **fields)
    policy.observe(cluster.monitor.events)
    policy.observe_places(now=t + 500)
    held, trained = policy.planner._held[("p100", "us-central1-a")]
    assert held * 3600 == pytest.approx(300.5 + 0.25)
    assert trained * 3600 == pytest.approx(0.5)


def test_a_place_given_back_counts_once_its_worker_trained():
    """A worker given back (scaled away) after it trained held its place until then; a
    replacement given back before it trained is left out, as if it had not been asked for: it had
    no chance to train, and counting it would read a scale-down as a storm."""
    cluster = RecordingCluster({"p100": 2})
    policy = _spot_p100_policy(cluster)
    fields = {"role": "worker", "gpu": "p100", "zone": "us-central1-a", "spot": True}
    t = 1000.0
    cluster.add("train-started", t, run="r", steps=64_000)
    for name, lost in (("r-0", "w-0"), ("r-1", "w-1")):
        cluster.add("replacement-requested", t, worker=lost, role="worker")
        cluster.add("requested", t, worker=name, **fields)
    # r-0 given back at 100 s before it trained; r-1 trains from 200 s, given back at 500 s.
    cluster.add("deleted", t + 100, worker="r-0", **fields)
    cluster.add("running", t + 120, worker="r-1", **fields)
    cluster.add("worker-metrics", t + 200 + FIRST_REPORT_S, worker="r-1", local_step=0)
    cluster.add("deleted", t + 500, worker="r-1", **fields)
    policy.observe(cluster.monitor.events)
    policy.observe_places(now=t + 600)
    held, trained = policy.planner._held[("p100", "us-central1-a")]
    assert (held * 3600, trained * 3600) == (pytest.approx(500), pytest.approx(300))


def test_only_spot_workers_hold_places_and_a_vm_not_said_spot_is_spot():
    """Availability is the Spot workers': an on-demand worker trains all the time it runs and
    would hide a storm, gone or still running. A VM whose events do not say ``spot`` is a Spot
    one (the cluster's default). The places still held count to the clock's now."""
    cluster = RecordingCluster({"p100": 4})
    policy = _spot_p100_policy(cluster)
    spot = {"role": "worker", "gpu": "p100", "zone": "us-central1-a"}  # Spot by default
    dear = {**spot, "spot": False}
    t = time.time() - 1000
    cluster.add("train-started", t, run="r", steps=64_000)
    for name, fields in (("d-0", dear), ("d-1", dear), ("s-0", spot), ("s-1", spot)):
        cluster.add("running", t, worker=name, **fields)
    # On demand: both train from 0 s, d-0 is given back at 300 s, d-1 runs on. Spot: s-0
    # trains from 100 s and is revoked at 400 s; s-1 trains from 200 s and runs on.
    for name, trains in (("d-0", 0), ("d-1", 0), ("s-0", 100), ("s-1", 200)):
        cluster.add("worker-metrics", t + trains + FIRST_REPORT_S, worker=name, local_step=0)
    cluster.add("deleted", t + 300, worker="d-0", **dear)
    cluster.add("preempted", t + 400, worker="s-0", **spot)
    policy.observe(cluster.monitor.events)
    policy.observe_places()
    held, trained = policy.planner._held[("p100", "us-central1-a")]
    assert held * 3600 == pytest.approx(300 + 800, abs=5) and trained == held


def test_first_start_ups_at_the_runs_start_and_a_start_up_without_its_vms_running():
    """A worker asked for before the run that trains the moment it starts counts its start-up:
    asked at 0, running and joined at 90, idle until the run started at 400: 90 s, none of it
    loading. One whose first report says it trained before the run started (a late
    ``train-started``) tells nothing. A worker asked for during the run whose VM was not seen
    running counts its start-up, with no load observed."""
    cluster = RecordingCluster({"p100": 2})
    policy = _spot_p100_policy(cluster)
    fields = {"role": "worker", "gpu": "p100", "zone": "us-central1-a", "spot": True}
    t = 1000.0
    for name, ran, joined in (("w-0", 90, 90), ("w-1", 60, 100)):
        cluster.add("requested", t, worker=name, **fields)
        cluster.add("running", t + ran, worker=name, **fields)
        cluster.add("joined", t + joined, worker=name, **fields)
    cluster.add("train-started", t + 400, run="r", steps=64_000)
    cluster.add("worker-metrics", t + 399 + FIRST_REPORT_S, worker="w-1", local_step=0)
    cluster.add("worker-metrics", t + 400 + FIRST_REPORT_S, worker="w-0", local_step=0)
    policy.observe(cluster.monitor.events)
    assert (policy.planner.startup_s, policy.planner.load_s) == (90.0, 0.0)
    cluster.add("requested", t + 600, worker="w-2", **fields)
    cluster.add("worker-metrics", t + 800 + FIRST_REPORT_S, worker="w-2", local_step=0)
    policy.observe(cluster.monitor.events)
    assert policy.planner.startup_s == 200.0
    assert policy.planner.load_s == policy.planner.prior_load_s == 19.0


def test_a_decision_gives_each_spot_kinds_availability_observed_and_modelled_to_4_places():
    """The ``availability`` of a decision: for each Spot kind of the plan, the fraction of the
    time a worker is expected up and the model's own, rounded to 4 places; a plan made without
    the cluster's configuration (the planner's own) gets them for its choice."""
    cluster = RecordingCluster({"p100": 2})
    policy = _spot_p100_policy(cluster)
    _vm(cluster, "w-0", "p100", T0)
    cluster.add("train-started", T0, run="r", steps=64_000)
    cluster.add("preempted", T0 + 600, worker="w-0", role="worker", gpu="p100")
    # Its replacement, asked for at once, still booting: 300 s held, none trained.
    cluster.add("replacement-requested", T0 + 600, worker="w-0", role="worker")
    cluster.add("requested", T0 + 600, worker="w-1", role="worker", gpu="p100", zone=P100.zone)
    policy.observe(cluster.monitor.events)
    plan = policy.recommend(T0 + 900)
    assert plan is not None
    held, trained = policy.planner._held[("p100", P100.zone)]  # counted to the time asked
    assert (held * 3600, trained) == (pytest.approx(300.0), 0.0)
    observed = round(policy.planner.availability(P100), 4)
    by_model = round(policy.planner.model_availability(P100), 4)
    assert observed < by_model and observed != policy.planner.availability(P100)
    expected = {"p100@us-central1-a": [observed, by_model]}
    assert policy.decision_fields(plan, acted=False)["availability"] == expected
    bare = policy.planner.choose("cost-per-step", 64_000, max_workers=4)
    assert bare.current is None
    assert policy.decision_fields(bare, acted=False)["availability"] == expected


# -- round twelve: the whole module's mutation survivors -------------------------------------


def test_goal_limits_are_accepted_down_to_the_smallest_positive_value():
    """A deadline of one second and a budget of a dollar or less are goals, a budget of $0 is
    not; and a goal gives only its own limit back."""
    assert check_goal("deadline", deadline=1) == (1, None)
    assert check_goal("budget", budget=1) == (None, 1.0)
    assert check_goal("budget", budget=0.5) == (None, 0.5)
    assert check_goal("cost-per-step") == (None, None)
    with pytest.raises(ValueError, match="needs budget= a positive number of dollars, not 0"):
        check_goal("budget", budget=0)


def test_the_policys_options_default_to_the_clusters_and_bad_ones_are_refused():
    """Unset, the largest cluster is the cluster's own limit, the interval 30 s and the clock the
    wall's; the smallest allowed values are taken; a bad one is refused with what to give."""
    cluster = RecordingCluster({"k80": 1})
    cluster.limits = SimpleNamespace(max_workers=5)
    policy = _policy(cluster, "cost-per-step")
    assert (policy.max_workers, policy.max_shards, policy.interval_s) == (5, 2, 30.0)
    assert policy.time_scale == 1.0 and policy.last is None
    smallest = _policy(cluster, "cost-per-step", max_workers=1, max_shards=1, interval=5)
    assert (smallest.max_workers, smallest.max_shards, smallest.interval_s) == (1, 1, 5.0)
    assert _policy(cluster, "cost-per-step", interval="2m").interval_s == 120.0
    assert _policy(cluster, "cost-per-step", interval=0).interval_s == 30.0
    with pytest.raises(ValueError, match=r"max_workers=-1 must be at least 1\."):
        _policy(cluster, "cost-per-step", max_workers=-1)
    advice = (
        "must be a fraction from 0 to below 1 (e.g. 0.1: plan to meet the goal with 10% of the "
        "time or money to spare)."
    )
    for margin in (1, False):
        with pytest.raises(ValueError, match=re.escape(f"margin={margin!r} {advice}")):
            _policy(cluster, "budget", budget=10.0, margin=margin)


def test_by_default_it_weighs_every_zone_the_cluster_may_use_and_prices_its_ps_on_demand():
    """A cluster with no mix, no fallback types and no limit: its own type in its zone and each
    fallback zone; its PS host billed on demand; up to 8 workers; one PS shard, the one a
    cluster that says none has; its workers asked for (``_target``) where it places them."""
    from transient_nb.catalog.prices import PriceCatalog

    catalog = PriceCatalog.load("paper-2019")
    cluster = SimpleNamespace(
        gpu="k80",
        policy=SimpleNamespace(fallback_zones=["us-east1-c"]),
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


def _od_vm(cluster: RecordingCluster, name: str, gpu: str, t: float, **fields: Any) -> None:
    """A worker's VM asked for and running, with ``fields`` (zone, spot) as its events give."""
    for kind in ("requested", "running"):
        cluster.add(kind, t, worker=name, role="worker", gpu=gpu, **fields)


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


def test_workers_to_come_go_where_the_cluster_places_their_type_first():
    """New workers go to the cluster's zone, or the zone its replacement policy prefers for
    the type; as the kind there that runs as asked (Spot or on demand), else the type's Spot kind
    there, else the type's first kind that runs as asked. A live VM counts as the kind of its
    zone, Spot or not."""
    kc, ke = K80, Kind("k80", "us-east1-c", True, 0.256)
    pc, pwo = P100, Kind("p100", "us-west1-b", False, 1.46)
    cluster = RecordingCluster({"k80": 3, "p100": 1})
    cluster.zone = "us-east1-c"
    cluster.policy = SimpleNamespace(preferred_zones={"p100": "us-west1-b"})
    cluster.on_demand = {"k80": 1}
    policy = TransientPolicy(cluster, "cost-per-step", planner=Planner([kc, ke, pc, pwo], 0.19))
    _od_vm(cluster, "w-0", "k80", T0, zone=kc.zone, spot=False)
    policy.observe(cluster.monitor.events)
    assert policy.current().counts == {kc: 1, ke: 2, pc: 1}


def test_a_decision_says_the_steps_left_the_odds_of_losses_the_start_up_and_the_ps():
    """The fields of a decision as the panel shows them: the steps left, the odds of losing 1, 2
    or 3 workers in the hour to 4 places, the start-up and its load to 0.1 s, the PS's capacity
    to 0.01 steps/s (None where no PS limits the run), and no bottleneck before any verdict."""
    cluster = RecordingCluster({"k80": 3})
    planner = Planner([K80], 0.143, ps_steps_per_s=45.4567)
    planner.observe_startup(123.456, 45.678)
    policy = TransientPolicy(cluster, "cost-per-step", planner=planner)
    cluster.add("train-started", T0, run="r", steps=64_000)
    cluster.add("metrics", T0 + 5, run="r", step=4_000, shard=0)
    policy.observe(cluster.monitor.events)
    plan = policy.recommend(T0 + 5)
    assert plan is not None
    fields = policy.decision_fields(plan, acted=False)
    config = plan.chosen.config
    p_lose = [planner.p_lose_at_least(config, k) for k in (1, 2, 3)]
    assert fields["p_lose_1h"] == [round(p, 4) for p in p_lose] != [round(p, 5) for p in p_lose]
    assert fields["remaining_steps"] == 60_000
    assert (fields["startup_s"], fields["load_s"]) == (123.5, 45.7)
    assert fields["ps_capacity"] == round(planner.ps_capacity(config.shards), 2)
    assert fields["ps_capacity"] != round(planner.ps_capacity(config.shards), 3)
    assert fields["ps_bottleneck"] is False
    unlimited = TransientPolicy(
        cluster, "cost-per-step", planner=Planner([K80], 0.143, ps_steps_per_s=None)
    )
    unlimited.observe(cluster.monitor.events)
    free = unlimited.recommend(T0 + 5)
    assert free is not None and unlimited.decision_fields(free, acted=False)["ps_capacity"] is None


@pytest.mark.parametrize(
    "hparams, step_scale",
    [
        ({"emulate_step_scale": 4}, 4.0),
        ('{"emulate_step_scale": 0.5}', 0.5),
        ('{"emulate_step_scale": 0}', 1.0),
        ('{"emulate_step_scale": -2}', 1.0),
        ({"emulate_step_scale": math.inf}, 1.0),
        ('{"emulate_step_scale": "fast"}', 1.0),
        ("not json", 1.0),
        (None, 1.0),
    ],
)
def test_a_runs_pace_is_its_emulated_steps_per_step_when_it_is_a_positive_number(
    hparams: Any, step_scale: float
):
    """``emulate_step_scale`` of the run's hparams (a JSON text or a mapping) where it is a
    positive finite number; else each step stands for one."""
    cluster = RecordingCluster({"k80": 1})
    policy = _policy(cluster, "cost-per-step")
    cluster.add("train-started", T0, run="r", steps=64_000, hparams=hparams)
    policy.observe(cluster.monitor.events)
    assert policy.step_scale == step_scale


def test_a_runs_start_tells_its_steps_left_and_its_ps_shards():
    """A resumed run has its steps less the step it resumed from left; a run started with no
    steps has none to plan; a ``metrics`` event without a step, or any event without a time,
    changes nothing; the PS shards the run started with (then was resharded to) are the ones
    a PS window measures."""
    cluster = RecordingCluster({"k80": 1})
    policy = _policy(cluster, "cost-per-step")
    cluster.monitor.events.append({"kind": "train-started", "run": "r", "steps": 64_000})
    cluster.add("metrics", T0, run="r", shard=0)
    policy.observe(cluster.monitor.events)
    assert policy.remaining_steps() == 64_000
    cluster.add("train-started", T0, run="r", steps=64_000, resumed_step=4_000, shards=2)
    policy.observe(cluster.monitor.events)
    assert policy.remaining_steps() == 60_000 and policy._run_shards == 2
    cluster.add("ps-resharded", T0, run="r", shards=3)
    cluster.add("ps-resharded", T0, run="r")
    policy.observe(cluster.monitor.events)
    assert policy._run_shards == 3
    cluster.add("train-started", T0, run="r2")
    policy.observe(cluster.monitor.events)
    assert policy.remaining_steps() is None and policy.recommend(T0) is None


def _estimate(n: int, eta_s: float, cost: float, liveput: float = 1.0) -> Estimate:
    return Estimate(Configuration.of({K80: n}), liveput, 1.0, eta_s, cost, steps=100.0)


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


def test_a_change_settles_for_exactly_a_start_up_and_a_decision_is_posted_on_a_new_eta():
    """Settling lasts a start-up on the cluster's clock, not a moment more. A decision is
    posted first, then when the expected finish moves by over 10% (10% exactly is not), and
    after an ETA of never."""
    policy = _policy(RecordingCluster({"k80": 1}), "cost-per-step")
    policy._acted_at = 1000.0
    assert policy.settling(1000.0 + 100) and not policy.settling(1000.0 + 108.5)

    def changed(eta_s: float) -> bool:
        new = _estimate(1, eta_s, 1.0)
        return policy._changed_view(Plan("cost-per-step", new, None, ""))

    views = [changed(eta) for eta in (100.0, 110.0, 125.0, math.inf, 100.0)]
    assert views == [True, False, True, True, True]


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


def _reporting(
    cluster: RecordingCluster, name: str, gpu: str, steps: Sequence[tuple[float, int]]
) -> None:
    """A worker's VM running from the first report's time, and its reports (time, local step)."""
    _od_vm(cluster, name, gpu, steps[0][0], zone=K80.zone)
    for t, local in steps:
        cluster.add("worker-metrics", t, worker=name, local_step=local)


def _k80_run() -> tuple[RecordingCluster, TransientPolicy]:
    cluster = RecordingCluster({"k80": 2})
    policy = _policy(cluster, "cost-per-step")
    cluster.add("train-started", T0, run="r", steps=64_000)
    return cluster, policy


def test_no_verdict_from_other_shards_idle_windows_or_spans_under_40_steps():
    """Shard 1's windows, a window that served nothing and one that does not say how many
    steps it served are not the PS's measure; 39 steps are not a span, one more is: then the
    rates the worker reported meanwhile count (it kept up)."""
    cluster, policy = _k80_run()
    _reporting(cluster, "w-0", "k80", [(T0, 0), (T0 + 10, 60)])  # 6 steps/s
    cluster.add("metrics", T0 + 10, run="r", shard=1, step=0, updates=40, steps_per_s=1.0)
    _ps_window(cluster, T0 + 10, step=0, updates=40, steps_per_s=0.0)
    _ps_window(cluster, T0 + 10, step=0, steps_per_s=6.0)
    _ps_window(cluster, T0 + 10, step=0, updates=39, steps_per_s=6.0)
    policy.observe(cluster.monitor.events)
    assert policy.planner.rate("k80") == 4.56 and policy.planner.ps_capacity(1) == 45.0
    _ps_window(cluster, T0 + 10, step=0, updates=1, steps_per_s=6.0)
    policy.observe(cluster.monitor.events)
    assert policy.planner.rate("k80") == 6.0 and not policy._ps_bottleneck


def test_a_ps_serving_under_a_step_a_second_is_measured():
    """A PS that serves half a step a second to a K80 (4.56 steps/s) is the bottleneck, with
    that capacity."""
    cluster, policy = _k80_run()
    _reporting(cluster, "w-0", "k80", [(T0, 0), (T0 + 10, 6)])
    _ps_window(cluster, T0 + 10, step=0, updates=40, steps_per_s=0.5)
    policy.observe(cluster.monitor.events)
    assert policy._ps_bottleneck and policy.planner.ps_capacity(1) == 0.5


def test_no_verdict_where_the_ps_served_more_than_its_workers_said_they_pushed():
    """One worker pushing 6 steps/s and one with a single report (pushing nothing yet) cannot
    have been served 7.5; nor can a worker whose last report shows no progress have been served
    6; on a cluster at time scale 4, 6 wall steps/s are 1.5 simulated ones, less than the 2.5
    of 10 served a wall second. No verdict, no capacity, and the rates wait."""
    cluster, policy = _k80_run()
    _reporting(cluster, "w-0", "k80", [(T0, 0), (T0 + 10, 60)])
    _reporting(cluster, "w-1", "k80", [(T0 + 10, 0)])
    _ps_window(cluster, T0 + 10, step=0, updates=40, steps_per_s=7.5)
    policy.observe(cluster.monitor.events)
    assert policy.planner.rate("k80") == 4.56 and policy.planner.ps_capacity(1) == 45.0
    stalled, policy = _k80_run()
    _reporting(stalled, "w-0", "k80", [(T0, 0), (T0 + 10, 60), (T0 + 15, 60)])
    _ps_window(stalled, T0 + 15, step=0, updates=40, steps_per_s=6.0)
    policy.observe(stalled.monitor.events)
    assert policy.planner.rate("k80") == 4.56 and policy.planner.ps_capacity(1) == 45.0
    scaled, policy = _k80_run()
    scaled.time_scale = policy.time_scale = 4.0
    _reporting(scaled, "w-0", "k80", [(T0, 0), (T0 + 10, 60)])
    _ps_window(scaled, T0 + 10, step=0, updates=40, steps_per_s=10.0)
    policy.observe(scaled.monitor.events)
    assert policy.planner.rate("k80") == 4.56 and policy.planner.ps_capacity(1) == 45.0


def test_a_ps_that_served_its_workers_push_less_15_percent_is_judged():
    """At the bound: one K80 pushing 8.5 steps/s served 10 (8.5 is 85% of 10) is a verdict,
    and it kept up: its rate counts."""
    cluster, policy = _k80_run()
    _reporting(cluster, "w-0", "k80", [(T0, 0), (T0 + 10, 85)])
    _ps_window(cluster, T0 + 10, step=0, updates=40, steps_per_s=10.0)
    policy.observe(cluster.monitor.events)
    assert policy.planner.rate("k80") == 8.5 and not policy._ps_bottleneck


def test_the_workers_pushing_are_those_reporting_within_10_s_and_still_there():
    """A worker gone before the window is not counted, one whose last report is exactly 10 s
    old is; where none reported within 10 s there is no verdict and the rates wait."""
    cluster, policy = _k80_run()
    _reporting(cluster, "w-1", "k80", [(T0, 0), (T0 + 10, 60)])
    cluster.add("preempted", T0 + 12, worker="w-1", role="worker")
    _reporting(cluster, "w-0", "k80", [(T0, 0), (T0 + 10, 60)])
    _ps_window(cluster, T0 + 20, step=0, updates=40, steps_per_s=6.0)
    policy.observe(cluster.monitor.events)
    assert policy.planner.rate("k80") == 6.0 and policy.planner.ps_capacity(1) == 45.0
    stale, policy = _k80_run()
    _reporting(stale, "w-0", "k80", [(T0, 0), (T0 + 10, 60)])
    _ps_window(stale, T0 + 30, step=0, updates=40, steps_per_s=6.0)
    policy.observe(stale.monitor.events)
    assert policy.planner.rate("k80") == 4.56


def test_a_span_is_40_steps_with_the_same_workers_each_span_measured_alone():
    """Two bottleneck spans of one K80, at 1 and 3 steps/s: the PS's capacity is the upper
    median, 3, each span's rate its own steps over its own seconds. 30 steps with one worker
    and 20 with two are no span."""
    cluster, policy = _k80_run()
    _reporting(cluster, "w-0", "k80", [(T0, 0), (T0 + 10, 30)])  # 3 steps/s
    _ps_window(cluster, T0 + 10, step=0, updates=40, steps_per_s=1.0)
    _ps_window(cluster, T0 + 10, step=0, updates=40, steps_per_s=3.0)
    policy.observe(cluster.monitor.events)
    assert policy._ps_bottleneck and policy.planner.ps_capacity(1) == 3.0
    two, policy = _k80_run()
    _reporting(two, "w-0", "k80", [(T0, 0), (T0 + 10, 60)])
    _ps_window(two, T0 + 10, step=0, updates=30, steps_per_s=6.0)
    _reporting(two, "w-1", "k80", [(T0 + 10, 0)])
    _ps_window(two, T0 + 10, step=0, updates=20, steps_per_s=6.0)
    policy.observe(two.monitor.events)
    assert policy.planner.ps_capacity(1) == 45.0 and policy._served == {}


def test_a_worker_in_a_zone_the_planner_does_not_price_pushes_its_types_rate():
    """A K80 in a zone the planner cannot buy in would push its type's 4.56 steps/s: served
    2, the PS is the bottleneck."""
    cluster, policy = _k80_run()
    _od_vm(cluster, "w-0", "k80", T0, zone="europe-west4-a")
    for t, local in ((T0, 0), (T0 + 10, 20)):
        cluster.add("worker-metrics", t, worker="w-0", local_step=local)
    _ps_window(cluster, T0 + 10, step=0, updates=40, steps_per_s=2.0)
    policy.observe(cluster.monitor.events)
    assert policy._ps_bottleneck and policy.planner.ps_capacity(1) == 2.0


def test_the_ps_is_judged_against_fewer_workers_served_grown_in_proportion():
    """Two K80s were served 10 and 11 steps/s (the upper median, 11, counts): four workers
    (two of them P100s priced at 1 step/s) would be served 22. Served 18 and 17, the PS is the
    bottleneck; 20 is within 15% of 22. The windows of four do not make the measure of four
    fewer: their rate is still judged against two's."""
    cluster = RecordingCluster({"k80": 2, "p100": 2})
    planner = Planner([K80, P100], 0.19, steps_per_s={"k80": 1.0, "p100": 1.0})
    policy = TransientPolicy(cluster, "cost-per-step", planner=planner)
    cluster.add("train-started", T0, run="r", steps=64_000)
    for name in ("w-0", "w-1"):
        _od_vm(cluster, name, "k80", T0, zone=K80.zone)
    for name in ("w-2", "w-3"):
        _od_vm(cluster, name, "p100", T0 + 20, zone=P100.zone)
    for name in ("w-0", "w-1"):
        cluster.add("worker-metrics", T0, worker=name, local_step=0)
    local = dict.fromkeys(["w-0", "w-1", "w-2", "w-3"], 0)
    verdicts = []
    for t, pushing, served in (
        (T0 + 10, 5.0, 10.0),
        (T0 + 20, 5.5, 11.0),
        (T0 + 30, 4.5, 18.0),  # the P100s pushing too, from their first reports at T0 + 20
        (T0 + 40, 4.5, 17.0),
        (T0 + 50, 5.0, 20.0),
    ):
        for name in ("w-0", "w-1", "w-2", "w-3") if t > T0 + 20 else ("w-0", "w-1"):
            local[name] += round(pushing * 10)
            cluster.add("worker-metrics", t, worker=name, local_step=local[name])
        _ps_window(cluster, t, step=0, updates=40, steps_per_s=served)
        if t == T0 + 20:
            for name in ("w-2", "w-3"):
                cluster.add("worker-metrics", t, worker=name, local_step=0)
        policy.observe(cluster.monitor.events)
        verdicts.append(policy._ps_bottleneck)
    assert verdicts == [False, False, True, True, False]


def test_revocations_count_spot_vms_only_and_exposure_the_time_they_ran():
    """A VM revoked while it booted is a revocation with no exposure and tells no start-up; one
    whose events do not say Spot is Spot; one revoked half a second after it ran was exposed
    half a second; an on-demand VM stopped is no revocation; a VM deleted after its revocation
    counts nothing more."""
    cluster, policy = _k80_run()
    prior = policy.planner.hazard_per_h(K80)
    cluster.add("requested", T0, worker="w-0", role="worker", gpu="k80", zone=K80.zone)
    cluster.add("preempted", T0 + 50, worker="w-0", role="worker")
    cluster.add("replacement-requested", T0 + 50, worker="w-0", role="worker")
    _od_vm(cluster, "w-1", "k80", T0, zone=K80.zone)
    cluster.add("preempted", T0 + 0.5, worker="w-1", role="worker")
    cluster.add("deleted", T0 + 1, worker="w-1", role="worker")
    _od_vm(cluster, "w-2", "k80", T0, zone=K80.zone, spot=False)
    cluster.add("preempted", T0, worker="w-2", role="worker")
    policy.observe(cluster.monitor.events)
    expected = (prior * PRIOR_HOURS + 2) / (PRIOR_HOURS + 0.5 / 3600)
    assert policy.planner.hazard_per_h(K80) == pytest.approx(expected, rel=1e-12)
    assert policy.planner.startup_s == policy.planner.prior_startup_s


def test_a_workers_reports_its_first_trains_it_from_and_later_ones_give_its_rate():
    """A first report without a local step is step 0; the next, 10 s and 100 steps later,
    pushes 10 steps/s. A report at the same time as the last and one from a worker the log
    never showed are harmless. The worker's place trained from its first report, not its last."""
    cluster, policy = _k80_run()
    t = T0 + 100
    _od_vm(cluster, "w-0", "k80", T0, zone=K80.zone)
    cluster.add("worker-metrics", t + FIRST_REPORT_S, worker="w-0")
    cluster.add("worker-metrics", t + 10 + FIRST_REPORT_S, worker="w-0", local_step=100)
    _ps_window(cluster, t + 10 + FIRST_REPORT_S, step=0, updates=40, steps_per_s=10.0)
    cluster.add("worker-metrics", t + 10 + FIRST_REPORT_S, worker="w-0", local_step=120)
    cluster.add("worker-metrics", t + 20, worker="w-9", local_step=5)
    policy.observe(cluster.monitor.events)
    assert policy.planner.rate("k80") == 10.0
    policy.observe_places(now=t + 200)
    assert policy.planner._held[("k80", K80.zone)] == (
        pytest.approx(200 / 3600),
        pytest.approx(200 / 3600),
    )


def test_replacements_asked_for_together_each_hold_a_place_from_their_request():
    """Two replacements asked for before either VM's request: both places are held from
    their requests (200 s in all, none trained, both revoked while booting)."""
    cluster, policy = _k80_run()
    for lost in ("w-0", "w-1"):
        cluster.add("replacement-requested", T0, worker=lost, role="worker")
    for name in ("r-0", "r-1"):
        cluster.add("requested", T0, worker=name, role="worker", gpu="k80", zone=K80.zone)
        cluster.add("preempted", T0 + 100, worker=name, role="worker")
    policy.observe(cluster.monitor.events)
    policy.observe_places(now=T0 + 300)
    held, trained = policy.planner._held[("k80", K80.zone)]
    assert (held * 3600, trained) == (pytest.approx(200.0), 0.0)


def test_a_first_workers_joined_event_without_a_role_is_a_workers():
    """The start-up of a worker asked for before the run counts from its ``joined`` event,
    which may not say its role: asked at 0, joined at 90, trained when the run started: 90 s."""
    cluster = RecordingCluster({"k80": 1})
    policy = _policy(cluster, "cost-per-step")
    fields = {"role": "worker", "gpu": "k80", "zone": K80.zone}
    cluster.add("requested", T0, worker="w-0", **fields)
    cluster.add("running", T0 + 60, worker="w-0", **fields)
    cluster.add("joined", T0 + 90, worker="w-0")
    cluster.add("train-started", T0 + 400, run="r", steps=64_000)
    cluster.add("worker-metrics", T0 + 400 + FIRST_REPORT_S, worker="w-0", local_step=0)
    policy.observe(cluster.monitor.events)
    assert policy.planner.startup_s == 90.0


def test_a_first_report_before_the_log_says_the_run_started_tells_no_start_up():
    """A worker asked for and joined before the run whose trainer reports before the log's
    ``train-started`` (a late one) tells nothing of what a start-up takes."""
    cluster = RecordingCluster({"k80": 1})
    policy = _policy(cluster, "cost-per-step")
    _od_vm(cluster, "w-0", "k80", T0, zone=K80.zone)
    cluster.add("joined", T0 + 90, worker="w-0", role="worker")
    cluster.add("worker-metrics", T0 + 400, worker="w-0", local_step=0)
    cluster.add("train-started", T0 + 401, run="r", steps=64_000)
    policy.observe(cluster.monitor.events)
    assert policy.planner.startup_s == policy.planner.prior_startup_s


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


@pytest.mark.parametrize(
    "text, goal",
    [
        ("deadline:2h", ("deadline", {"deadline": "2h"})),
        (" Budget: 20 ", ("budget", {"budget": 20.0})),
        ("cost-per-step", ("cost-per-step", {})),
        ("OFF", (None, {})),
        ("none", (None, {})),
        ("stop", (None, {})),
    ],
)
def test_a_goal_is_read_as_typed(text: str, goal: tuple[str | None, dict[str, Any]]):
    """``GOAL[:VALUE]`` as the magic and the CLI take it, any case, spaces around."""
    assert parse_goal(text) == goal


@pytest.mark.parametrize("text", ["deadline", "budget:lots", "budget", "cost-per-step:1", "fast"])
def test_a_goal_typed_wrong_is_refused_with_how_to_write_one(text: str):
    """A goal without its value, with a bad one, or unknown: the user is told what to write."""
    advice = (
        f"goal {text!r}: write deadline:DURATION (e.g. deadline:2h), budget:DOLLARS (e.g. "
        "budget:20), cost-per-step, or off."
    )
    with pytest.raises(ValueError, match=re.escape(advice)):
        parse_goal(text)


class _Loop:
    """The cluster's event loop as the policy uses it: callbacks, kept to be run by the test."""

    def __init__(self) -> None:
        self.callbacks: list[tuple[Any, tuple[Any, ...]]] = []

    def add_callback(self, f: Any, *args: Any) -> None:
        self.callbacks.append((f, args))


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
    assert stopped == {
        "kind": "policy",
        "goal": None,
        "deadline_s": None,
        "budget": None,
        "history": None,
        "remembered_h": None,
    }
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
        {
            "kind": "policy",
            "goal": None,
            "deadline_s": None,
            "budget": None,
            "history": None,
            "remembered_h": None,
        },
    ]


def test_on_demand_workers_hours_do_not_calm_the_spot_hazard():
    """A storm pushes the policy to on-demand workers: their hours must not count as Spot
    exposure (the planner keeps one per GPU type and zone), or the Spot P100 looks calm again
    and the policy flaps back to it. Four Spot P100 revoked after 10 minutes; four on-demand ones
    that ran two hours beside them change nothing."""
    cluster = RecordingCluster({"p100": 4})
    policy = TransientPolicy(cluster, "cost-per-step", planner=Planner([P100], 0.19))
    fields = {"role": "worker", "gpu": "p100", "zone": "us-central1-a"}
    for i in range(4):
        cluster.add("requested", T0, worker=f"w-{i}", spot=True, **fields)
        cluster.add("running", T0, worker=f"w-{i}", spot=True, **fields)
        cluster.add("preempted", T0 + 600, worker=f"w-{i}", spot=True, **fields)
    policy.observe(cluster.monitor.events)
    storm = policy.planner.hazard_per_h(P100)
    assert storm == pytest.approx(3.45, abs=0.01)
    for i in range(4, 8):
        cluster.add("requested", T0, worker=f"w-{i}", spot=False, **fields)
        cluster.add("running", T0, worker=f"w-{i}", spot=False, **fields)
        cluster.add("deleted", T0 + 7200, worker=f"w-{i}", spot=False, **fields)
    policy.observe(cluster.monitor.events)
    assert policy.planner.hazard_per_h(P100) == pytest.approx(storm)
    assert policy.planner.observations().kinds[("p100", "us-central1-a")][:2] == (
        4.0,
        pytest.approx(4 * 600 / 3600),
    )


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
