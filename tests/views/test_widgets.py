"""Tests for transient_nb.views.widgets: the control panel, without a browser.

ipywidgets work without a frontend (the ``comm`` package's dummy comm); the panel is driven by
its periodic callback on the cluster's event loop, and the tests wait for what it shows.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from conftest import of_kind, wait_for_sync
from distributed.core import Status
from tornado.ioloop import IOLoop

from transient_nb import TransientCluster
from transient_nb.cost import compute_costs
from transient_nb.views.widgets import (
    ClusterPanel,
    RunTracker,
    Ticker,
    cluster_status,
    panel_for,
    vm_rows,
)

T0 = 1_800_000_000.0


def vm(kind: str, name: str, t: float, **fields: Any) -> dict[str, Any]:
    base = {"role": "worker", "gpu": "t4", "zone": "us-central1-a", "spot": True}
    return {"kind": kind, "time": T0 + t, "worker": name, **base, **fields}


LIFE = [
    {"kind": "started", "time": T0, "time_scale": 2.0, "workers": 2},
    vm("requested", "ps-0", 0, role="ps", gpu=None, spot=False, price=0.2, price_on_demand=0.2),
    vm("requested", "w-0", 0, price=0.5, price_on_demand=1.5),
    vm("requested", "w-1", 0, price=0.5, price_on_demand=1.5),
    vm("running", "ps-0", 1, role="ps", gpu=None, spot=False),
    vm("running", "w-0", 1),
    vm("running", "w-1", 1),
    vm("joined", "ps-0", 2, role="ps", gpu=None, spot=False),
    vm("joined", "w-0", 2),
    vm("notice", "w-1", 100),
    vm("preempted", "w-1", 110, notice=True),
]


class FakeCluster:
    """Just what the panel reads: a name, an event list and a loop (never started here)."""

    def __init__(self, events: list[dict[str, Any]]):
        self.name = "fake"
        self.monitor = type("M", (), {"events": events})()
        self.loop = IOLoop.current(instance=False)
        self.status = Status.running
        self.calls: list[tuple[str, Any]] = []

    def scale(self, n: int) -> None:
        self.calls.append(("scale", n))

    def preempt(self, target: Any, notice: bool = True) -> list[str]:
        self.calls.append(("preempt", (target, notice)))
        raise ValueError("No preemptible worker named 'w-9'")


# -- what the panel computes ----------------------------------------------------------------------
def test_vm_rows_from_lifecycle_events() -> None:
    rows, cost = vm_rows(LIFE, minimum_s=60, now=T0 + 200)
    assert [(r["name"], r["state"], r["gone"]) for r in rows] == [
        ("ps-0", "joined", False),
        ("w-0", "joined", False),
        ("w-1", "preempted", True),
    ]
    ps, w0, w1 = rows
    assert ps["gpu"] == "—" and not ps["spot"] and w0["spot"]
    assert w1["seconds_in_state"] == pytest.approx(90)
    # Billing in simulated time (time_scale 2): w-1 ran 109 wall seconds.
    assert w1["cost"] == pytest.approx(109 * 2 * 0.5 / 3600)
    assert cost.total == pytest.approx(compute_costs(LIFE, minimum_s=60).total, rel=0.05)


def test_run_tracker_eta_and_projected_cost() -> None:
    tracker = RunTracker()
    tracker.feed(
        [
            {"kind": "train-started", "time": T0, "run": "r", "steps": 1000, "model": "m"},
            {"kind": "metrics", "time": T0 + 10, "run": "r", "step": 100, "img_per_s": 50.0},
            {"kind": "metrics", "time": T0 + 20, "run": "r", "step": 300, "img_per_s": 70.0},
            {"kind": "eval", "time": T0 + 21, "run": "r", "step": 300, "accuracy": 0.5},
            {"kind": "metrics", "time": T0 + 21, "run": "other", "step": 5},
            vm("preempted", "w-1", 22),
        ]
    )
    p = tracker.progress
    assert p is not None
    assert (p.step, p.target, p.accuracy, p.img_per_s, p.preemptions) == (300, 1000, 0.5, 70.0, 1)
    assert p.steps_per_s == pytest.approx(20)
    assert p.eta_s == pytest.approx(35)
    cost = compute_costs(LIFE[:9], now=T0 + 50, minimum_s=60)
    # $/h of the running VMs (per simulated hour) times the ETA in simulated hours.
    expected = cost.total + cost.rate * 35 * 2.0 / 3600
    assert p.projected_cost(cost) == pytest.approx(expected)
    tracker.feed(
        [{"kind": "train-finished", "time": T0 + 30, "run": "r", "reason": "steps", "step": 1000}]
    )
    assert (p.state, p.step, p.eta_s, p.projected_cost(cost)) == ("steps", 1000, 0.0, cost.total)


def test_status_table_groups_vms() -> None:
    cluster = FakeCluster(list(LIFE))
    status = cluster_status(cluster, now=T0 + 200)
    table = status.table
    assert list(table["count"]) == [1, 1]  # the gone VM is not in the status
    assert set(table["state"]) == {"joined"}
    assert "fake: $" in repr(status) and "saved" in repr(status)
    assert "<table" in status._repr_html_()


def test_panel_buttons_and_errors_without_a_cluster_process() -> None:
    cluster = FakeCluster(list(LIFE))
    panel = ClusterPanel(cluster, start=False)
    assert [r["name"] for r in panel.rows] == ["ps-0", "w-0", "w-1"]
    assert panel.worker_select.options == ("w-0",)
    assert "saved" in panel.totals.value
    panel.scale_up.click()
    assert cluster.calls[-1] == ("scale", 3)
    assert panel.workers_label.value == "3 workers"
    panel.scale_down.click()
    assert cluster.calls[-1] == ("scale", 2)
    # An API error lands in the panel, not in a traceback nobody sees.
    panel.preempt_button.click()
    assert cluster.calls[-1] == ("preempt", ("w-0", True))
    assert "No preemptible worker" in panel.message.value
    panel.notice.value = False
    panel.preempt_button.click()
    assert cluster.calls[-1] == ("preempt", ("w-0", False))
    # New events are picked up by the next update.
    cluster.monitor.events.append(vm("requested", "w-2", 120, price=0.5, price_on_demand=1.5))
    assert panel.update()
    assert [r["name"] for r in panel.rows][-2:] == ["w-2", "w-1"]
    cluster.monitor.events.append({"kind": "closed", "time": T0 + 130})
    panel.update()
    assert "closed" in panel.header.value and panel.preempt_button.disabled


def test_ticker_calls_on_the_loop_and_gives_up_on_errors() -> None:
    from distributed.utils import LoopRunner

    runner = LoopRunner()
    runner.start()
    try:
        calls: list[float] = []
        ticker = Ticker(runner.loop, lambda: calls.append(time.time()), 0.02).start()
        wait_for_sync(lambda: len(calls) >= 3, timeout=10)
        ticker.stop()
        wait_for_sync(lambda: not ticker.running, timeout=10)

        def boom() -> None:
            raise RuntimeError("broken view")

        bad = Ticker(runner.loop, boom, 0.01, max_errors=3).start()
        wait_for_sync(lambda: bad.errors >= 3 and not bad.running, timeout=10)
    finally:
        runner.stop()


# -- with a real cluster ----------------------------------------------------------------------------
@pytest.fixture
def cluster() -> Any:
    with TransientCluster(workers=1, provisioning_delay=0, notice="1s") as c:
        yield c


def state(panel: ClusterPanel, name: str) -> str | None:
    return next((r["state"] for r in panel.rows if r["name"] == name), None)


def live(panel: ClusterPanel) -> list[str]:
    return [r["name"] for r in panel.rows if not r["gone"]]


@pytest.mark.slow
def test_panel_follows_a_real_cluster(cluster: TransientCluster) -> None:
    panel = ClusterPanel(cluster)
    assert panel_for(cluster) is not panel  # panel_for keeps its own, reused one
    assert panel_for(cluster) is panel_for(cluster)
    # The periodic callback fills the table as the VMs join; nobody calls update() here.
    wait_for_sync(lambda: live(panel) == ["ps-0", "w-0"], timeout=120)
    wait_for_sync(lambda: panel.worker_select.options == ("w-0",), timeout=120)
    wait_for_sync(lambda: "1 of 1 GPU workers working" in panel.header.value, timeout=120)

    # Scale up from the panel: the table gains a row.
    panel.scale_up.click()
    wait_for_sync(lambda: len(live(panel)) == 3, timeout=60)
    assert cluster._target == 2
    wait_for_sync(lambda: state(panel, "w-1") == "joined", timeout=120)
    assert "w-1" in panel.worker_select.options

    # Preempt the selected worker: a notice, then the preemption, each within a second.
    panel.worker_select.value = "w-1"
    clicked = time.time()
    panel.preempt_button.click()
    notice = wait_for_sync(lambda: of_kind(cluster.monitor.events, "notice", worker="w-1"), 30)
    assert notice[0]["source"] == "manual"
    wait_for_sync(lambda: state(panel, "w-1") in ("notice", "left", "preempted"), timeout=30)
    assert time.time() - clicked < 10
    wait_for_sync(lambda: of_kind(cluster.monitor.events, "preempted", worker="w-1"), 60)
    wait_for_sync(lambda: state(panel, "w-1") == "preempted", timeout=10)

    # Shut down from the panel.
    panel.stop_button.click()
    assert cluster.status == Status.closed
    assert "closed" in panel.header.value
    wait_for_sync(lambda: not panel._ticker.running, timeout=10)


@pytest.mark.slow
def test_panel_reacts_within_a_second(cluster: TransientCluster) -> None:
    panel = ClusterPanel(cluster)
    cluster.wait_for_workers(1, timeout=120)
    wait_for_sync(lambda: "w-0" in panel.worker_select.options, timeout=30)
    t = time.time()
    cluster.scale(2)
    wait_for_sync(lambda: "w-1" in [r["name"] for r in panel.rows], timeout=10)
    assert time.time() - t < 1.5
    panel.close()
    wait_for_sync(lambda: not panel._ticker.running, timeout=10)
