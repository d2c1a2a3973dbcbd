"""Tests for transient_nb.deploy.cluster: TransientCluster on the local backend, with real processes.

Cluster tests are plain synchronous tests with Dask's ``cleanup`` fixture (it checks that no
thread, loop or instance leaks), except the trace replay, which runs the cluster asynchronously
under ``gen_test``. Every cluster starts its VMs at once (``provisioning_delay=0``) with short
notices so that the suite stays fast.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
from pathlib import Path
from typing import Any

import dask.config
import pytest
import yaml
from distributed import Client
from distributed.core import Status, rpc
from distributed.utils_test import gen_test

from tests.conftest import (
    alive,
    child_pids,
    index_of,
    kinds,
    of_kind,
    vm_pids,
    wait_for,
    wait_for_sync,
)
from transient_nb import TransientCluster
from transient_nb.catalog.prices import PriceCatalog
from transient_nb.deploy import registry
from transient_nb.eventlog.folds import vm_states
from transient_nb.eventlog.records import read_run_record
from transient_nb.eventlog.vocabulary import CONTROL_TOPIC

Events = list[dict[str, Any]]


# -- helpers ------------------------------------------------------------------------------------
def snapshot(cluster: TransientCluster) -> Events:
    return list(cluster.monitor.events)


def as_json(events: Events) -> Events:
    """Events as the run record stores them."""
    return json.loads(json.dumps(events, default=str))


def replacement_of(events: Events, name: str) -> tuple[str | None, int]:
    """The VM requested to replace ``name`` (same slot, after its replacement-requested)."""
    i = index_of(events, "replacement-requested", worker=name)
    if i < 0:
        return None, -1
    j = index_of(events, "requested", i + 1, slot=events[i]["slot"], role="worker")
    return (events[j]["worker"], j) if j >= 0 else (None, -1)


def replaced(events: Events, name: str) -> bool:
    """``name`` was preempted, then a replacement was asked for, then the replacement joined.

    A replacement can itself be preempted before it joins (lifetimes start when a VM runs); its
    own replacement then stands in for both.
    """
    i_pre = index_of(events, "preempted", worker=name)
    i_rr = index_of(events, "replacement-requested", max(i_pre, 0), worker=name)
    new, i_req = replacement_of(events, name)
    if new is None or not 0 <= i_pre < i_rr < i_req:
        return False
    if index_of(events, "joined", i_req, worker=new) > i_req:
        return True
    return index_of(events, "preempted", i_req, worker=new) > i_req and replaced(events, new)


def preempted_workers(events: Events) -> list[str]:
    return [e["worker"] for e in of_kind(events, "preempted", role="worker")]


def worker_states(cluster: TransientCluster) -> dict[str, str]:
    """Lifecycle state of every GPU worker VM that is not gone."""
    df = vm_states(snapshot(cluster))
    if df.empty:
        return {}
    df = df[(df["role"] == "worker") & ~df["state"].isin(["preempted", "deleted"])]
    return dict(df["state"])


def n_joined(cluster: TransientCluster) -> int:
    return sum(1 for s in worker_states(cluster).values() if s == "joined")


def recompute_costs(events: Events, time_scale: float, minimum_s: float = 60.0) -> tuple:
    """Per-second billing, done by hand: running until preempted/deleted (else closed)."""
    closed = of_kind(events, "closed")[-1]["time"]
    total = total_od = 0.0
    seconds: dict[str, float] = {}
    for req in of_kind(events, "requested"):
        name = req["worker"]
        i_run = index_of(events, "running", worker=name)
        if i_run < 0:
            continue
        ends = [
            i
            for i in range(i_run, len(events))
            if events[i].get("worker") == name and events[i]["kind"] in ("preempted", "deleted")
        ]
        end = events[ends[0]]["time"] if ends else closed
        s = (end - events[i_run]["time"]) * time_scale
        seconds[name] = s
        total += max(minimum_s, s) * req["price"] / 3600
        total_od += max(minimum_s, s) * req["price_on_demand"] / 3600
    return total, total_od, seconds


# -- the main path: preemptions, replacements, costs, run record, clean close --------------------
@pytest.mark.slow
def test_preemptions_are_replaced_billed_and_recorded(cleanup: None) -> None:
    before = child_pids()
    seen: set[int] = set()
    # time_scale=30: 120 simulated seconds of mean lifetime are 4 wall seconds; 30 s of notice 1 s.
    with TransientCluster(
        workers=3,
        preemption="exp:mean=120s",
        time_scale=30,
        notice="30s",
        provisioning_delay=0,
        seed=7,
        name="main-path",
    ) as cluster:
        entry = registry.lookup("main-path")
        assert entry["scheduler_address"] == cluster.scheduler_address
        assert entry["run_record"] == cluster.run_record and entry["stale"] is False

        def three_preempted() -> bool:
            seen.update(vm_pids(cluster))
            return len(preempted_workers(snapshot(cluster))) >= 3

        wait_for_sync(three_preempted, timeout=90)
        # Quiesce: no new lifetimes; preemptions already under way finish and are replaced.
        cluster.loop.add_callback(cluster.simulator.stop)

        def all_replaced() -> bool:
            seen.update(vm_pids(cluster))
            events = snapshot(cluster)
            return n_joined(cluster) == 3 and all(
                replaced(events, n) for n in preempted_workers(events)
            )

        wait_for_sync(all_replaced, timeout=90)
        events = snapshot(cluster)
        live = cluster.events()
        assert list(live["kind"]) == kinds(events)
        assert len(cluster.workers) == 4  # three GPU workers and the PS host
        report_while_running = cluster.cost()
        assert report_while_running.rate == pytest.approx(3 * 0.22 + 0.19)

    # -- event order, per preempted worker
    preempted = preempted_workers(events)
    assert len(preempted) >= 3
    assert "ps-0" not in preempted
    for name in preempted:
        mine = kinds(events, worker=name)
        assert mine[:3] == ["requested", "provisioning", "running"], name
        assert mine.index("notice") < mine.index("preempted"), name
        e = of_kind(events, "preempted", worker=name)[0]
        assert e["notice"] is True and e["source"] == "simulator"
        assert replaced(events, name), name
        # A worker that had joined before its notice drained and left before it was killed. One
        # that joined during its notice gets it late (and may have too little of it left to go
        # before the kill): it still leaves, and the late-notice test covers its drain.
        if "joined" in mine and mine.index("joined") < mine.index("notice"):
            assert mine.index("notice") < mine.index("left") < mine.index("preempted"), name
        elif "joined" in mine:
            assert "left" in mine, name
    requested = of_kind(events, "replacement-requested")
    assert sorted(e["worker"] for e in requested) == sorted(preempted)

    # -- the run record on disk holds the same events, closed included
    record = read_run_record(cluster.run_record)
    assert record[: len(events)] == as_json(events)
    assert record[0]["kind"] == "started" and record[-1]["kind"] == "closed"
    assert record[0]["time_scale"] == 30 and record[0]["preemption"] == "exp:mean=120s"

    # -- dollars: the cost meter equals per-second billing recomputed from the record
    report = cluster.cost()
    total, total_od, seconds = recompute_costs(record, time_scale=30)
    assert report.total == pytest.approx(total, rel=1e-9)
    assert report.total_on_demand == pytest.approx(total_od, rel=1e-9)
    for name, s in seconds.items():
        assert report.per_vm.loc[name, "seconds"] == pytest.approx(s, rel=1e-9), name
    ps = report.per_vm.loc["ps-0"]
    assert (ps["role"], ps["price"], ps["price_on_demand"]) == ("ps", 0.19, 0.19)
    price = PriceCatalog.load("gce-2025").worker_price("t4", "n1-standard-8", "us-central1-a")
    workers = report.per_vm[report.per_vm["role"] == "worker"]
    assert workers["price"].to_list() == pytest.approx([price.spot] * len(workers))
    assert 0.5 < report.saved_fraction < 0.8
    assert report.rate == 0  # everything was deleted at close

    # -- closing left nothing behind
    assert seen, "no VM process was ever seen"
    wait_for_sync(lambda: not alive(seen), timeout=30, message=f"still alive: {alive(seen)}")
    wait_for_sync(lambda: not (child_pids() - before), timeout=30)
    with pytest.raises(KeyError):
        registry.lookup("main-path")
    assert of_kind(record, "deleted", worker="ps-0")


# -- manual preemption, drain hooks, processes killed from outside, worker environment ---------
@pytest.mark.slow
def test_manual_preemption_drains_and_replaces(
    cleanup: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Dask's nanny would give workers this; the local backend must remove it even when the
    # parent has it set.
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "65536")
    marks = tmp_path / "marks"
    marks.mkdir()

    def install_hook(folder: str, dask_worker: Any) -> str:
        import os
        import time

        from transient_nb.eventlog.vocabulary import TOPIC
        from transient_nb.worker import drain as agent

        name = json.loads(os.environ["TRANSIENT_NB_VM"])["name"]

        def hook(deadline: float) -> None:
            with open(os.path.join(folder, name), "w") as f:
                f.write(repr(time.time()))
            dask_worker.log_event(TOPIC, {"kind": "hook-ran", "time": time.time()})

        agent.register_drain_hook(hook)
        return name

    with TransientCluster(
        workers=2, notice="3s", provisioning_delay=0, seed=3, name="manual"
    ) as cluster, Client(cluster) as client:  # fmt: skip
        cluster.wait_for_workers(timeout=60)
        env = client.run(lambda: os.environ.get("MALLOC_TRIM_THRESHOLD_"))
        assert len(env) == 3 and set(env.values()) == {None}
        env = client.run(lambda: os.environ.get("MALLOC_TRIM_THRESHOLD_"), nanny=True)
        assert set(env.values()) == {None}
        assert set(client.run(lambda: os.environ["OMP_NUM_THREADS"]).values()) == {"1"}
        assert sorted(client.run(install_hook, str(marks)).values()) == ["ps-0", "w-0", "w-1"]

        # -- by name, with notice: notice -> hook -> drained -> left -> preempted -> replaced
        assert cluster.preempt("w-0") == ["w-0"]
        wait_for_sync(lambda: replaced(snapshot(cluster), "w-0"), timeout=60)
        events = snapshot(cluster)
        order = [
            index_of(events, "notice", worker="w-0"),
            index_of(events, "hook-ran", worker="w-0"),
            index_of(events, "drained", worker="w-0"),
            index_of(events, "left", worker="w-0"),
            index_of(events, "preempted", worker="w-0"),
            index_of(events, "replacement-requested", worker="w-0"),
        ]
        assert -1 not in order and order == sorted(order), order
        drained = of_kind(events, "drained", worker="w-0")[0]
        assert drained["hooks"] == 1 and list(drained["errors"]) == []
        hook_time = float((marks / "w-0").read_text())
        assert hook_time < of_kind(events, "preempted", worker="w-0")[0]["time"]
        assert of_kind(events, "preempted", worker="w-0")[0]["source"] == "manual"
        wait_for_sync(lambda: n_joined(cluster) == 2, timeout=60)

        # -- by count, without notice: no notice, no drain, killed, replaced
        client.run(install_hook, str(marks))  # the replacement gets the hook too
        (victim,) = cluster.preempt(1, notice=False)
        assert victim in ("w-1", "w-2")
        wait_for_sync(lambda: replaced(snapshot(cluster), victim), timeout=60)
        events = snapshot(cluster)
        assert kinds(events, victim).count("notice") == 0
        assert of_kind(events, "drained", worker=victim) == []
        assert not (marks / victim).exists()
        assert of_kind(events, "preempted", worker=victim)[0]["notice"] is False
        wait_for_sync(lambda: n_joined(cluster) == 2, timeout=60)

        # -- a VM killed from outside (a crash) is noticed and replaced
        other = sorted(worker_states(cluster))[0]
        os.killpg(cluster.workers[other].pid, signal.SIGKILL)
        wait_for_sync(lambda: replaced(snapshot(cluster), other), timeout=60)
        lost = of_kind(snapshot(cluster), "preempted", worker=other)
        assert len(lost) == 1 and lost[0]["source"] == "lost" and lost[0]["notice"] is False

        # -- bad targets: clear errors, nothing preempted
        n_before = len(preempted_workers(snapshot(cluster)))
        for target, match in [
            ("w-99", r"No preemptible worker named 'w-99': use one of w-"),
            ("w-0", "No preemptible worker named 'w-0'"),  # already gone
            ("ps-0", "No preemptible worker named 'ps-0'"),
            (["w-99"], "'w-99'"),
            (0, "at least 1"),
            (-2, "at least 1"),
            (True, "give a number of workers or worker names"),
            (5, r"only 2 worker\(s\) can be preempted now"),
        ]:
            with pytest.raises(ValueError, match=match):
                cluster.preempt(target)
        for bad in (-1, 2.5, True):
            with pytest.raises(ValueError, match="whole number"):
                cluster.scale(bad)
        with pytest.raises(ValueError, match="not memory or cores"):
            cluster.scale(memory="4GB")
        assert len(preempted_workers(snapshot(cluster))) == n_before
        assert "ps-0" in cluster.workers
    record = read_run_record(cluster.run_record)
    assert of_kind(record, "preempted", worker="ps-0") == []


# -- scaling by hand while the simulator preempts -----------------------------------------------
@pytest.mark.slow
def test_a_worker_that_joins_during_its_notice_still_drains(cleanup: None) -> None:
    """A notice given while the VM boots reaches its worker once it joins (as GCE's metadata
    server would): the worker drains and leaves before the VM stops, not killed mid-step."""
    with TransientCluster(
        workers=1, notice="60s", provisioning_delay=0, name="late-join"
    ) as cluster:
        wait_for_sync(lambda: "running" in kinds(snapshot(cluster), worker="w-0"), timeout=60)
        assert "joined" not in kinds(snapshot(cluster), worker="w-0")  # still importing Dask
        cluster.preempt("w-0")
        wait_for_sync(lambda: "preempted" in kinds(snapshot(cluster), worker="w-0"), timeout=60)
        mine = kinds(snapshot(cluster), worker="w-0")
    assert mine.index("notice") < mine.index("joined") < mine.index("left")
    assert mine.index("left") < mine.index("preempted")
    # Gone once drained: far sooner than the 60 s notice.
    events = of_kind(snapshot(cluster), "preempted", worker="w-0")
    notice = of_kind(snapshot(cluster), "notice", worker="w-0")[0]
    assert events[0]["time"] - notice["time"] < 30


def test_scale_down_gives_back_the_worker_likeliest_to_be_revoked(cleanup: None) -> None:
    """Selective revocation: of two working VMs, the one near GCE's 24 h limit goes (the paper's
    curve gives it even odds of revocation within the hour), not the newest (7.8%)."""
    with TransientCluster(workers=2, provisioning_delay=0, name="give-back") as cluster:
        cluster.wait_for_workers(2, timeout=120)
        old = cluster.workers["w-0"]
        assert old.running_since is not None
        old.running_since -= 22.5 * 3600  # as if it had run 22.5 h
        cluster.scale(1)
        wait_for_sync(lambda: "deleted" in kinds(snapshot(cluster), worker="w-0"), timeout=60)
        events = snapshot(cluster)
        (given,) = of_kind(events, "give-back")
        assert given["worker"] == "w-0" and given["working"] is True
        assert given["p_revoked_1h"] == pytest.approx(0.505, abs=0.005)
        assert "deleted" not in kinds(events, worker="w-1")
        assert n_joined(cluster) == 1


def on_demand_held(cluster: TransientCluster) -> list[str]:
    """Names of the on-demand GPU worker VMs that are not gone."""
    df = vm_states(snapshot(cluster))
    if df.empty:
        return []
    df = df[(df["role"] == "worker") & ~df["state"].isin(["preempted", "deleted"])]
    return [str(n) for n in df.index if not cluster.workers[str(n)].spec.spot]


def test_scale_keeps_a_share_on_demand_that_is_never_revoked(cleanup: None) -> None:
    """``scale(on_demand=1)`` swaps a Spot worker for an on-demand one; under a storm that takes
    Spot workers every few seconds the on-demand one is never revoked and is billed at its price;
    ``on_demand=0`` swaps it back. Bad counts are refused before anything changes."""
    with TransientCluster(
        workers=2,
        provisioning_delay=0,
        preemption="exp:mean=4s",
        notice="1s",
        seed=5,
        name="on-demand",
    ) as cluster:
        gpu = cluster.gpu
        cluster.wait_for_workers(2, timeout=120)
        for bad, words in (
            (3, f"3 {gpu} on demand, but the mix keeps 2 {gpu}"),
            ({"k80": 1}, "1 k80 on demand, but the mix keeps 0 k80"),
            (-1, f"{gpu}=-1 is not a number of workers"),
        ):
            with pytest.raises(ValueError, match=words):
                cluster.scale(2, on_demand=bad)
        price = cluster.catalog.worker_price(gpu, cluster.machine_type, cluster.zone)
        ps = cluster.catalog.machine_price(cluster.ps_machine_type, cluster.zone).rate(False)
        # Two Spot workers fit this limit; one of them on demand does not.
        unlimited = cluster.limits
        cluster.limits = dataclasses.replace(
            unlimited, max_hourly_cost=2 * price.rate(True) + ps + 0.01
        )
        with pytest.raises(ValueError, match="above max_hourly_cost"):
            cluster.scale(2, on_demand=1)
        assert cluster.on_demand == {} and cluster.mix == {gpu: 2}
        cluster.limits = unlimited
        # A type never given a count has none to be brought to (an on_demand_fallback VM of it
        # stays); once given one, it keeps one, 0 included.
        assert cluster._scaled_on_demand(None, {gpu: 2}, None) == {}
        assert cluster._scaled_on_demand({}, {gpu: 2}, None) == {}

        start = len(snapshot(cluster))
        cluster.scale(2, on_demand=1)
        assert cluster.on_demand == {gpu: 1}
        (dear,) = wait_for_sync(
            lambda: (
                (held := on_demand_held(cluster))
                and worker_states(cluster).get(held[0]) == "joined"
                and held
            ),
            timeout=90,
        )
        events = snapshot(cluster)
        i_scale = index_of(events, "scale", start, on_demand={gpu: 1})
        i_asked = index_of(events, "requested", start, worker=dear)
        assert 0 < i_scale < i_asked and events[i_asked]["spot"] is False
        assert events[i_asked]["price"] == pytest.approx(price.rate(False))
        # The storm goes on: three Spot workers revoked after the on-demand one joined, not it.
        joined_at = index_of(events, "joined", worker=dear)
        wait_for_sync(
            lambda: len(of_kind(snapshot(cluster)[joined_at:], "preempted")) >= 3, timeout=120
        )
        assert of_kind(snapshot(cluster), "preempted", worker=dear) == []
        assert on_demand_held(cluster) == [dear]  # replacements of Spot workers stay Spot

        back = len(snapshot(cluster))
        cluster.scale(2, on_demand=0)
        wait_for_sync(lambda: "deleted" in kinds(snapshot(cluster), worker=dear), timeout=60)
        (given,) = of_kind(snapshot(cluster)[back:], "give-back", worker=dear)
        assert given["spot"] is False and given["p_revoked_1h"] == 0
        assert index_of(snapshot(cluster), "scale", back, on_demand={}) >= back
        wait_for_sync(lambda: len(worker_states(cluster)) == 2, timeout=60)
        assert on_demand_held(cluster) == [] and cluster.on_demand == {}
        assert cluster._on_demand == {gpu: 0}  # asked for once: kept at 0 from now on


def test_scale_up_and_down_while_preempting(cleanup: None) -> None:
    with TransientCluster(
        workers=1,
        preemption="exp:mean=6s",
        notice="1s",
        provisioning_delay=0,
        seed=11,
        name="scaling",
    ) as cluster:

        def holding(n: int) -> bool:
            """``n`` GPU worker VMs held (booting or working), none being asked for."""
            return len(worker_states(cluster)) == n and "" not in cluster._slots.values()

        def preempted_since(n: int) -> list[str]:
            return [e["worker"] for e in of_kind(snapshot(cluster)[n:], "preempted")]

        cluster.scale(3)
        wait_for_sync(lambda: holding(3), timeout=60)
        i_up = index_of(snapshot(cluster), "scale", workers=3)
        assert i_up > 0
        # The simulator takes workers; replacements keep the new target.
        wait_for_sync(lambda: preempted_since(i_up) and holding(3), timeout=90)
        victim = preempted_since(i_up)[0]
        assert index_of(snapshot(cluster), "replacement-requested", i_up, worker=victim) > 0

        cluster.scale(1)
        wait_for_sync(lambda: holding(1), timeout=60)
        events = snapshot(cluster)
        i_down = index_of(events, "scale", workers=1)
        deleted = [e["worker"] for e in events[i_down:] if e["kind"] == "deleted"]
        assert deleted and "ps-0" not in deleted
        assert all(e["role"] == "worker" for e in of_kind(events, "deleted"))

        # When the simulator takes the survivor, it is replaced up to the new target, not beyond.
        (survivor,) = worker_states(cluster)
        wait_for_sync(lambda: survivor in preempted_since(i_down), timeout=90)
        wait_for_sync(
            lambda: (
                index_of(snapshot(cluster), "replacement-requested", i_down, worker=survivor) > 0
            ),
            timeout=60,
        )
        wait_for_sync(lambda: holding(1) and survivor not in worker_states(cluster), timeout=60)

        # Scale to zero: every GPU worker goes, the PS host stays.
        cluster.scale(0)
        wait_for_sync(lambda: holding(0), timeout=60)
        assert list(cluster.workers) == ["ps-0"]
        wait_for_sync(lambda: vm_states(snapshot(cluster)).loc["ps-0", "state"] == "joined", 60)
        # ... and back up; the cluster closes while they boot.
        cluster.scale(2)
        wait_for_sync(lambda: holding(2), timeout=60)
    record = read_run_record(cluster.run_record)
    assert record[-1]["kind"] == "closed"
    assert kinds(record, "ps-0")[-1] == "deleted"
    assert kinds(record, "ps-0").count("deleted") == 1
    assert of_kind(record, "preempted", worker="ps-0") == []
    # Every VM of the run is gone: preempted or deleted.
    assert vm_states(record)["state"].isin(["preempted", "deleted"]).all()


# -- mixed GPU types: asked for, scaled per type, replaced by type, billed per type --------------
def joined_by_gpu(cluster: TransientCluster) -> dict[str, int]:
    """Joined GPU workers per GPU type, from the VM table the views show."""
    df = vm_states(snapshot(cluster))
    df = df[(df["role"] == "worker") & (df["state"] == "joined")]
    return {str(g): int(n) for g, n in df.groupby("gpu").size().items()}


@pytest.mark.slow
def test_a_mixed_cluster_keeps_its_mix(cleanup: None) -> None:
    with TransientCluster(
        workers={"k80": 1, "v100": 1},
        prices="paper-2019",
        machine_type="n1-standard-8",
        notice="1s",
        provisioning_delay=0,
        seed=3,
        name="mixed",
    ) as cluster:
        # Workers of each type really start: the VM table shows each one's type.
        wait_for_sync(lambda: joined_by_gpu(cluster) == {"k80": 1, "v100": 1}, timeout=60)
        started = of_kind(snapshot(cluster), "started")[0]
        assert started["mix"] == {"k80": 1, "v100": 1} and started["gpu"] == "k80"
        assert cluster.mix == {"k80": 1, "v100": 1}
        assert "workers k80=1,v100=1" in repr(cluster)

        # A plain number is ambiguous for a mixed cluster: refused, nothing asked for.
        with pytest.raises(ValueError, match=r"scale\(3\): this cluster mixes k80=1,v100=1"):
            cluster.scale(3)
        with pytest.raises(ValueError, match=r"Unknown GPU type 't4'"):
            cluster.scale(1, gpu="t4")  # paper-2019 has no T4 price
        assert of_kind(snapshot(cluster), "scale") == []

        # scale(n, gpu=) changes only that type.
        cluster.scale(2, gpu="k80")
        wait_for_sync(lambda: joined_by_gpu(cluster) == {"k80": 2, "v100": 1}, timeout=60)
        assert of_kind(snapshot(cluster), "scale")[-1]["mix"] == {"k80": 2, "v100": 1}

        # A preempted V100 is replaced by a V100, not by the cluster's main type.
        (v100,) = [n for n, vm in cluster.workers.items() if vm.spec.gpu == "v100"]
        cluster.preempt(v100)
        wait_for_sync(lambda: replaced(snapshot(cluster), v100), timeout=60)
        new, _ = replacement_of(snapshot(cluster), v100)
        assert of_kind(snapshot(cluster), "requested", worker=new)[0]["gpu"] == "v100"
        assert of_kind(snapshot(cluster), "replacement-requested", worker=v100)[0]["gpu"] == "v100"
        wait_for_sync(lambda: joined_by_gpu(cluster) == {"k80": 2, "v100": 1}, timeout=60)

        # Down by type; the whole mix at once.
        cluster.scale({"v100": 1})
        wait_for_sync(lambda: joined_by_gpu(cluster) == {"v100": 1}, timeout=60)
        assert cluster.mix == {"k80": 0, "v100": 1}
        cluster.scale(2)  # one type left with workers: a plain number scales it
        wait_for_sync(lambda: joined_by_gpu(cluster) == {"v100": 2}, timeout=60)

        # The cost of each type adds up to the total.
        report = cluster.cost()
        by_gpu = report.by_gpu
        assert set(by_gpu.index) == {"ps", "k80", "v100"}
        assert by_gpu.loc["v100", "vms"] == 3 and by_gpu.loc["k80", "vms"] == 2
        assert by_gpu["cost"].sum() == pytest.approx(report.total)


# -- replacement fallback: stock-outs, fallback zones, capacity exhausted -----------------------
@pytest.mark.slow
def test_stockouts_fall_back_then_run_short(cleanup: None) -> None:
    # Also: configuration precedence, live: the GPU type comes from dask config.
    with dask.config.set({"transient.gpu": "v100"}), TransientCluster(
        workers=2,
        stockouts=["us-central1-a"],
        fallback_zones=["us-central1-b"],
        notice="1s",
        provisioning_delay=0,
        name="fallback",
    ) as cluster:  # fmt: skip
        cluster.wait_for_workers(timeout=60)
        assert cluster.gpu == "v100"
        events = snapshot(cluster)
        stockouts = of_kind(events, "stockout")
        assert stockouts and {e["zone"] for e in stockouts} == {"us-central1-a"}
        assert stockouts[0]["reason"] == "ZONE_RESOURCE_POOL_EXHAUSTED"
        joined = [e for e in of_kind(events, "joined") if e["role"] == "worker"]
        assert len(joined) == 2
        assert {(e["zone"], e["gpu"]) for e in joined} == {("us-central1-b", "v100")}
        assert of_kind(events, "joined", worker="ps-0")[0]["zone"] == "us-central1-a"
        price = PriceCatalog.load().worker_price("v100", "n1-standard-8", "us-central1-b")
        assert joined[0]["price"] == pytest.approx(price.spot)

        # Now the fallback zone runs out too: the cluster runs short instead of failing.
        cluster.backend.stockouts.add("us-central1-b")
        n = len(events)
        cluster.scale(3)
        wait_for_sync(lambda: of_kind(snapshot(cluster), "capacity-exhausted"), timeout=60)
        new = snapshot(cluster)[n:]
        # us-central1-a is remembered as stocked out: not asked again.
        assert {e["zone"] for e in of_kind(new, "stockout")} == {"us-central1-b"}
        assert of_kind(new, "capacity-exhausted")[0]["role"] == "worker"

        # A lost worker cannot be replaced either; still no crash.
        cluster.preempt("w-1" if "w-1" in cluster.workers else 1, notice=False)
        wait_for_sync(lambda: len(of_kind(snapshot(cluster), "capacity-exhausted")) >= 2, 60)
        assert cluster.status == Status.running
        assert n_joined(cluster) == 1
        assert cluster.cost().rate > 0


@pytest.mark.slow
def test_a_storm_in_one_zone_is_left_for_the_calm_one(cleanup: None) -> None:
    """Lifetimes by zone: workers in the stormy zone are revoked, and once the replacement
    policy prefers the calm zone (as the transient-aware policy does when it sees the storm),
    the replacements go there and no revocation is drawn for them."""
    with TransientCluster(
        workers=2,
        preemption="zones:us-central1-a=exp:mean=2s;*=none",
        fallback_zones=["us-central1-b"],
        notice="1s",
        provisioning_delay=0,
        name="zonal-storm",
    ) as cluster:
        wait_for_sync(
            lambda: of_kind(snapshot(cluster), "preempted", zone="us-central1-a"), timeout=120
        )
        assert cluster.simulator.model.for_zone("us-central1-b").spec == "none"
        cluster.policy.prefer_zone(cluster.gpu, "us-central1-b")

        def calm_workers() -> set[str]:
            events = snapshot(cluster)
            gone = {e["worker"] for e in events if e["kind"] in ("preempted", "deleted")}
            return {
                e["worker"]
                for e in of_kind(events, "joined", zone="us-central1-b")
                if e["role"] == "worker" and e["worker"] not in gone
            }

        calm = wait_for_sync(lambda: len(calm_workers()) == 2 and calm_workers(), timeout=180)
        events = snapshot(cluster)
        # Every revocation was of a worker in the stormy zone; none is drawn for the calm ones.
        assert {e["zone"] for e in of_kind(events, "preempted")} == {"us-central1-a"}
        assert not calm & set(cluster.simulator._handles)


# -- trace replay (asynchronous cluster under gen_test) ------------------------------------------
@pytest.mark.slow
@gen_test(timeout=120)
async def test_trace_replay_preempts_exactly_the_trace(tmp_path: Path) -> None:
    trace = tmp_path / "trace.txt"
    trace.write_text("# when, who, how\n0.5s,slot:0,kill\n1s,w-1\n")
    async with TransientCluster(
        workers=2,
        preemption=f"trace:{trace}",
        notice="1s",
        provisioning_delay=0,
        name="trace",
        asynchronous=True,
    ) as cluster:
        await wait_for(
            lambda: all(replaced(snapshot(cluster), n) for n in ("w-0", "w-1")), timeout=60
        )
        await wait_for(lambda: n_joined(cluster) == 2, timeout=60)
        events = snapshot(cluster)
        frame = await cluster.events()
        assert list(frame["kind"]) == kinds(events)
    pre = of_kind(events, "preempted")
    assert [(e["worker"], e["notice"], e["source"]) for e in pre] == [
        ("w-0", False, "simulator"),
        ("w-1", True, "simulator"),
    ]
    assert [e["worker"] for e in of_kind(events, "notice")] == ["w-1"]
    w0 = kinds(events, "w-0")
    assert "notice" not in w0 and w0.index("preempted") < len(w0)
    record = read_run_record(cluster.run_record)
    assert record[-1]["kind"] == "closed"
    assert [e["worker"] for e in of_kind(record, "preempted")] == ["w-0", "w-1"]


# -- the paper's lifetimes, time-compressed -------------------------------------------------------
@pytest.mark.slow
def test_paper_lifetimes_preempt_a_live_cluster(cleanup: None) -> None:
    # 24 simulated hours (the longest a preemptible VM lives) in 4 wall seconds; the paper's
    # 81-98 s start-up becomes a few milliseconds.
    scale = 24 * 3600 / 4
    with TransientCluster(
        workers=2, gpu="k80", prices="paper-2019", preemption="paper:k80", time_scale=scale,
        name="paper",
    ) as cluster:  # fmt: skip

        def three_replaced() -> bool:
            # A replacement is asked for just after its preemption: wait for both, not only the
            # preemptions (a loaded machine shows the gap).
            events = snapshot(cluster)
            first = of_kind(events, "preempted", role="worker")[:3]
            return len(first) == 3 and all(
                replacement_of(events, e["worker"])[0] is not None for e in first
            )

        wait_for_sync(three_replaced, timeout=90)
        events = snapshot(cluster)
    for e in of_kind(events, "preempted", role="worker")[:3]:
        assert e["source"] == "simulator"
        running = of_kind(events, "running", worker=e["worker"])[0]["time"]
        notice = of_kind(events, "notice", worker=e["worker"])[0]["time"]
        assert notice - running <= 24 * 3600 / scale + 1.0
        assert replacement_of(events, e["worker"])[0] is not None
    report = cluster.cost()
    # Billed in simulated time at the paper's prices: every worker ran for simulated hours.
    workers = report.per_vm[(report.per_vm["role"] == "worker") & (report.per_vm["seconds"] > 0)]
    assert (workers["price"] == 0.256).all() and (workers["price_on_demand"] == 0.723).all()
    assert workers["seconds"].sum() > 3 * 3600  # simulated hours, from seconds of wall time
    ratio = workers["cost"] / workers["cost_on_demand"]
    assert ratio.to_list() == pytest.approx([0.256 / 0.723] * len(workers))
    assert report.per_vm.loc["ps-0", "price"] == 0.143


# -- control requests on the scheduler ------------------------------------------------------------
@pytest.mark.slow
def test_control_requests(cleanup: None) -> None:
    before = child_pids()
    with TransientCluster(
        workers=1, notice="1s", provisioning_delay=0, name="controlled"
    ) as cluster, Client(cluster) as client:  # fmt: skip
        cluster.wait_for_workers(timeout=60)

        def answer(request_id: int) -> dict[str, Any]:
            return wait_for_sync(
                lambda: of_kind(snapshot(cluster), "control", request=request_id), timeout=60
            )[0]

        client.log_event(CONTROL_TOPIC, {"action": "scale", "workers": 2, "id": 1})
        assert answer(1)["ok"] is True and answer(1)["action"] == "scale"
        wait_for_sync(lambda: len(worker_states(cluster)) == 2, timeout=60)

        client.log_event(
            CONTROL_TOPIC, {"action": "preempt", "worker": "w-1", "notice": False, "id": 2}
        )
        assert answer(2)["ok"] is True
        wait_for_sync(lambda: replacement_of(snapshot(cluster), "w-1")[0] == "w-2", timeout=60)
        events = snapshot(cluster)
        assert of_kind(events, "preempted", worker="w-1")[0]["notice"] is False
        assert of_kind(events, "notice", worker="w-1") == []

        for request_id, msg, error in [
            (3, {"action": "preempt", "worker": "w-99"}, "No preemptible worker named 'w-99'"),
            (4, {"action": "scale", "workers": -3}, "scale(-3)"),
            (5, {"action": "scale"}, "workers"),
            (6, {"action": "dance"}, "unknown action 'dance'"),
        ]:
            client.log_event(CONTROL_TOPIC, {**msg, "id": request_id})
            reply = answer(request_id)
            assert reply["ok"] is False and error in reply["error"], reply
        assert len(worker_states(cluster)) == 2
        assert registry.lookup("controlled")["stale"] is False
        pids = vm_pids(cluster)

        client.close()

        # "stop" comes over a plain RPC, as the JupyterLab panel sends it (a Client whose
        # scheduler closes under it keeps its loop thread alive: distributed's Client.close
        # returns early when the client is already closed).
        async def post(msg: dict[str, Any]) -> None:
            args = cluster.security.get_connection_args("client")
            async with rpc(cluster.scheduler_address, connection_args=args) as scheduler:
                await scheduler.log_event(topic=CONTROL_TOPIC, msg=msg)

        cluster.sync(post, {"action": "stop", "id": 7})
        assert answer(7)["ok"] is True
        wait_for_sync(lambda: cluster.status == Status.closed, timeout=60)
    record = read_run_record(cluster.run_record)
    assert record[-1]["kind"] == "closed"
    assert {e["worker"] for e in of_kind(record, "deleted")} == {"ps-0", "w-0", "w-2"}
    with pytest.raises(KeyError):
        registry.lookup("controlled")
    wait_for_sync(lambda: not alive(pids), timeout=30)
    wait_for_sync(lambda: not (child_pids() - before), timeout=30)


# -- bad input: a clear error, and nothing starts --------------------------------------------------
def _catalog_without_t4(tmp_path: Path) -> str:
    path = tmp_path / "no-t4.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "no-t4",
                "regions": {
                    "us-central1": {
                        "zones": ["us-central1-a"],
                        "gpus": {"l4": {"on_demand": 0.56, "spot": 0.22}},
                        "machines": {
                            "n1-standard-8": {"on_demand": 0.38, "spot": 0.08},
                            "n1-standard-4": {"on_demand": 0.19, "spot": 0.04},
                        },
                    }
                },
            }
        )
    )
    return str(path)


def _malformed_trace(tmp_path: Path) -> str:
    path = tmp_path / "trace.txt"
    path.write_text("1s,w-0\n2s w-1\n")
    return f"trace:{path}"


BAD_INPUT = [
    ({"gpu": "h100"}, ValueError, r"Unknown GPU type 'h100'.*a100-40gb, l4, p100, t4, v100"),
    ({"zone": "mars-1a"}, ValueError, r"Unknown zone 'mars-1a'.*us-central1-a, us-central1-b"),
    ({"workers": 0}, ValueError, r"workers=0 must be a whole number of at least 1"),
    ({"workers": -1}, ValueError, r"workers=-1 must be"),
    ({"workers": 2.5}, ValueError, r"workers=2.5 must be"),
    ("malformed-trace", ValueError, r"Malformed line 2 in preemption trace"),
    ("catalog-without-t4", ValueError, r"Unknown GPU type 't4'.*catalog 'no-t4'.*use one of l4"),
    ({"backend": "azure"}, ValueError, r"Unknown backend 'azure': use 'local' or 'gce'"),
    ({"preemption": "exp:mean=-1s"}, ValueError, r"Bad exponential preemption spec 'exp:mean=-1s'"),
    ({"preemption": "chaos"}, ValueError, r"Unknown preemption spec 'chaos'"),
    (
        {"preemption": "zones:us-east1-c=exp:mean=60s;*=none"},
        ValueError,
        r"names zone 'us-east1-c', where this cluster places no worker: its zones are "
        r"us-central1-a \(add it to fallback_zones",
    ),
    ({"name": "My Cluster"}, ValueError, r"Cluster name 'My Cluster' is not allowed"),
    ({"name": "-x"}, ValueError, r"Cluster name '-x' is not allowed"),
    ({"time_scale": 0}, ValueError, r"time_scale=0 must be positive"),
    ({"notice": "-5s"}, ValueError, r"notice='-5s' must be a non-negative duration"),
    ({"provisioning_delay": "soon"}, ValueError, r"Bad provisioning delay 'soon'"),
    ({"replace_at": "never"}, ValueError, r"replace_at='never'"),
    ({"fallback_zones": ["nowhere-1a"]}, ValueError, r"Unknown zone 'nowhere-1a'"),
    ({"fallback_gpus": ["tpu"]}, ValueError, r"Unknown GPU type 'tpu'"),
    ({"machine_type": "n9-huge"}, ValueError, r"Unknown machine type 'n9-huge'"),
    ({"nthreads": 0}, ValueError, r"nthreads=0 must be at least 1"),
    ({"ps_hosts": 0}, ValueError, r"ps_hosts=0 must be a whole number of at least 1"),
    ({"ps_hosts": "two"}, ValueError, r"ps_hosts='two' must be a whole number"),
    ({"cuda": "sometimes"}, ValueError, r"Bad cuda='sometimes'"),
    ({"wokers": 3}, TypeError, r"wokers"),
    # Limits (transient_nb.limits), refused before any spend.
    ({"workers": 65}, ValueError, r"65 workers is above max_workers=64.*max_workers=65"),
    ({"workers": 5, "max_workers": 4}, ValueError, r"5 workers is above max_workers=4"),
    ({"max_workers": 0}, ValueError, r"max_workers=0 must be a whole number"),
    ({"workers": 8, "max_hourly_cost": 1.0}, ValueError, r"above max_hourly_cost=\$1.00/h"),
    # Every PS host is billed: 1 worker ($0.22/h) and 4 PS hosts ($0.19/h each) is $0.98/h.
    (
        {"workers": 1, "ps_hosts": 4, "max_hourly_cost": 0.9},
        ValueError,
        r"\$0.98/h .*plus \$0.760/h for the PS hosts",
    ),
    ({"max_hourly_cost": -2}, ValueError, r"max_hourly_cost=-2 must be a positive number"),
    # Priced at the dearest placement allowed: here the on-demand fallback.
    (
        {"workers": 2, "max_hourly_cost": 1.0, "on_demand_fallback": True},
        ValueError,
        r"\$0.730/h each at the dearest allowed placement.*at most 1 workers",
    ),
    # Mixed GPU types (transient_nb.catalog.mix): every mistake named before anything starts.
    ({"workers": {}}, ValueError, r"workers=\{\} asks for no workers"),
    ({"workers": {"t4": -1}}, ValueError, r"t4=-1 is not a number of workers"),
    ({"workers": {"t4": 1, "tpu": 1}}, ValueError, r"Unknown GPU type 'tpu'"),
    # gce-2025 (the default catalog) has no price for a retired K80.
    ({"workers": "k80=2,t4=1"}, ValueError, r"Unknown GPU type 'k80' in us-central1-a"),
    ({"workers": {"t4": 1, "v100": 1}, "gpu": "l4"}, ValueError, r"gpu='l4' is not in"),
    ({"workers": {"t4": 40, "v100": 30}}, ValueError, r"70 workers is above max_workers=64"),
    (
        {"workers": {"t4": 1, "v100": 2}, "max_hourly_cost": 2.0},
        ValueError,
        r"3 workers could cost \$2\.\d\d/h.*above max_hourly_cost",
    ),
    ({"budget": 0}, ValueError, r"budget=0 must be a positive number of dollars"),
    ({"deadline": "soon"}, ValueError, r"deadline='soon' must be a positive duration"),
    ({"join_timeout": "-1s"}, ValueError, r"join_timeout='-1s' must be a positive duration"),
]


@pytest.mark.parametrize(
    "kwargs, exc, match", BAD_INPUT, ids=[str(k)[:40] for k, _, _ in BAD_INPUT]
)
def test_bad_input_starts_nothing(kwargs: Any, exc: type, match: str, tmp_path: Path) -> None:
    if kwargs == "malformed-trace":
        kwargs = {"preemption": _malformed_trace(tmp_path)}
    elif kwargs == "catalog-without-t4":
        kwargs = {"prices": _catalog_without_t4(tmp_path)}
    before = child_pids()
    with pytest.raises(exc, match=match):
        TransientCluster(**{"provisioning_delay": 0, **kwargs})
    assert child_pids() - before == set()
    assert registry.entries() == []
    assert not (tmp_path / "runs").exists()


def test_scaling_above_the_limits_is_refused_from_every_client(cleanup: None) -> None:
    with TransientCluster(
        workers=1, provisioning_delay=0, max_workers=2, max_hourly_cost=5.0, name="capped"
    ) as cluster, Client(cluster) as client:  # fmt: skip
        with pytest.raises(ValueError, match=r"3 workers is above max_workers=2"):
            cluster.scale(3)
        # The JupyterLab panel's (and connect()'s) scale is a control request: refused alike.
        client.log_event(CONTROL_TOPIC, {"action": "scale", "workers": 1000, "id": 1})
        reply = wait_for_sync(lambda: of_kind(snapshot(cluster), "control", request=1), timeout=60)[
            0
        ]
        assert reply["ok"] is False and "above max_workers=2" in reply["error"]
        assert cluster._target == 1
        assert of_kind(snapshot(cluster), "scale") == []


def test_scale_ps_adds_billed_ps_hosts_and_refuses_what_it_cannot_do(cleanup: None) -> None:
    # 1 T4 ($0.22/h) and 2 PS hosts ($0.19/h each) fit under $0.65/h; a third PS host does not.
    with TransientCluster(
        workers=1, provisioning_delay=0, max_hourly_cost=0.65, name="more-ps"
    ) as cluster:
        for bad, match in [
            (0, r"scale_ps: n=0 must be a whole number of at least 1"),
            ("2", r"scale_ps: n='2' must be a whole number"),
            (9, r"scale_ps\(9\): at most 4 PS hosts"),
            (3, r"above max_hourly_cost=\$0.65/h"),
        ]:
            with pytest.raises(ValueError, match=match):
                cluster.scale_ps(bad)
        assert cluster.ps_hosts == 1 and of_kind(snapshot(cluster), "ps-hosts") == []
        cluster.scale_ps(2)
        cluster.wait_for_workers(timeout=120)  # the PS hosts count too
        with pytest.raises(ValueError, match=r"cannot give back a shard's host"):
            cluster.scale_ps(1)
        events = snapshot(cluster)
        i = index_of(events, "ps-hosts", hosts=2, hosts_from=1)
        assert index_of(events, "joined", i, worker="ps-1", role="ps") > i
        billed = cluster.cost().per_vm
    assert (billed.loc[["ps-0", "ps-1"], "cost"] > 0).all()


def test_the_local_control_plane_is_tls_and_obeys_only_its_own_client(cleanup: None) -> None:
    from distributed.security import Security

    from transient_nb.backends.tls import ClusterCA, security_from_files

    with TransientCluster(workers=1, provisioning_delay=0, name="private") as cluster:
        cluster.wait_for_workers(timeout=60)
        address = cluster.scheduler_address
        assert address.startswith("tls://127.0.0.1:")
        assert all(a.startswith("tls://") for a in cluster.scheduler.workers)
        entry = registry.lookup("private")
        for path in entry["tls"].values():
            assert os.stat(path).st_mode & 0o077 == 0  # this user's only

        async def control(args: dict[str, Any], request: int) -> None:
            async with rpc(address, connection_args=args, timeout=5) as scheduler:
                msg = {"action": "scale", "workers": 3, "id": request}
                await scheduler.log_event(topic=CONTROL_TOPIC, msg=msg)

        # Another user: no certificate of this cluster's CA, so no connection at all.
        other = ClusterCA.create("other")
        cert, key = other.issue("transient-client")
        stranger = Security(
            require_encryption=True, tls_ca_file=other.cert_pem, tls_client_cert=cert,
            tls_client_key=key,
        )  # fmt: skip
        with pytest.raises(OSError):
            cluster.sync(control, stranger.get_connection_args("client"), 1)
        # A worker's certificate connects (workers must), but its control requests are refused.
        worker_files = cluster.backend.tls_files("w-0")
        as_worker = security_from_files(worker_files, "client").get_connection_args("client")
        cluster.sync(control, as_worker, 2)
        refused = wait_for_sync(lambda: of_kind(snapshot(cluster), "control-refused"), 30)
        assert refused[0]["sender"] == "w-0" and refused[0]["action"] == "scale"
        # The client's own certificate (the registry's files, as connect() and the panel use).
        as_client = security_from_files(entry["tls"], "client").get_connection_args("client")
        cluster.sync(control, as_client, 3)
        reply = wait_for_sync(lambda: of_kind(snapshot(cluster), "control", request=3), 30)[0]
        assert reply["ok"] is True and cluster._target == 3
        assert of_kind(snapshot(cluster), "control", request=2) == []


def test_name_of_a_running_cluster_is_taken(tmp_path: Path) -> None:
    registry.register("taken", {"scheduler_address": "tcp://127.0.0.1:1"})  # this process: alive
    before = child_pids()
    with pytest.raises(ValueError, match=r"'taken' is already running \(kernel pid \d+\)"):
        TransientCluster(name="taken", provisioning_delay=0)
    assert child_pids() - before == set()
    assert registry.lookup("taken")["scheduler_address"] == "tcp://127.0.0.1:1"
    assert not (tmp_path / "runs").exists()
