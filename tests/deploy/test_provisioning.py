"""Tests for transient_nb.deploy.provisioning: preemptions, drains, replacements, stock-outs."""

from __future__ import annotations

from pathlib import Path

import dask.config
import pytest
from distributed.core import Status
from distributed.utils_test import gen_test

from tests.conftest import (
    index_of,
    kinds,
    of_kind,
    wait_for,
    wait_for_sync,
)
from tests.deploy.cluster_helpers import (
    n_joined,
    replaced,
    replacement_of,
    snapshot,
)
from transient_nb import TransientCluster
from transient_nb.catalog.prices import PriceCatalog
from transient_nb.eventlog.records import read_run_record


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
        cluster.placement.prefer_zone(cluster.gpu, "us-central1-b")

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


# -- issue 30: every VM the cluster creates goes through the limits ---------------------------------


@pytest.mark.slow
def test_a_replacement_that_would_break_max_hourly_cost_is_refused(cleanup: None) -> None:
    """A replacement is a VM like any other: priced at its placement beside every VM the cluster
    runs. At the limit (here lowered while it runs), the lost worker is not replaced; a worker at
    its notice no longer counts, so a replacement at the notice fits where the old one did."""
    from transient_nb.limits import Limits

    with TransientCluster(
        workers=2, provisioning_delay=0, notice="1s", replace_at="notice", name="repl-cap"
    ) as cluster:
        cluster.wait_for_workers(2, timeout=120)
        workers, hourly = cluster._fleet()
        assert workers == 2
        # Exactly what runs: a replacement at the notice replaces, and fits.
        cluster.limits = Limits(max_workers=2, max_hourly_cost=hourly)
        cluster.preempt("w-0")
        wait_for_sync(lambda: of_kind(snapshot(cluster), "joined", worker="w-2"), timeout=60)
        assert not of_kind(snapshot(cluster), "limit-refused")
        # Below what runs: the next lost worker is not replaced.
        cluster.limits = Limits(max_workers=2, max_hourly_cost=hourly - 0.01)
        cluster.preempt("w-1", notice=False)
        (refused,) = wait_for_sync(lambda: of_kind(snapshot(cluster), "limit-refused"), timeout=60)
        assert refused["limit"] == "max_hourly_cost"
        assert f"above max_hourly_cost=${hourly - 0.01:.2f}/h" in refused["reason"]
        events = snapshot(cluster)
        assert index_of(events, "replacement-requested", worker="w-1") >= 0
        assert not of_kind(events, "requested", worker="w-3")
