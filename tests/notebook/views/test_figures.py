"""Tests for transient_nb.notebook.views.figures: the Bokeh components stream, never redraw."""

from __future__ import annotations

from typing import Any

import pytest
from bokeh.document import Document
from bokeh.document.events import ColumnDataChangedEvent, ColumnsStreamedEvent

from transient_nb.eventlog.bill import compute_costs
from transient_nb.notebook.views.figures import RunFigures, Workers
from transient_nb.notebook.views.report import report_html

T0 = 1_800_000_000.0


def vm(kind: str, name: str, t: float, **fields: Any) -> dict[str, Any]:
    base = {"role": "worker", "gpu": "t4", "zone": "us-central1-a", "spot": True}
    return {"kind": kind, "time": T0 + t, "worker": name, **base, **fields}


def run_events() -> list[dict[str, Any]]:
    """A small run: a PS and two workers, one preempted and replaced, some training."""
    return [
        {"kind": "started", "time": T0, "time_scale": 1.0, "workers": 2},
        vm(
            "requested",
            "ps-0",
            0,
            role="ps",
            gpu=None,
            spot=False,
            price=0.19,
            price_on_demand=0.19,
        ),
        vm("requested", "w-0", 0, price=0.5, price_on_demand=1.5),
        vm("requested", "w-1", 0, price=0.5, price_on_demand=1.5),
        vm("running", "ps-0", 1, role="ps"),
        vm("running", "w-0", 1),
        vm("running", "w-1", 1),
        vm("joined", "ps-0", 2, role="ps", gpu=None),
        vm("joined", "w-0", 2),
        vm("joined", "w-1", 2),
        {"kind": "train-started", "time": T0 + 3, "run": "run-1", "steps": 100, "batch_size": 8},
        {"kind": "metrics", "time": T0 + 4, "run": "run-1", "step": 10, "loss": 2.0},
        {
            "kind": "worker-metrics",
            "time": T0 + 4,
            "run": "run-1",
            "worker": "w-0",
            "img_per_s": 80,
        },
        {
            "kind": "eval",
            "time": T0 + 5,
            "run": "run-1",
            "step": 20,
            "accuracy": 0.4,
            "test_loss": 1.5,
        },
        vm("notice", "w-1", 6, source="simulator"),
        vm("left", "w-1", 7),
        vm("preempted", "w-1", 8, notice=True, source="simulator"),
        vm("replacement-requested", "w-1", 8, slot=1),
        vm("spare-requested", "w-0", 8.5, odds=0.75, age_s=86000.0, lead_s=400.0),
        vm("requested", "w-2", 8, gpu="l4", price=0.6, price_on_demand=1.8),
        vm("running", "w-2", 9, gpu="l4"),
        vm("joined", "w-2", 10, gpu="l4"),
        {"kind": "metrics", "time": T0 + 11, "run": "run-1", "step": 60, "loss": 1.0},
    ]


def test_every_figure_gets_its_rows() -> None:
    figs = RunFigures()
    figs.update(run_events())
    assert figs.t0 == T0  # the first event's time when none is given
    assert figs.accuracy.loss.data["step"] == [10, 60]
    assert figs.accuracy.acc.data["accuracy"] == [0.4]
    assert figs.throughput.source.data["worker"] == ["w-0"]
    markers = figs.workers.markers.data
    assert list(zip(markers["kind"], markers["worker"], strict=True)) == [
        ("joined", "w-0"),
        ("joined", "w-1"),
        ("notice", "w-1"),
        ("preempted", "w-1"),
        ("replacement-requested", "w-1"),
        ("spare-requested", "w-0"),
        ("joined", "w-2"),
    ]
    assert markers["detail"][5] == "a spare was requested (75% odds of revocation)"
    # The hover says why: whose notice, and whether the worker had one.
    assert markers["detail"][2] == "notice from simulator"
    assert markers["detail"][3] == "preempted after its notice (simulator)"
    assert figs.workers.source.data["active"] == [1, 2, 2, 1, 1, 1, 1, 2]
    # One step line per GPU type, created as the type first joins.
    assert set(figs.workers.by_gpu) == {"t4", "l4"}
    assert figs.workers.by_gpu["t4"].data["active"] == [1, 2, 1]
    assert figs.workers.by_gpu["l4"].data["active"] == [1]


def test_updates_stream_only_new_rows_never_redraw() -> None:
    events = run_events()
    figs = RunFigures()
    doc = Document()
    doc.add_root(figs.root)
    changes: list[Any] = []
    doc.on_change(lambda event: changes.append(event))
    figs.update(events[:12])
    n_loss = len(figs.accuracy.loss.data["step"])
    figs.update(events)
    assert len(figs.accuracy.loss.data["step"]) == n_loss + 1
    data_events = [
        c for c in changes if isinstance(c, (ColumnsStreamedEvent, ColumnDataChangedEvent))
    ]
    assert data_events and all(isinstance(c, ColumnsStreamedEvent) for c in data_events)
    # A second update with nothing new changes nothing.
    changes.clear()
    figs.update(events)
    assert not [c for c in changes if isinstance(c, ColumnsStreamedEvent)]


def test_cost_curve_matches_the_cost_meter_and_ticks() -> None:
    events = run_events()
    figs = RunFigures()
    figs.update(events)
    cost = figs.cost.source.data
    final = compute_costs(events, now=events[-1]["time"], minimum_s=60)
    assert cost["cost"][-1] == pytest.approx(final.total)
    assert cost["on_demand"][-1] == pytest.approx(final.total_on_demand)
    assert all(b >= a for a, b in zip(cost["cost"], cost["cost"][1:], strict=False))
    # Each point is the bill as it stood then, the same as a fresh one over the log so far.
    for t, c in zip(cost["time"], cost["cost"], strict=True):
        upto = [e for e in events if e["time"] - figs.t0 <= t]
        assert c == pytest.approx(compute_costs(upto, now=figs.t0 + t, minimum_s=60).total)
    n = len(cost["time"])
    figs.tick(events, T0 + 100)
    assert len(figs.cost.source.data["time"]) == n + 1
    later = compute_costs(events, now=T0 + 100, minimum_s=60)
    assert figs.cost.source.data["cost"][-1] == pytest.approx(later.total)
    assert figs.cost.source.data["time"][-1] == pytest.approx(100)


def test_figures_share_one_time_axis() -> None:
    figs = RunFigures(t0=T0)
    ranges = {
        id(f.x_range)
        for f in (
            figs.accuracy.acc_fig,
            figs.accuracy.loss_fig,
            figs.cost.root,
            figs.workers.root,
            figs.throughput.root,
        )
    }
    assert len(ranges) == 1


def test_workers_ignore_the_ps_and_other_events() -> None:
    w = Workers(t0=T0)
    w.update([vm("joined", "ps-0", 1, role="ps"), {"kind": "metrics", "time": T0 + 2, "step": 1}])
    assert w.source.data["time"] == []
    assert w.markers.data["time"] == []


def test_report_is_standalone_and_inline() -> None:
    page = report_html(run_events(), {"steps": 60, "accuracy": 0.4}, title="a <run>")
    assert "a &lt;run&gt;" in page
    assert "cdn.bokeh.org" not in page  # BokehJS inline: the report works offline
    assert "Bokeh" in page


def test_the_cost_figure_shows_what_the_policy_expects_next_to_the_bill() -> None:
    """The latest policy decision's expected end (its ETA on the cluster's clock, turned into
    wall seconds, and the bill then plus what it expects to spend) is drawn beside the curve."""
    events = run_events()
    events[0] = {**events[0], "time_scale": 4.0}  # 4 simulated seconds a wall second
    decision = {
        "kind": "policy-decision",
        "goal": "deadline",
        "eta_s": 400.0,
        "expected_cost": 1.25,
        "reason": "3 t4 in us-central1-a, 1 PS shard: ETA 0.11 h",
    }
    events.append({**decision, "time": T0 + 12, "eta_s": None, "expected_cost": None})
    figs = RunFigures()
    figs.update(events)
    assert figs.cost.projection.data["x1"] == []  # nothing finishes: no end drawn
    events.append({**decision, "time": T0 + 20, "eta_s": 800.0, "expected_cost": 2.0})
    events.append({**decision, "time": T0 + 30})
    figs.update(events)
    p = figs.cost.projection.data
    spent = compute_costs(events, now=T0 + 30, minimum_s=60).total
    assert p["x0"] == [30.0] and p["x1"] == [30.0 + 400.0 / 4.0]  # only the latest
    assert p["y0"] == [pytest.approx(spent)] and p["y1"] == [pytest.approx(spent + 1.25)]
    assert p["reason"] == [decision["reason"]]


def test_a_runs_own_metrics_get_a_live_figure_and_accuracy_hides_without_it() -> None:
    from transient_nb.notebook.views.figures import RunFigures

    figs = RunFigures(t0=0.0)
    started = {"kind": "train-started", "time": 0.0, "run": "r", "metrics": ("mae", "mse")}
    first = {"kind": "eval", "time": 1.0, "run": "r", "step": 10, "accuracy": None,
             "metrics": {"mae": 0.9, "mse": 1.2}}  # fmt: skip
    figs.update([started, first])
    acc = figs.accuracy
    assert acc.metrics_fig.visible and not acc.acc_fig.visible
    lines = [r.glyph.y for r in acc.metrics_fig.renderers if type(r.glyph).__name__ == "Line"]
    assert lines == ["mae", "mse"]
    second = {**first, "time": 2.0, "step": 20, "metrics": {"mae": 0.5, "mse": 0.6}}
    figs.update([started, first, second])
    assert acc.metrics.data["mae"] == [0.9, 0.5] and acc.metrics.data["step"] == [10, 20]
    assert acc.acc.data["accuracy"] == []
    # A built-in run: the accuracy figure, no metrics figure.
    plain = RunFigures(t0=0.0)
    plain.update([{"kind": "eval", "time": 1.0, "step": 5, "accuracy": 0.5, "test_loss": 1.0}])
    assert plain.accuracy.acc_fig.visible and not plain.accuracy.metrics_fig.visible
