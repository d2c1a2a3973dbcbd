"""Tests for transient_nb.notebook.views.panel: the control panel, without a browser.

ipywidgets work without a frontend (the ``comm`` package's dummy comm); the panel is driven by
its periodic callback on the cluster's event loop, and the tests wait for what it shows.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from distributed.core import Status

from tests.conftest import of_kind, wait_for_sync
from tests.notebook.views.views_logs import LIFE, T0, FakeCluster, vm
from transient_nb import TransientCluster
from transient_nb.notebook.views.panel import ClusterPanel, panel_for


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


def test_the_panel_folds_the_gone_workers_into_one_line_that_stays_open() -> None:
    """Seventeen preempted workers: the table lists the live ones only; one line says how many
    went and what they cost, and opened, it stays open across refreshes."""
    events = list(LIFE)
    for i in range(2, 18):
        events += [vm("requested", f"w-{i}", 10 * i, price=0.5), vm("running", f"w-{i}", 10 * i)]
        events += [vm("preempted", f"w-{i}", 10 * i + 5)]
    panel = ClusterPanel(FakeCluster(events), start=False)
    assert "data-worker='w-1'" not in panel.table.value
    assert panel.table.value.count("<tr class='transient-vm'") == 2  # ps-0, w-0
    title = panel.gone.titles[0]
    assert title.startswith("17 preempted, $") and panel.gone.layout.display == "block"
    assert float(title.rpartition("$")[2]) == pytest.approx(panel.state.gone()["cost"], abs=5e-4)
    assert panel.gone_rows.value.count("<tr class='transient-vm'") == 8  # the latest eight
    panel.gone.selected_index = 0  # a click opens it
    panel.cluster.monitor.events.append(vm("deleted", "w-0", 400))
    panel.update()
    assert panel.gone.selected_index == 0 and panel.gone.titles[0].startswith(
        "17 preempted, 1 given back, $"
    )


def test_a_mixed_clusters_panel_shows_its_mix_and_cost_per_type() -> None:
    events = [
        {**LIFE[0], "gpu": "k80", "workers": 3, "mix": {"k80": 2, "v100": 1}},
        *LIFE[1:4],
        vm("requested", "w-2", 0, gpu="v100", price=0.9, price_on_demand=2.1),
        *LIFE[4:7],
        vm("running", "w-2", 1, gpu="v100"),
    ]
    cluster = FakeCluster(events)
    cluster.gpu = "k80"  # type: ignore[attr-defined]
    panel = ClusterPanel(cluster, start=False)
    assert panel.workers_label.value == "2 k80 + 1 v100"
    assert {r["name"]: r["gpu"] for r in panel.rows if r["role"] == "worker"}["w-2"] == "v100"
    assert "per type:" in panel.totals.value and "v100 1 VM" in panel.totals.value
    # The buttons add or remove workers of the main type: a plain number would be refused.
    panel.scale_up.click()
    assert cluster.calls[-1] == ("scale", (3, "k80"))


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
