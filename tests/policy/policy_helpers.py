"""Helpers of the policy's tests: a cluster that records what the policy asks of it, and event
streams (storms, runs, workers) to feed the policy."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

from transient_nb.policy.adaptive import TransientPolicy
from transient_nb.policy.planner import Configuration, Estimate, Kind, Plan, Planner

# Kinds of worker of one zone at the paper-2019 prices (Spot, and _OD on demand), and a PS's price.
K80 = Kind("k80", "us-central1-a", True, 0.256)
V100 = Kind("v100", "us-central1-a", True, 0.861)
P100 = Kind("p100", "us-central1-a", True, 0.43)
K80_OD = Kind("k80", "us-central1-a", False, 0.723)
V100_OD = Kind("v100", "us-central1-a", False, 2.144)
P100_OD = Kind("p100", "us-central1-a", False, 1.46)
PS = 0.143


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


V100_OD = Kind("v100", "us-central1-a", False, 2.48)


K80_OD = Kind("k80", "us-central1-a", False, 0.45)


P100_OD = Kind("p100", "us-central1-a", False, 1.46)


def _saturate(cluster: RecordingCluster, gpu: str, served: float, at: float) -> None:
    """8 ``gpu`` workers pushing for 10 s, and the PS's metrics: ``served`` global steps/s."""
    for i in range(8):
        _vm(cluster, f"w-{i}", gpu, at)
        for t in (at, at + 10):  # each its share of what the PS serves
            local = round(served / 8 * (t - at))
            cluster.add("worker-metrics", t, worker=f"w-{i}", local_step=local, step=0)
    _ps_window(cluster, at + 10, step=10, active_workers=8, updates=40, steps_per_s=served)


def _zoned(prices: tuple[float, float]) -> tuple[RecordingCluster, TransientPolicy, Kind, Kind]:
    """Four t4 workers in us-central1-a, a run under way, and a fallback zone the cluster may use."""
    from transient_nb.policy.placement import ReplacementPolicy

    home = Kind("t4", "us-central1-a", True, prices[0])
    other = Kind("t4", "us-east1-c", True, prices[1])
    cluster = RecordingCluster({"t4": 4})
    cluster.zone = "us-central1-a"
    cluster.placement = ReplacementPolicy(
        "t4", "us-central1-a", True, fallback_zones=["us-east1-c"]
    )
    policy = TransientPolicy(cluster, "cost-per-step", planner=Planner([home, other], 0.143))
    now = time.time()
    cluster.add("train-started", now - 7200, run="r", steps=64_000)
    for i in range(4):
        _vm(cluster, f"w-{i}", "t4", now - 3600)
    return cluster, policy, home, other


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


class ZonedCluster(RecordingCluster):
    """A cluster that may place workers in ``zones``: by default us-central1-a (its PS's) and
    us-east1-c."""

    def __init__(self, mix: dict[str, int], zones: Sequence[str] = ("us-central1-a", "us-east1-c")):
        super().__init__(mix)
        self.ps_move_zone = None
        self.moves: list[tuple[str, str]] = []
        self.preferred: dict[str, str] = {}
        self.placement = SimpleNamespace(
            zones=lambda: list(zones),
            prefer_zone=lambda gpu, zone: self.preferred.__setitem__(gpu, zone),
        )

    def move_ps(self, zone: str, reason: str = "") -> None:
        self.moves.append((zone, reason))


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


def _outdone(plan: Plan) -> Plan:
    """``plan`` with its choice ten times as dear: a plan any other region's would beat."""
    return replace(plan, chosen=replace(plan.chosen, cost=10 * plan.chosen.cost))


def _deadline_policy(cluster: RecordingCluster, **kw: Any) -> TransientPolicy:
    """A deadline of 0.52 h for four P100 workers at most (Spot or on demand), no margin."""
    return TransientPolicy(
        cluster,
        "deadline",
        deadline="0.52h",
        max_workers=4,
        margin=0.0,
        planner=Planner([P100, P100_OD], 0.19),
        **kw,
    )


def _spot_p100_policy(cluster: RecordingCluster) -> TransientPolicy:
    return TransientPolicy(cluster, "cost-per-step", planner=Planner([P100], 0.19), max_workers=4)


def _od_vm(cluster: RecordingCluster, name: str, gpu: str, t: float, **fields: Any) -> None:
    """A worker's VM asked for and running, with ``fields`` (zone, spot) as its events give."""
    for kind in ("requested", "running"):
        cluster.add(kind, t, worker=name, role="worker", gpu=gpu, **fields)


def _estimate(n: int, eta_s: float, cost: float, liveput: float = 1.0) -> Estimate:
    return Estimate(Configuration.of({K80: n}), liveput, 1.0, eta_s, cost, steps=100.0)


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


class _Loop:
    """The cluster's event loop as the policy uses it: callbacks, kept to be run by the test."""

    def __init__(self) -> None:
        self.callbacks: list[tuple[Any, tuple[Any, ...]]] = []

    def add_callback(self, f: Any, *args: Any) -> None:
        self.callbacks.append((f, args))
