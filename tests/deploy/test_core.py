"""Tests for transient_nb.deploy.core: the event log, the bill and the run record of a real cluster."""

from __future__ import annotations

import pytest

from tests.conftest import (
    alive,
    child_pids,
    kinds,
    of_kind,
    vm_pids,
    wait_for_sync,
)
from tests.deploy.cluster_helpers import (
    as_json,
    n_joined,
    preempted_workers,
    recompute_costs,
    replaced,
    snapshot,
)
from transient_nb import TransientCluster
from transient_nb.catalog.prices import PriceCatalog
from transient_nb.deploy import registry
from transient_nb.eventlog.records import read_run_record


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


def test_the_old_name_of_the_placement_policy_warns_and_gives_it() -> None:
    cluster = object.__new__(TransientCluster)  # no cluster started: only the property is asked
    cluster.placement = placement = object()  # type: ignore[assignment]
    with pytest.warns(DeprecationWarning, match="TransientCluster.placement"):
        assert cluster.policy is placement
