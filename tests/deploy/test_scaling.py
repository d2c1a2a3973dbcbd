"""Tests for transient_nb.deploy.scaling: the mix, its on-demand share, give-backs, limits."""

from __future__ import annotations

import dataclasses

import pytest
from distributed import Client

from tests.conftest import (
    index_of,
    kinds,
    of_kind,
    wait_for_sync,
)
from tests.deploy.cluster_helpers import (
    local_cluster,
    n_joined,
    replaced,
    replacement_of,
    snapshot,
    worker_states,
)
from transient_nb import TransientCluster
from transient_nb.eventlog.folds import vm_states
from transient_nb.eventlog.records import read_run_record
from transient_nb.eventlog.vocabulary import CONTROL_TOPIC


def on_demand_held(cluster: TransientCluster) -> list[str]:
    """Names of the on-demand GPU worker VMs that are not gone."""
    df = vm_states(snapshot(cluster))
    if df.empty:
        return []
    df = df[(df["role"] == "worker") & ~df["state"].isin(["preempted", "deleted"])]
    # From the log's own spot flag: SpecCluster lists a worker in ``cluster.workers`` only once
    # it has started, and the log names it from the moment it is requested.
    return [str(n) for n, spot in df["spot"].items() if spot is not None and not spot]


# -- mixed GPU types: asked for, scaled per type, replaced by type, billed per type --------------
def joined_by_gpu(cluster: TransientCluster) -> dict[str, int]:
    """Joined GPU workers per GPU type, from the VM table the views show."""
    df = vm_states(snapshot(cluster))
    df = df[(df["role"] == "worker") & (df["state"] == "joined")]
    return {str(g): int(n) for g, n in df.groupby("gpu").size().items()}


def test_scale_down_gives_back_the_worker_likeliest_to_be_revoked(cleanup: None) -> None:
    """Selective revocation: of two working VMs, the one near GCE's 24 h limit goes (the paper's
    curve gives it even odds of revocation within the hour), not the newest (7.8%)."""
    with local_cluster("give-back", workers=2) as cluster:
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


def test_scale_keeps_a_share_on_demand_that_is_never_revoked(cleanup: None) -> None:
    """``scale(on_demand=1)`` swaps a Spot worker for an on-demand one; under a storm that takes
    Spot workers every few seconds the on-demand one is never revoked and is billed at its price;
    ``on_demand=0`` swaps it back. Bad counts are refused before anything changes."""
    with local_cluster(
        "on-demand", workers=2, preemption="exp:mean=4s", notice="1s", seed=5
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
    with local_cluster(
        "scaling", workers=1, preemption="exp:mean=6s", notice="1s", seed=11
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


@pytest.mark.slow
def test_a_mixed_cluster_keeps_its_mix(cleanup: None) -> None:
    with local_cluster(
        "mixed",
        workers={"k80": 1, "v100": 1},
        prices="paper-2019",
        machine_type="n1-standard-8",
        notice="1s",
        seed=3,
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


def test_scaling_above_the_limits_is_refused_from_every_client(cleanup: None) -> None:
    with local_cluster(
        "capped", workers=1, max_workers=2, max_hourly_cost=5.0
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


def test_dasks_adaptive_form_is_refused_with_the_goals_to_use_instead() -> None:
    from distributed.deploy.adaptive import Adaptive

    cluster = object.__new__(TransientCluster)  # refused before the cluster is touched
    with pytest.raises(ValueError, match=r"adapt\(minimum, maximum=\.\.\.\) is Dask's"):
        cluster.adapt(minimum=1, maximum=4)
    with pytest.raises(ValueError, match=r"adapt\(goal='deadline', deadline='2h'\)"):
        cluster.adapt(Adaptive)
