"""Tests for transient_nb.notebook.views.dashboard: live figures streamed from the event log."""

from __future__ import annotations

import gc
import sys
import weakref
from typing import Any

import pytest
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output
from jupyter_bokeh import BokehModel

from tests.conftest import wait_for_sync
from tests.notebook.views.views_logs import T0, FakeCluster, vm
from transient_nb import TransientCluster
from transient_nb.notebook.views import dashboard as dashboard_module
from transient_nb.notebook.views.dashboard import Dashboard, load_bokehjs, sources


def base_events() -> list[dict[str, Any]]:
    return [
        {"kind": "started", "time": T0, "time_scale": 1.0, "workers": 1},
        vm("requested", "w-0", 0, price=0.5, price_on_demand=1.5),
        vm("running", "w-0", 1),
        vm("joined", "w-0", 2),
    ]


def test_update_streams_what_is_new_and_filters_other_runs() -> None:
    events = base_events()
    cluster = FakeCluster(events)
    dash = Dashboard(cluster, run="run-a", start=False)
    assert dash.figures.t0 == T0  # the cluster's first event: joins before the run show too
    assert sources(dash)["markers"] == 1
    events += [
        {"kind": "train-started", "time": T0 + 3, "run": "run-a", "steps": 10},
        {"kind": "metrics", "time": T0 + 4, "run": "run-a", "step": 1, "loss": 2.0},
        {"kind": "metrics", "time": T0 + 4, "run": "run-b", "step": 9, "loss": 9.0},
        vm("notice", "w-0", 5, source="manual"),
    ]
    assert dash.update(now=T0 + 5) == 3  # run-b's metrics are not this dashboard's
    counts = sources(dash)
    assert counts["loss"] == 1 and counts["markers"] == 2
    assert dash.figures.workers.markers.data["detail"][-1] == "notice from manual"
    assert dash.update(now=T0 + 5.1) == 0


def test_cost_moves_between_events_once_a_second() -> None:
    cluster = FakeCluster(base_events())
    dash = Dashboard(cluster, start=False)
    n = sources(dash)["cost"]
    dash.update(now=T0 + 1e6)  # first tick: a point at now
    dash.update(now=T0 + 1e6 + 0.2)  # too soon for another
    assert sources(dash)["cost"] == n + 1
    dash.update(now=T0 + 1e6 + 1.5)
    assert sources(dash)["cost"] == n + 2
    cluster.monitor.events.append({"kind": "closed", "time": T0 + 1e6 + 2})
    dash.update(now=T0 + 1e6 + 5)
    assert dash.closed_seen
    assert sources(dash)["cost"] == n + 3  # the closed event's own point; no tick after it


def test_widget_and_inline_bokehjs(monkeypatch: pytest.MonkeyPatch) -> None:
    dash = Dashboard(FakeCluster(base_events()), start=False)
    assert isinstance(dash.widget, BokehModel)
    assert dash.widget is dash.widget
    monkeypatch.setattr(dashboard_module, "_bokehjs_loaded", False)
    InteractiveShell.instance()
    with capture_output() as captured:
        dash._ipython_display_()
        load_bokehjs()  # once per kernel: the second call sends nothing
    bundles = [o.data for o in captured.outputs]
    load = [b for b in bundles if "application/vnd.bokehjs_load.v0+json" in b]
    assert len(load) == 1
    js = load[0]["application/vnd.bokehjs_load.v0+json"]
    assert "cdn.bokeh.org" not in js and len(js) > 100_000  # BokehJS itself, inline
    assert any("application/vnd.jupyter.widget-view+json" in b for b in bundles)
    model = weakref.ref(dash.widget)
    dash.close()
    assert model().comm is None  # type: ignore[union-attr]
    # The collector closes the widget once more (Widget.__del__): that must not raise, or it
    # surfaces as an unraisable exception in whatever test runs next.
    raised: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", raised.append)
    del dash
    gc.collect()
    assert model() is None and not raised


@pytest.mark.slow
def test_dashboard_follows_a_real_cluster() -> None:
    with TransientCluster(workers=1, provisioning_delay=0, notice="1s") as cluster:
        dash = Dashboard(cluster)
        # Driven by its periodic callback on the cluster's loop: nobody calls update() here.
        wait_for_sync(lambda: "joined" in dash.figures.workers.markers.data["kind"], timeout=120)
        cost_points = sources(dash)["cost"]
        wait_for_sync(lambda: sources(dash)["cost"] > cost_points + 1, timeout=30)
        cluster.wait_for_workers(1, timeout=120)
        cluster.preempt("w-0")
        markers = dash.figures.workers.markers.data
        wait_for_sync(lambda: "preempted" in markers["kind"], timeout=60)
        i = markers["kind"].index("notice")
        assert (markers["worker"][i], markers["detail"][i]) == ("w-0", "notice from manual")
        wait_for_sync(lambda: "replacement-requested" in markers["kind"], timeout=60)
    dash.update()
    assert dash.closed_seen
    wait_for_sync(lambda: not dash._ticker.running, timeout=10)
