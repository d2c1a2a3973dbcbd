"""Bokeh figures of a run, one component per plot, fed from the event log.

Each component owns a ``source`` (ColumnDataSource) and a ``root`` (the figure) and has
``update(events)``, which reads the events it has not seen yet and *streams* the new rows
(``source.stream(rows, rollover)``), never redraws, as distributed's dashboard components do. The
same components make the live notebook dashboard (driven by a periodic callback) and the
standalone HTML report of a run (fed once, saved with BokehJS inline).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bokeh.layouts import column, row
from bokeh.models import ColumnDataSource, HoverTool
from bokeh.plotting import figure

from transient_nb.cost import compute_costs

ROLLOVER = 100_000
Event = Mapping[str, Any]

MARKERS = {
    "notice": ("triangle", "#e6a700"),
    "preempted": ("x", "#d62728"),
    "joined": ("circle", "#2ca02c"),
}
GPU_COLORS = ["#1f77b4", "#ff7f0e", "#9467bd", "#8c564b", "#17becf", "#7f7f7f"]


class Component:
    """A plot that follows the event log."""

    root: Any

    def __init__(self, t0: float | None = None):
        self.t0 = t0
        self.seen = 0

    def _t(self, e: Event) -> float:
        if self.t0 is None:
            self.t0 = float(e["time"])
        return float(e["time"]) - self.t0

    def update(self, events: Sequence[Event]) -> None:
        """Stream the rows for ``events[self.seen:]``."""
        new = events[self.seen :]
        self.seen = len(events)
        if new:
            self._update(events, new)

    def _update(self, events: Sequence[Event], new: Sequence[Event]) -> None:
        raise NotImplementedError


class AccuracyLoss(Component):
    """Test accuracy (evaluations) and training loss (PS metrics) over time."""

    def __init__(self, t0: float | None = None, height: int = 260, width: int = 480):
        super().__init__(t0)
        self.acc = ColumnDataSource({"time": [], "accuracy": [], "step": []})
        self.loss = ColumnDataSource({"time": [], "loss": [], "step": []})
        self.source = self.acc
        acc_fig = figure(
            title="Test accuracy",
            height=height,
            width=width,
            x_axis_label="seconds",
            y_range=(0, 1),
            tools="pan,wheel_zoom,reset,save",
        )
        acc_fig.line("time", "accuracy", source=self.acc, line_width=2, color="#2ca02c")
        acc_fig.scatter("time", "accuracy", source=self.acc, size=6, color="#2ca02c")
        acc_fig.add_tools(HoverTool(tooltips=[("step", "@step"), ("accuracy", "@accuracy{0.000}")]))
        loss_fig = figure(
            title="Training loss",
            height=height,
            width=width,
            x_axis_label="seconds",
            tools="pan,wheel_zoom,reset,save",
        )
        loss_fig.line("time", "loss", source=self.loss, line_width=2, color="#1f77b4")
        loss_fig.add_tools(HoverTool(tooltips=[("step", "@step"), ("loss", "@loss{0.000}")]))
        self.acc_fig, self.loss_fig = acc_fig, loss_fig
        self.root = row(acc_fig, loss_fig)

    def _update(self, events: Sequence[Event], new: Sequence[Event]) -> None:
        acc = [e for e in new if e.get("kind") == "eval"]
        loss = [e for e in new if e.get("kind") == "metrics"]
        if acc:
            self.acc.stream(
                {
                    "time": [self._t(e) for e in acc],
                    "accuracy": [e["accuracy"] for e in acc],
                    "step": [e["step"] for e in acc],
                },
                rollover=ROLLOVER,
            )
        if loss:
            self.loss.stream(
                {
                    "time": [self._t(e) for e in loss],
                    "loss": [e["loss"] for e in loss],
                    "step": [e["step"] for e in loss],
                },
                rollover=ROLLOVER,
            )


class Cost(Component):
    """Cumulative dollars: actual (Spot) against the on-demand counterfactual."""

    def __init__(
        self, t0: float | None = None, height: int = 260, width: int = 480, minimum_s: float = 60.0
    ):
        super().__init__(t0)
        self.minimum_s = minimum_s
        self.source = ColumnDataSource({"time": [], "cost": [], "on_demand": []})
        fig = figure(
            title="Cost (USD)",
            height=height,
            width=width,
            x_axis_label="seconds",
            tools="pan,wheel_zoom,reset,save",
        )
        fig.line(
            "time",
            "on_demand",
            source=self.source,
            line_width=2,
            color="#7f7f7f",
            line_dash="dashed",
            legend_label="on demand",
        )
        fig.line(
            "time", "cost", source=self.source, line_width=2, color="#d62728", legend_label="actual"
        )
        fig.legend.location = "top_left"
        fig.add_tools(
            HoverTool(tooltips=[("actual", "$@cost{0.0000}"), ("on demand", "$@on_demand{0.0000}")])
        )
        self.root = fig

    def _update(self, events: Sequence[Event], new: Sequence[Event]) -> None:
        times = sorted({float(e["time"]) for e in new})
        # A point per new event time (enough for a step-wise cumulative curve).
        rows: dict[str, list[float]] = {"time": [], "cost": [], "on_demand": []}
        for t in times[-50:]:
            upto = [e for e in events if float(e["time"]) <= t]
            report = compute_costs(upto, now=t, minimum_s=self.minimum_s)
            rows["time"].append(self._t({"time": t}))
            rows["cost"].append(report.total)
            rows["on_demand"].append(report.total_on_demand)
        self.source.stream(rows, rollover=ROLLOVER)

    def tick(self, events: Sequence[Event], now: float) -> None:
        """Add a point at ``now`` (costs grow between events too)."""
        report = compute_costs(events, now=now, minimum_s=self.minimum_s)
        self.source.stream(
            {
                "time": [self._t({"time": now})],
                "cost": [report.total],
                "on_demand": [report.total_on_demand],
            },
            rollover=ROLLOVER,
        )


class Workers(Component):
    """Active GPU workers over time, by GPU type, with a marker per notice, preemption and join."""

    def __init__(self, t0: float | None = None, height: int = 260, width: int = 480):
        super().__init__(t0)
        self.active: dict[str, str] = {}  # worker -> gpu of those joined and not gone
        self.source = ColumnDataSource({"time": [], "active": []})
        self.markers = ColumnDataSource(
            {"time": [], "y": [], "kind": [], "worker": [], "gpu": [], "marker": [], "color": []}
        )
        fig = figure(
            title="Active workers",
            height=height,
            width=width,
            x_axis_label="seconds",
            tools="pan,wheel_zoom,reset,save",
        )
        fig.step("time", "active", source=self.source, mode="after", line_width=2, color="#1f77b4")
        glyph = fig.scatter(
            "time", "y", source=self.markers, marker="marker", color="color", size=10
        )
        fig.add_tools(
            HoverTool(
                renderers=[glyph],
                tooltips=[("event", "@kind"), ("worker", "@worker"), ("GPU", "@gpu")],
            )
        )
        self.root = fig

    def _update(self, events: Sequence[Event], new: Sequence[Event]) -> None:
        rows: dict[str, list[Any]] = {"time": [], "active": []}
        marks: dict[str, list[Any]] = {k: [] for k in self.markers.data}
        for e in new:
            kind, name = e.get("kind"), e.get("worker")
            if e.get("role") != "worker" or not name:
                continue
            if kind == "joined":
                self.active[name] = str(e.get("gpu"))
            elif kind in ("left", "preempted", "deleted"):
                self.active.pop(name, None)
            else:
                if kind != "notice":
                    continue
            t = self._t(e)
            rows["time"].append(t)
            rows["active"].append(len(self.active))
            if kind in MARKERS:
                marker, color = MARKERS[kind]
                for k, v in (
                    ("time", t),
                    ("y", len(self.active)),
                    ("kind", kind),
                    ("worker", name),
                    ("gpu", e.get("gpu")),
                    ("marker", marker),
                    ("color", color),
                ):
                    marks[k].append(v)
        if rows["time"]:
            self.source.stream(rows, rollover=ROLLOVER)
        if marks["time"]:
            self.markers.stream(marks, rollover=ROLLOVER)


class Throughput(Component):
    """Images per second of every worker (one dot per report; hover tells which worker)."""

    def __init__(self, t0: float | None = None, height: int = 260, width: int = 480):
        super().__init__(t0)
        self.colors: dict[str, str] = {}
        self.source = ColumnDataSource({"time": [], "img_per_s": [], "worker": [], "color": []})
        fig = figure(
            title="Throughput per worker (images/s)",
            height=height,
            width=width,
            x_axis_label="seconds",
            tools="pan,wheel_zoom,reset,save",
        )
        fig.scatter("time", "img_per_s", source=self.source, color="color", size=6)
        fig.add_tools(HoverTool(tooltips=[("worker", "@worker"), ("images/s", "@img_per_s{0}")]))
        self.root = fig

    def _update(self, events: Sequence[Event], new: Sequence[Event]) -> None:
        rows = [e for e in new if e.get("kind") == "worker-metrics"]
        if not rows:
            return
        for e in rows:
            self.colors.setdefault(e["worker"], GPU_COLORS[len(self.colors) % len(GPU_COLORS)])
        self.source.stream(
            {
                "time": [self._t(e) for e in rows],
                "img_per_s": [e["img_per_s"] for e in rows],
                "worker": [e["worker"] for e in rows],
                "color": [self.colors[e["worker"]] for e in rows],
            },
            rollover=ROLLOVER,
        )


class RunFigures:
    """The figure group of a run: accuracy and loss, cost, workers, throughput."""

    def __init__(self, t0: float | None = None, minimum_s: float = 60.0):
        self.accuracy = AccuracyLoss(t0)
        self.cost = Cost(t0, minimum_s=minimum_s)
        self.workers = Workers(t0)
        self.throughput = Throughput(t0)
        self.components: list[Component] = [self.accuracy, self.cost, self.workers, self.throughput]
        self.root = column(
            self.accuracy.root, row(self.cost.root, self.workers.root), self.throughput.root
        )

    def update(self, events: Sequence[Event]) -> None:
        """Stream whatever is new in ``events`` into every figure."""
        for c in self.components:
            if self.accuracy.t0 is not None:
                c.t0 = self.accuracy.t0 if c.t0 is None else c.t0
            c.update(events)
