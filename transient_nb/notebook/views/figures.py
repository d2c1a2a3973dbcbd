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
from bokeh.models import ColumnDataSource, HoverTool, Range1d
from bokeh.plotting import figure

from transient_nb.catalog.prices import BILLING_MINIMUM_S
from transient_nb.eventlog.bill import Bill
from transient_nb.eventlog.folds import eval_metrics

ROLLOVER = 100_000
#: Most cost points one update adds (a whole run fed at once stays a readable curve).
MAX_COST_POINTS = 200
Event = Mapping[str, Any]

#: Marker and colour of each lifecycle event drawn on the workers figure.
MARKERS = {
    "notice": ("triangle", "#e6a700"),
    "preempted": ("x", "#d62728"),
    "replacement-requested": ("square", "#17becf"),
    "spare-requested": ("diamond", "#9467bd"),
    "joined": ("circle", "#2ca02c"),
}
#: Events that change the bill (the others cost the cost curve nothing).
BILLING_KINDS = frozenset({"started", "requested", "running", "preempted", "deleted", "closed"})
GPU_COLORS = ["#1f77b4", "#ff7f0e", "#9467bd", "#8c564b", "#17becf", "#7f7f7f"]


def time_figure(title: str, height: int, width: int, **options: Any) -> Any:
    """A figure over the time axis every component shares (seconds), with the usual tools."""
    return figure(
        title=title,
        height=height,
        width=width,
        x_axis_label="seconds",
        tools="pan,wheel_zoom,reset,save",
        **options,
    )


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

    def _stream(
        self,
        source: ColumnDataSource,
        events: Sequence[Event],
        fields: Sequence[str],
        more: Mapping[str, list[Any]] | None = None,
    ) -> None:
        """Stream a row per event into ``source``: its time on this axis, its ``fields``, and
        the columns in ``more``."""
        rows = {"time": [self._t(e) for e in events], **{f: [e[f] for e in events] for f in fields}}
        source.stream({**rows, **(more or {})}, rollover=ROLLOVER)


#: Colours of a run's own metrics, in the order they appear.
METRIC_COLORS = ["#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22"]


class AccuracyLoss(Component):
    """Test accuracy (evaluations), training loss (PS metrics) and every further metric of the
    run (a user's ``metrics=``, one line each, on a figure of their own) over time.

    The accuracy figure shows only where accuracy is a metric of the run (its
    ``train-started`` event lists a user's metrics; the built-in runs have accuracy).
    """

    def __init__(self, t0: float | None = None, height: int = 260, width: int = 480):
        super().__init__(t0)
        # Names let tests and browser scripts find the sources in a rendered document.
        self.acc = ColumnDataSource({"time": [], "accuracy": [], "step": []}, name="accuracy")
        self.loss = ColumnDataSource({"time": [], "loss": [], "step": []}, name="loss")
        self.source = self.acc
        acc_fig = time_figure("Test accuracy", height, width, y_range=Range1d(start=0, end=1))
        acc_fig.line("time", "accuracy", source=self.acc, line_width=2, color="#2ca02c")
        acc_fig.scatter("time", "accuracy", source=self.acc, size=6, color="#2ca02c")
        acc_fig.add_tools(HoverTool(tooltips=[("step", "@step"), ("accuracy", "@accuracy{0.000}")]))
        loss_fig = time_figure("Training loss", height, width)
        loss_fig.line("time", "loss", source=self.loss, line_width=2, color="#1f77b4")
        loss_fig.add_tools(HoverTool(tooltips=[("step", "@step"), ("loss", "@loss{0.000}")]))
        self.metrics = ColumnDataSource({"time": [], "step": []}, name="metrics")
        metrics_fig = time_figure("Test metrics", height, width, visible=False)
        self.acc_fig, self.loss_fig, self.metrics_fig = acc_fig, loss_fig, metrics_fig
        self.root = row(acc_fig, loss_fig, metrics_fig)

    def _metric_line(self, name: str) -> None:
        """A line (and a column) for a metric seen for the first time."""
        n = len(self.metrics.data["time"])
        self.metrics.data = {**self.metrics.data, name: [float("nan")] * n}
        color = METRIC_COLORS[(len(self.metrics.data) - 3) % len(METRIC_COLORS)]
        self.metrics_fig.line(
            "time", name, source=self.metrics, line_width=2, color=color, legend_label=name
        )
        self.metrics_fig.scatter("time", name, source=self.metrics, size=5, color=color)
        self.metrics_fig.visible = True

    def _update(self, events: Sequence[Event], new: Sequence[Event]) -> None:
        for e in new:
            # (A list in a run record, a tuple as msgpack brings it from the scheduler.)
            if e.get("kind") == "train-started" and isinstance(e.get("metrics"), (list, tuple)):
                self.acc_fig.visible = "accuracy" in e["metrics"]
        acc = [e for e in new if e.get("kind") == "eval" and e.get("accuracy") is not None]
        loss = [e for e in new if e.get("kind") == "metrics"]
        more = [
            (e, {k: v for k, v in eval_metrics(e).items() if k != "accuracy"})
            for e in new
            if e.get("kind") == "eval"
        ]
        more = [(e, m) for e, m in more if m]
        if more:
            for _, m in more:
                for name in m:
                    if name not in self.metrics.data:
                        self._metric_line(name)
            names = [k for k in self.metrics.data if k not in ("time", "step")]
            self._stream(
                self.metrics,
                [e for e, _ in more],
                ("step",),
                {k: [m.get(k, float("nan")) for _, m in more] for k in names},
            )
        if acc:
            self._stream(self.acc, acc, ("accuracy", "step"))
        if loss:
            self._stream(self.loss, loss, ("loss", "step"))


#: The cost figure's three lines, by legend label: what happens is solid, the on-demand
#: counterfactual dashed, the policy's expectation dotted.
_COST_LINES: dict[str, dict[str, Any]] = {
    label: {"line_width": 2, "color": color, "line_dash": dash, "legend_label": label}
    for label, color, dash in (
        ("on demand", "#7f7f7f", "dashed"),
        ("actual", "#d62728", "solid"),
        ("policy expects", "#9467bd", "dotted"),
    )
}


class Cost(Component):
    """Cumulative dollars: actual (Spot) against the on-demand counterfactual, and, while a
    transient-aware policy is on, what its latest decision expects: a dotted line from the
    bill at the decision to the expected total at the expected end of the run."""

    def __init__(
        self,
        t0: float | None = None,
        height: int = 260,
        width: int = 480,
        minimum_s: float = BILLING_MINIMUM_S,
    ):
        super().__init__(t0)
        self.minimum_s = minimum_s
        # The bill, kept event by event (transient_nb.eventlog.folds): a point costs a walk over the VMs
        # running then, not over the log.
        self.bill = Bill(minimum_s)
        self.source = ColumnDataSource({"time": [], "cost": [], "on_demand": []}, name="cost")
        fig = time_figure("Cost (USD)", height, width)
        on_demand = fig.line("time", "on_demand", source=self.source, **_COST_LINES["on demand"])
        actual = fig.line("time", "cost", source=self.source, **_COST_LINES["actual"])
        # The policy's latest expectation only (rollover 1): next to what actually happens.
        self.projection = ColumnDataSource(
            {"x0": [], "y0": [], "x1": [], "y1": [], "reason": []}, name="policy-projection"
        )
        fig.segment("x0", "y0", "x1", "y1", source=self.projection, **_COST_LINES["policy expects"])
        end = fig.scatter(
            "x1", "y1", source=self.projection, marker="diamond", size=10, color="#9467bd"
        )
        fig.legend.location = "top_left"
        fig.add_tools(
            HoverTool(
                renderers=[actual, on_demand],
                tooltips=[("actual", "$@cost{0.0000}"), ("on demand", "$@on_demand{0.0000}")],
            ),
            HoverTool(
                renderers=[end],
                tooltips=[("policy", "@reason"), ("expected in all", "$@y1{0.0000}")],
            ),
        )
        self.root = fig

    def _update(self, events: Sequence[Event], new: Sequence[Event]) -> None:
        times = sorted({float(e["time"]) for e in new})
        # A point per new event time (enough for a step-wise cumulative curve), thinned to at most
        # MAX_COST_POINTS evenly spread ones so that a whole run fed at once stays light.
        if len(times) > MAX_COST_POINTS:
            stride = len(times) / MAX_COST_POINTS
            times = [times[int(i * stride)] for i in range(MAX_COST_POINTS)] + [times[-1]]
        wanted = set(times)
        points: list[tuple[float, float, float]] = []
        for e in new:
            if e.get("kind") in BILLING_KINDS:
                self.bill.feed(e)
            elif e.get("kind") == "policy-decision":
                self._project(e)
            t = float(e["time"])
            if t in wanted:  # the bill as it stood when this event happened
                wanted.discard(t)
                total, on_demand, _, _ = self.bill.totals(now=t)
                points.append((t, total, on_demand))
        points.sort()
        self.source.stream(
            {
                "time": [self._t({"time": t}) for t, _, _ in points],
                "cost": [c for _, c, _ in points],
                "on_demand": [od for _, _, od in points],
            },
            rollover=ROLLOVER,
        )

    def _project(self, e: Event) -> None:
        """The decision's expected end: its ETA (the cluster's clock, so divided by the time
        scale on this wall-clock axis) and the bill then plus the money it expects to spend."""
        eta_s, expected = e.get("eta_s"), e.get("expected_cost")
        if eta_s is None or expected is None:
            return  # nothing it could choose finishes: no end to draw
        t = float(e["time"])
        spent = self.bill.totals(now=t)[0]
        self.projection.stream(
            {
                "x0": [self._t(e)],
                "y0": [spent],
                "x1": [self._t(e) + float(eta_s) / self.bill.time_scale],
                "y1": [spent + float(expected)],
                "reason": [str(e.get("reason", ""))],
            },
            rollover=1,
        )

    def tick(self, events: Sequence[Event], now: float) -> None:
        """Add a point at ``now`` (costs grow between events too)."""
        total, on_demand, _, _ = self.bill.totals(now=now)
        self.source.stream(
            {"time": [self._t({"time": now})], "cost": [total], "on_demand": [on_demand]},
            rollover=ROLLOVER,
        )


class Workers(Component):
    """Active GPU workers over time, in total and by GPU type, with a marker per notice,
    preemption, replacement and join (hover tells which worker and why)."""

    def __init__(self, t0: float | None = None, height: int = 260, width: int = 480):
        super().__init__(t0)
        self.active: dict[str, str] = {}  # worker -> gpu of those joined and not gone
        self.source = ColumnDataSource({"time": [], "active": []}, name="workers")
        #: One source per GPU type, created when the type first joins (fallback GPU types can
        #: appear mid-run).
        self.by_gpu: dict[str, ColumnDataSource] = {}
        self.markers = ColumnDataSource(
            {
                "time": [],
                "y": [],
                "kind": [],
                "worker": [],
                "gpu": [],
                "detail": [],
                "marker": [],
                "color": [],
            },
            name="markers",
        )
        fig = time_figure("Active workers", height, width)
        fig.step(
            "time",
            "active",
            source=self.source,
            mode="after",
            line_width=2,
            color="#1f77b4",
            legend_label="all",
        )
        glyph = fig.scatter(
            "time", "y", source=self.markers, marker="marker", color="color", size=10
        )
        fig.add_tools(
            HoverTool(
                renderers=[glyph],
                tooltips=[
                    ("event", "@kind"),
                    ("worker", "@worker"),
                    ("GPU", "@gpu"),
                    ("", "@detail"),
                ],
            )
        )
        fig.legend.location = "top_left"
        fig.legend.click_policy = "hide"
        self.fig = fig
        self.root = fig

    def _gpu_source(self, gpu: str) -> ColumnDataSource:
        src = self.by_gpu.get(gpu)
        if src is None:
            src = self.by_gpu[gpu] = ColumnDataSource(
                {"time": [], "active": []}, name=f"workers-{gpu}"
            )
            color = GPU_COLORS[(len(self.by_gpu)) % len(GPU_COLORS)]
            self.fig.step(
                "time",
                "active",
                source=src,
                mode="after",
                line_width=1.5,
                line_dash="dashed",
                color=color,
                legend_label=gpu,
            )
        return src

    @staticmethod
    def _detail(e: Event) -> str:
        kind = e.get("kind")
        if kind == "notice":
            return f"notice from {e.get('source', '?')}"
        if kind == "preempted":
            how = "after its notice" if e.get("notice") else "without notice"
            return f"preempted {how} ({e.get('source', '?')})"
        if kind == "replacement-requested":
            return "a replacement was requested"
        if kind == "spare-requested":
            return (
                f"a spare was requested ({100 * float(e.get('odds') or 0):.0f}% odds of revocation)"
            )
        return str(kind)

    def _update(self, events: Sequence[Event], new: Sequence[Event]) -> None:
        rows: dict[str, Any] = {"time": [], "active": []}
        per_gpu: dict[str, dict[str, Any]] = {}
        marks: dict[str, Any] = {k: [] for k in self.markers.data}
        for e in new:
            kind, name = e.get("kind"), e.get("worker")
            if e.get("role") != "worker" or not name:
                continue
            changed: set[str] = set()
            if kind == "joined":
                gpu = str(e.get("gpu"))
                self.active[name] = gpu
                changed.add(gpu)
            elif kind in ("left", "preempted", "deleted"):
                gone = self.active.pop(name, None)
                if gone is not None:
                    changed.add(gone)
            elif kind not in MARKERS:
                continue
            t = self._t(e)
            rows["time"].append(t)
            rows["active"].append(len(self.active))
            for gpu in changed:
                cols = per_gpu.setdefault(gpu, {"time": [], "active": []})
                cols["time"].append(t)
                cols["active"].append(sum(1 for g in self.active.values() if g == gpu))
            if kind in MARKERS:
                marker, color = MARKERS[kind]
                for k, v in (
                    ("time", t),
                    ("y", len(self.active)),
                    ("kind", kind),
                    ("worker", name),
                    ("gpu", str(e.get("gpu"))),
                    ("detail", self._detail(e)),
                    ("marker", marker),
                    ("color", color),
                ):
                    marks[k].append(v)
        if rows["time"]:
            self.source.stream(rows, rollover=ROLLOVER)
        for gpu, cols in per_gpu.items():
            self._gpu_source(gpu).stream(cols, rollover=ROLLOVER)
        if marks["time"]:
            self.markers.stream(marks, rollover=ROLLOVER)


class Throughput(Component):
    """Images per second of every worker (one dot per report; hover tells which worker)."""

    def __init__(self, t0: float | None = None, height: int = 260, width: int = 480):
        super().__init__(t0)
        self.colors: dict[str, str] = {}
        self.source = ColumnDataSource(
            {"time": [], "img_per_s": [], "worker": [], "color": []}, name="throughput"
        )
        fig = time_figure("Throughput per worker (images/s)", height, width)
        fig.scatter("time", "img_per_s", source=self.source, color="color", size=6)
        fig.add_tools(HoverTool(tooltips=[("worker", "@worker"), ("images/s", "@img_per_s{0}")]))
        self.root = fig

    def _update(self, events: Sequence[Event], new: Sequence[Event]) -> None:
        rows = [e for e in new if e.get("kind") == "worker-metrics"]
        if not rows:
            return
        for e in rows:
            self.colors.setdefault(e["worker"], GPU_COLORS[len(self.colors) % len(GPU_COLORS)])
        self._stream(
            self.source,
            rows,
            ("img_per_s", "worker"),
            {"color": [self.colors[e["worker"]] for e in rows]},
        )


class RunFigures:
    """The figure group of a run: accuracy and loss, cost, workers, throughput.

    Every figure shares one time axis (seconds since ``t0``; the first event's time when not
    given), so that panning one pans them all.

    Examples
    --------
    >>> figs = RunFigures(t0=0.0)
    >>> figs.update([{"kind": "metrics", "time": 1.0, "step": 10, "loss": 2.0}])
    >>> len(figs.accuracy.loss.data["step"])
    1
    """

    def __init__(self, t0: float | None = None, minimum_s: float = BILLING_MINIMUM_S):
        self.accuracy = AccuracyLoss(t0)
        self.cost = Cost(t0, minimum_s=minimum_s)
        self.workers = Workers(t0)
        self.throughput = Throughput(t0)
        self.components: list[Component] = [self.accuracy, self.cost, self.workers, self.throughput]
        shared = self.accuracy.acc_fig.x_range
        for fig in (
            self.accuracy.loss_fig,
            self.accuracy.metrics_fig,
            self.cost.root,
            self.workers.root,
            self.throughput.root,
        ):
            fig.x_range = shared
        self.root = column(
            self.accuracy.root, row(self.cost.root, self.workers.root), self.throughput.root
        )

    @property
    def t0(self) -> float | None:
        """Time (UNIX seconds) of the origin of the time axis, once known."""
        return self.accuracy.t0

    def update(self, events: Sequence[Event]) -> None:
        """Stream whatever is new in ``events`` into every figure."""
        if events:
            t0 = next((c.t0 for c in self.components if c.t0 is not None), None)
            if t0 is None:
                t0 = float(events[0]["time"])
            for c in self.components:
                if c.t0 is None:
                    c.t0 = t0
        for c in self.components:
            c.update(events)

    def tick(self, events: Sequence[Event], now: float) -> None:
        """Move the cost curve to ``now`` (dollars grow between events)."""
        if self.cost.t0 is not None:
            self.cost.tick(events, now)
