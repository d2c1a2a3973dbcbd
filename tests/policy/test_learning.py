"""Tests for transient_nb.policy.learning: what the policy reads from the event log and keeps."""

from __future__ import annotations

import asyncio
import math
import re
import time
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest

from tests.policy.policy_helpers import (
    K80,
    P100,
    T0,
    RecordingCluster,
    ZonedCluster,
    _estimate,
    _k80_run,
    _od_vm,
    _outdone,
    _policy,
    _ps_window,
    _reporting,
    _spot_p100_policy,
    _stormy_central,
    _vm,
)
from transient_nb.policy.adaptive import TransientPolicy
from transient_nb.policy.learning import FIRST_REPORT_S
from transient_nb.policy.planner import PRIOR_HOURS, Kind, Plan, Planner


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


def test_workers_to_come_go_where_the_cluster_places_their_type_first():
    """New workers go to the cluster's zone, or the zone its replacement policy prefers for
    the type; as the kind there that runs as asked (Spot or on demand), else the type's Spot kind
    there, else the type's first kind that runs as asked. A live VM counts as the kind of its
    zone, Spot or not."""
    kc, ke = K80, Kind("k80", "us-east1-c", True, 0.256)
    pc, pwo = P100, Kind("p100", "us-west1-b", False, 1.46)
    cluster = RecordingCluster({"k80": 3, "p100": 1})
    cluster.zone = "us-east1-c"
    cluster.placement = SimpleNamespace(preferred_zones={"p100": "us-west1-b"})
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
