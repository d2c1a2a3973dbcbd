"""The notebook control panel of a transient cluster (and of its training run), in ipywidgets.

:class:`ClusterPanel` composes stock ipywidgets: a table of the cluster's VMs (name, GPU, zone, Spot
or on-demand, lifecycle state and time in it, dollars so far), the totals (dollars per hour now,
dollars so far, the on-demand counterfactual, the fraction saved), buttons to scale, to preempt the
selected worker and to stop, and for a training run its progress (step of the target, accuracy,
images per second, ETA and projected cost at the current pace).

Everything it shows is computed from the cluster's event log (``cluster.monitor.events``), never by
asking the trainers. A light periodic callback on the *cluster's* event loop (the thread where the
scheduler appends events, so it reads a list nobody else writes at the same time) refreshes the
panel within a quarter of a second of an event, and keeps doing so while a notebook cell blocks the
kernel's own loop (``run.wait()``).
"""

from __future__ import annotations

import html
import inspect
import logging
import math
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import ipywidgets as widgets
import pandas as pd

from transient_nb.cost import CostReport, compute_costs
from transient_nb.events import LIFECYCLE, vm_states

logger = logging.getLogger(__name__)

Event = Mapping[str, Any]

#: Events the panel's VM table and bill are computed from (everything else is training metrics).
TABLE_KINDS = frozenset({*LIFECYCLE, "started", "scale", "closed"})
#: Lifecycle states after which a VM is gone (kept in the table, greyed, for a while).
GONE_STATES = ("preempted", "deleted")
#: How many gone VMs the table keeps: enough to see the last preemptions, bounded for long runs.
MAX_GONE_ROWS = 6
#: Window over which the training pace (and so the ETA) is measured, in wall-clock seconds.
PACE_WINDOW_S = 30.0


# -- the live loop ---------------------------------------------------------------------------------
class Ticker:
    """Calls ``fn()`` every ``interval_s`` seconds on ``loop`` (a Tornado IOLoop) until stopped.

    ``fn`` runs in the loop's thread; when it returns an awaitable, that is awaited before the
    next tick. An exception is logged, never raised into the loop; after
    ``max_errors`` in a row the ticker stops, so a broken view cannot flood the log.

    Examples
    --------
    >>> ticker = Ticker(cluster.loop, panel.update, 0.25).start()  # doctest: +SKIP
    >>> ticker.stop()  # doctest: +SKIP
    """

    def __init__(
        self, loop: Any, fn: Callable[[], Any], interval_s: float = 0.25, max_errors: int = 20
    ):
        self.loop = loop
        self.fn = fn
        self.interval_s = interval_s
        self.max_errors = max_errors
        self.errors = 0
        self._pc: Any = None
        self._stopped = False

    @property
    def running(self) -> bool:
        """True while the periodic callback is scheduled and not asked to stop."""
        return not self._stopped and self._pc is not None and self._pc.is_running()

    def start(self) -> Ticker:
        """Start ticking (safe from any thread)."""
        self._stopped = False
        self._call(self._start)
        return self

    def _call(self, fn: Callable[[], Any]) -> None:
        if self.loop is None:
            return
        try:
            self.loop.add_callback(fn)
        except RuntimeError:  # the loop is closed: its callbacks died with it
            self._pc = None

    def _start(self) -> None:
        from tornado.ioloop import PeriodicCallback

        if self._stopped or self.running:
            return
        self._pc = PeriodicCallback(self._tick, self.interval_s * 1000)
        self._pc.start()

    def _tick(self) -> Any:
        if self._stopped:  # a stop whose callback was lost (e.g. the loop was stopping)
            self._stop()
            return None
        try:
            result = self.fn()
        except Exception:
            self._failed()
            return None
        if inspect.isawaitable(result):
            # PeriodicCallback awaits what its callback returns, and skips ticks meanwhile.
            return self._await(result)
        self.errors = 0
        return None

    async def _await(self, result: Any) -> None:
        try:
            await result
            self.errors = 0
        except Exception:
            self._failed()

    def _failed(self) -> None:
        self.errors += 1
        logger.exception("Live view update failed (%d in a row)", self.errors)
        if self.errors >= self.max_errors:
            self._stop()

    def _stop(self) -> None:
        if self._pc is not None:
            self._pc.stop()
            self._pc = None

    def stop(self) -> None:
        """Stop ticking (safe from any thread, also after the loop closed)."""
        self._stopped = True
        self._call(self._stop)


def event_log(cluster: Any) -> Sequence[Event]:
    """The live, append-only event list of ``cluster``.

    A :class:`~transient_nb.TransientCluster` keeps it in its scheduler plugin; a
    :class:`~transient_nb.connect.RemoteCluster` mirrors the owning scheduler's log under the
    same name.
    """
    return cluster.monitor.events


def is_closed(cluster: Any, events: Sequence[Event]) -> bool:
    """True once ``cluster`` is closed (by its status, or a ``closed`` event in its log)."""
    status = getattr(getattr(cluster, "status", None), "name", "running")
    if status in ("closed", "closing", "failed"):
        return True
    return bool(events) and events[-1].get("kind") == "closed"


# -- what the panel shows ----------------------------------------------------------------------------
@dataclass
class RunProgress:
    """Where a training run stands, computed from the event log alone.

    Attributes
    ----------
    run
        Run id (``run-...``).
    target
        Global steps the run trains for.
    step
        Global steps reached (last ``metrics``, or the final step once finished).
    accuracy
        Test accuracy of the last evaluation (0..1), if any.
    img_per_s
        Images per second of the whole cluster (last ``metrics``).
    steps_per_s
        Global steps per wall second over the last :data:`PACE_WINDOW_S`.
    eta_s
        Wall seconds to the target at that pace.
    state
        ``"running"`` or the reason it finished (``steps``, ``accuracy``, ``stopped``, ...).
    preemptions
        Worker preemptions since the run started.
    model, data
        What is trained, on what.
    """

    run: str
    target: int
    step: int = 0
    accuracy: float | None = None
    img_per_s: float | None = None
    steps_per_s: float | None = None
    eta_s: float | None = None
    state: str = "running"
    preemptions: int = 0
    model: str = ""
    data: str = ""
    started: float = 0.0

    def projected_cost(self, cost: CostReport) -> float | None:
        """Dollars when the target is reached at the current pace and spending rate."""
        if self.state != "running":
            return cost.total
        if self.eta_s is None:
            return None
        # The rate is per simulated hour; wall seconds become simulated ones through time_scale.
        return cost.total + cost.rate * self.eta_s * cost.time_scale / 3600.0


class RunTracker:
    """Follows one training run (or the latest one) through the event log, incrementally."""

    def __init__(self, run_id: str | None = None):
        self.run_id = run_id
        self.progress: RunProgress | None = None
        self._pace: deque[tuple[float, int]] = deque()

    def feed(self, new: Sequence[Event]) -> None:
        """Read events not seen before."""
        for e in new:
            kind = e.get("kind")
            if kind == "train-started":
                if self.run_id is None or e.get("run") == self.run_id:
                    self.progress = RunProgress(
                        run=str(e.get("run")),
                        target=int(e.get("steps") or 0),
                        model=str(e.get("model", "")),
                        data=str(e.get("data", "")),
                        started=float(e["time"]),
                    )
                    self._pace.clear()
                continue
            p = self.progress
            if p is None:
                continue
            if kind == "preempted" and e.get("role") == "worker":
                p.preemptions += 1
                continue
            if e.get("run") != p.run:
                continue
            if kind == "metrics":
                p.step = int(e.get("step", p.step))
                p.img_per_s = e.get("img_per_s")
                t = float(e["time"])
                self._pace.append((t, p.step))
                while len(self._pace) > 2 and t - self._pace[0][0] > PACE_WINDOW_S:
                    self._pace.popleft()
                (t0, s0) = self._pace[0]
                if t > t0 and p.step > s0:
                    p.steps_per_s = (p.step - s0) / (t - t0)
                    p.eta_s = max(0, p.target - p.step) / p.steps_per_s
            elif kind == "eval":
                p.accuracy = e.get("accuracy")
            elif kind == "train-finished":
                p.state = str(e.get("reason") or "finished")
                p.step = int(e.get("step") or p.step)
                if e.get("accuracy") is not None:
                    p.accuracy = e.get("accuracy")
                p.eta_s = 0.0


def _money(x: float | None, digits: int = 4) -> str:
    return "–" if x is None or not math.isfinite(x) else f"${x:,.{digits}f}"


def _duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "–"
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds // 60:.0f} min {seconds % 60:02.0f} s"
    return f"{seconds // 3600:.0f} h {seconds % 3600 // 60:02.0f} min"


def _flag(value: Any) -> bool:
    # Missing values in a DataFrame row are NaN, which is truthy.
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return False
    return bool(value)


def _worker_key(name: str) -> tuple[int, int, str]:
    role = 0 if name.startswith("ps-") else 1
    try:
        number = int(name.rsplit("-", 1)[1])
    except (IndexError, ValueError):
        number = 0
    return role, number, name


def vm_rows(
    events: Sequence[Event], minimum_s: float = 60.0, now: float | None = None
) -> tuple[list[dict[str, Any]], CostReport]:
    """The rows of the VM table and the bill, from lifecycle events.

    Parameters
    ----------
    events
        The run's events (lifecycle ones are enough).
    minimum_s
        Minimum billed seconds per VM (the price catalog's).
    now
        Wall-clock time of the times in state (default: now).

    Returns
    -------
    rows, cost
        One dict per VM (``name``, ``role``, ``gpu``, ``zone``, ``spot``, ``state``, ``since``,
        ``seconds_in_state``, ``cost``, ``gone``): every VM that is not gone, then the last
        :data:`MAX_GONE_ROWS` gone ones (preempted, deleted); and the
        :class:`~transient_nb.cost.CostReport`.

    Examples
    --------
    >>> rows, cost = vm_rows([])
    >>> rows, cost.total
    ([], 0.0)
    """
    now = time.time() if now is None else now
    cost = compute_costs(events, now=None, minimum_s=minimum_s)
    states = vm_states(events, now=now)
    rows: list[dict[str, Any]] = []
    for name, vm in states.iterrows():
        name = str(name)
        billed = cost.per_vm["cost"].get(name, 0.0) if not cost.per_vm.empty else 0.0
        role = str(vm.get("role") or "worker")
        gpu = vm.get("gpu")
        rows.append(
            {
                "name": name,
                "role": role,
                "gpu": "—" if role == "ps" or not isinstance(gpu, str) else gpu,
                "zone": str(vm.get("zone") or ""),
                "spot": _flag(vm.get("spot")),
                "state": str(vm["state"]),
                "since": float(vm["since"]),
                "seconds_in_state": float(vm["seconds_in_state"]),
                "cost": float(billed),
                "gone": str(vm["state"]) in GONE_STATES,
            }
        )
    live = sorted((r for r in rows if not r["gone"]), key=lambda r: _worker_key(r["name"]))
    gone = sorted((r for r in rows if r["gone"]), key=lambda r: r["since"])[-MAX_GONE_ROWS:]
    return live + sorted(gone, key=lambda r: _worker_key(r["name"])), cost


def _table_html(rows: Sequence[Mapping[str, Any]]) -> str:
    head = "".join(
        f"<th style='text-align:{a};padding:2px 10px'>{h}</th>"
        for h, a in (
            ("worker", "left"),
            ("GPU", "left"),
            ("zone", "left"),
            ("pricing", "left"),
            ("state", "left"),
            ("for", "right"),
            ("$ so far", "right"),
        )
    )
    body = []
    for r in rows:
        style = "opacity:0.45" if r["gone"] else ""
        state = r["state"]
        if state == "notice":
            state = f"<b style='color:#e6a700'>{state}</b>"
        elif state == "preempted":
            state = f"<span style='color:#d62728'>{state}</span>"
        pricing = "on-demand" if not r["spot"] else "spot"
        name = f"{html.escape(r['name'])}{' (PS)' if r['role'] == 'ps' else ''}"
        cells = [
            name,
            html.escape(r["gpu"]),
            html.escape(r["zone"]),
            pricing,
            state,
            _duration(r["seconds_in_state"]),
            _money(r["cost"]),
        ]
        tds = "".join(
            f"<td style='text-align:{'right' if i >= 5 else 'left'};padding:1px 10px'>{c}</td>"
            for i, c in enumerate(cells)
        )
        body.append(
            f"<tr class='transient-vm' data-worker='{html.escape(r['name'])}' style='{style}'>{tds}</tr>"
        )
    return (
        "<table class='transient-vms' style='border-collapse:collapse;font-size:90%'>"
        f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
    )


def _totals_html(cost: CostReport) -> str:
    return (
        f"<b>{_money(cost.rate, 3)}/h</b> now &middot; <b>{_money(cost.total)}</b> so far "
        f"&middot; on demand {_money(cost.total_on_demand)} &middot; "
        f"saved <b>{cost.saved_fraction:.0%}</b>"
    )


# -- the panel --------------------------------------------------------------------------------------
class ClusterPanel(widgets.VBox):
    """Live control panel of a transient cluster, and of a training run on it.

    Parameters
    ----------
    cluster
        A :class:`~transient_nb.TransientCluster`, or the handle :func:`~transient_nb.connect`
        returns for a cluster of another kernel.
    run
        A :class:`~transient_nb.TrainingRun` to follow (its progress, and a button to stop it);
        by default the panel follows the latest run it finds in the event log, without the stop
        button.
    interval
        Seconds between two looks at the event log.
    start
        Start following the log at once (tests may drive :meth:`update` by hand instead).

    Examples
    --------
    >>> from transient_nb import TransientCluster
    >>> from transient_nb.views.widgets import ClusterPanel
    >>> cluster = TransientCluster(workers=2)  # doctest: +SKIP
    >>> ClusterPanel(cluster)  # doctest: +SKIP
    """

    def __init__(self, cluster: Any, run: Any = None, interval: float = 0.25, start: bool = True):
        self.cluster = cluster
        self.run = run
        self.minimum_s = float(getattr(getattr(cluster, "catalog", None), "minimum_s", 60.0))
        self.rows: list[dict[str, Any]] = []
        self.cost: CostReport | None = None
        self.target: int | None = None
        self._seen = 0
        self._table_events: list[Event] = []
        self._tracker = RunTracker(getattr(run, "id", None))
        self._lock = threading.Lock()
        self._last_render = 0.0
        self._closed_seen = False

        self.header = widgets.HTML()
        self.totals = widgets.HTML()
        self.table = widgets.HTML()
        self.scale_down = widgets.Button(
            description="−1", tooltip="One GPU worker fewer", layout=widgets.Layout(width="44px")
        )
        self.workers_label = widgets.Label(layout=widgets.Layout(width="90px"))
        self.scale_up = widgets.Button(
            description="+1", tooltip="One GPU worker more", layout=widgets.Layout(width="44px")
        )
        self.worker_select = widgets.Dropdown(
            options=[], description="", layout=widgets.Layout(width="110px")
        )
        self.notice = widgets.Checkbox(
            value=True, description="notice", indent=False, layout=widgets.Layout(width="80px")
        )
        self.preempt_button = widgets.Button(
            description="Preempt",
            button_style="warning",
            tooltip="Preempt the selected worker, as the provider would",
            icon="bolt",
        )
        self.stop_button = widgets.Button(
            description="Shut down", button_style="danger", tooltip="Close the cluster", icon="stop"
        )
        self.message = widgets.HTML()
        controls = widgets.HBox(
            [
                self.scale_down,
                self.workers_label,
                self.scale_up,
                widgets.HTML("&nbsp;&nbsp;"),
                self.worker_select,
                self.notice,
                self.preempt_button,
                widgets.HTML("&nbsp;&nbsp;"),
                self.stop_button,
            ],
            layout=widgets.Layout(align_items="center", flex_flow="row wrap"),
        )
        self.progress = widgets.IntProgress(
            value=0, min=0, max=1, description="step", layout=widgets.Layout(width="420px")
        )
        self.run_info = widgets.HTML()
        self.stop_run_button = widgets.Button(
            description="Stop training",
            tooltip="Trainers stop after their current step",
            icon="stop",
        )
        run_children: list[widgets.Widget] = [
            widgets.HBox(
                [self.progress, self.run_info], layout=widgets.Layout(align_items="center")
            )
        ]
        if run is not None:
            run_children.append(self.stop_run_button)
        self.run_box = widgets.VBox(run_children, layout=widgets.Layout(display="none"))

        self.scale_up.on_click(lambda _: self._scale(+1))
        self.scale_down.on_click(lambda _: self._scale(-1))
        self.preempt_button.on_click(lambda _: self.preempt())
        self.stop_button.on_click(lambda _: self.shutdown())
        self.stop_run_button.on_click(lambda _: self.stop_run())
        super().__init__(
            [self.header, self.totals, self.table, controls, self.run_box, self.message],
            layout=widgets.Layout(padding="4px"),
        )
        self.add_class("transient-panel")
        self.update()
        self._ticker = Ticker(cluster.loop, self.update, interval)
        if start and not self._closed_seen:
            self._ticker.start()

    # -- reading the log ----------------------------------------------------------------------------
    def update(self, force: bool = False) -> bool:
        """Read new events and refresh what changed; returns whether anything was redrawn.

        Called by the periodic callback; safe to call from any thread.
        """
        with self._lock:
            events = event_log(self.cluster)
            n = len(events)
            new = events[self._seen : n]
            self._seen = n
            self._table_events.extend(e for e in new if e.get("kind") in TABLE_KINDS)
            for e in new:
                kind = e.get("kind")
                if kind in ("started", "scale"):
                    self.target = int(e.get("workers") or 0)
                elif kind == "control" and not e.get("ok"):
                    self._say(
                        f"The cluster refused {e.get('action')}: {e.get('error')}", error=True
                    )
            self._tracker.feed(new)
            closed = is_closed(self.cluster, events)
            now = time.time()
            # Money and times-in-state move between events too: redraw at least every second.
            if not (new or force or now - self._last_render >= 1.0 or closed):
                return False
            self._render(now, closed)
            self._last_render = now
            self._closed_seen = closed
        if closed and hasattr(self, "_ticker"):
            self._ticker.stop()  # nothing will change any more
        return True

    def _render(self, now: float, closed: bool) -> None:
        self.rows, self.cost = vm_rows(self._table_events, self.minimum_s, now)
        cost = self.cost
        workers = [r for r in self.rows if r["role"] == "worker" and not r["gone"]]
        joined = sum(1 for r in workers if r["state"] == "joined")
        name = html.escape(str(getattr(self.cluster, "name", "?")))
        status = "closed" if closed else "running"
        owner = "" if hasattr(self.cluster, "run_path") else " &middot; connected"
        self.header.value = (
            f"<b>{name}</b> &middot; {status}{owner} &middot; {joined} of {len(workers)} GPU "
            f"workers working"
        )
        self.totals.value = _totals_html(cost)
        self.table.value = _table_html(self.rows)
        self.workers_label.value = f"{self.target if self.target is not None else '?'} workers"
        choices = [r["name"] for r in workers if r["state"] in ("running", "joined")]
        if tuple(choices) != tuple(self.worker_select.options):
            keep = self.worker_select.value
            self.worker_select.options = choices
            self.worker_select.value = (
                keep if keep in choices else (choices[0] if choices else None)
            )
        for b in (self.scale_up, self.scale_down, self.preempt_button, self.stop_button):
            b.disabled = closed
        self.preempt_button.disabled = closed or not choices
        self._render_run(cost)

    def _render_run(self, cost: CostReport) -> None:
        p = self._tracker.progress
        if p is None:
            return
        self.run_box.layout.display = "flex"
        self.progress.max = max(1, p.target)
        self.progress.value = min(p.step, p.target)
        self.progress.bar_style = {
            "running": "info",
            "steps": "success",
            "accuracy": "success",
        }.get(p.state, "warning" if p.state != "error" else "danger")
        acc = f"{p.accuracy:.1%}" if p.accuracy is not None else "–"
        ips = f"{p.img_per_s:,.0f}" if p.img_per_s else "–"
        if p.state == "running":
            eta = _duration(p.eta_s)
            tail = (
                f"ETA <b>{eta}</b> &middot; projected cost to the target "
                f"<b>{_money(p.projected_cost(cost))}</b>"
            )
        else:
            tail = f"<b>finished</b> ({html.escape(p.state)})"
        self.run_info.value = (
            f"&nbsp;{p.step:,} / {p.target:,} &middot; accuracy <b>{acc}</b> &middot; "
            f"{ips} img/s &middot; {p.preemptions} preemptions &middot; {tail}"
        )
        self.stop_run_button.disabled = p.state != "running"

    # -- actions ---------------------------------------------------------------------------------------
    def _say(self, text: str, error: bool = False) -> None:
        color = "#d62728" if error else "inherit"
        self.message.value = f"<span style='color:{color}'>{html.escape(text)}</span>"

    def _act(self, what: str, fn: Callable[[], Any]) -> Any:
        try:
            result = fn()
        except Exception as e:  # shown in the panel: a button has nowhere else to raise to
            self._say(f"Could not {what}: {e}", error=True)
            return None
        return result

    def _scale(self, delta: int) -> None:
        current = (
            self.target
            if self.target is not None
            else len([r for r in self.rows if r["role"] == "worker" and not r["gone"]])
        )
        n = max(0, current + delta)
        done = self._act(f"scale to {n} workers", lambda: self.cluster.scale(n) or True)
        if done:
            self.target = n
            self.workers_label.value = f"{n} workers"
            self._say(f"Scaling to {n} GPU workers…")

    def preempt(self, worker: str | None = None, notice: bool | None = None) -> None:
        """Preempt ``worker`` (default: the selected one), as the preempt button does."""
        worker = worker or self.worker_select.value
        notice = self.notice.value if notice is None else notice
        if not worker:
            self._say("No worker to preempt: none is running.", error=True)
            return
        how = "with its notice" if notice else "without notice"
        self._say(f"Preempting {worker} ({how})…")
        self._act(f"preempt {worker}", lambda: self.cluster.preempt(worker, notice=notice))

    def shutdown(self) -> None:
        """Close the cluster (a connected one: ask the kernel that owns it to close it)."""
        self._say("Shutting down…")
        stop = getattr(self.cluster, "shutdown", None) or self.cluster.close
        self._act("shut down", stop)
        self.update(force=True)

    def stop_run(self) -> None:
        """Stop the training run (trainers stop after their current step)."""
        if self.run is not None:
            self._say("Stopping the training run…")
            self._act("stop the run", lambda: self.run.stop(wait=False))

    def stop(self) -> None:
        """Stop following the event log (the panel keeps what it shows)."""
        self._ticker.stop()

    def close(self) -> None:
        """Stop following the log and close the widgets."""
        self._ticker.stop()
        for w in [self, *self._all_children()]:
            widgets.Widget.close(w)

    def _all_children(self) -> list[widgets.Widget]:
        out: list[widgets.Widget] = []
        stack: list[Any] = list(self.children)
        while stack:
            w = stack.pop()
            out.append(w)
            stack.extend(getattr(w, "children", ()))
        return out

    def __repr__(self) -> str:
        name = getattr(self.cluster, "name", "?")
        if self.cost is None:
            return f"<ClusterPanel {name}>"
        live = sum(1 for r in self.rows if r["role"] == "worker" and not r["gone"])
        return (
            f"<ClusterPanel {name}: {live} GPU workers, {_money(self.cost.total)} so far, "
            f"saved {self.cost.saved_fraction:.0%}>"
        )


#: One panel per cluster or run, so that displaying an object twice shows the same live panel.
_panels: weakref.WeakKeyDictionary[Any, ClusterPanel] = weakref.WeakKeyDictionary()


def panel_for(obj: Any) -> ClusterPanel:
    """The control panel of a cluster or of a training run (created once, then reused).

    Parameters
    ----------
    obj
        A cluster (or connected handle), or a :class:`~transient_nb.TrainingRun`, whose panel
        follows that run.

    Examples
    --------
    >>> panel_for(cluster)  # doctest: +SKIP
    """
    panel = _panels.get(obj)
    if panel is None:
        if hasattr(obj, "cluster") and hasattr(obj, "hp"):  # a TrainingRun
            panel = ClusterPanel(obj.cluster, run=obj)
        else:
            panel = ClusterPanel(obj)
        _panels[obj] = panel
    return panel


# -- the status table ---------------------------------------------------------------------------------
@dataclass
class ClusterStatus:
    """A compact status of a cluster: workers by state, GPU and zone, and the money.

    Attributes
    ----------
    name
        Cluster name.
    table
        One row per (role, GPU, zone, pricing, state) with its ``count``, ``$/h now`` and
        ``$ so far``.
    cost
        The bill so far.
    """

    name: str
    table: pd.DataFrame
    cost: CostReport

    def _headline(self) -> str:
        c = self.cost
        return (
            f"{self.name}: ${c.rate:.3f}/h now, ${c.total:.4f} so far "
            f"(on demand ${c.total_on_demand:.4f}), saved {c.saved_fraction:.0%}"
        )

    def __repr__(self) -> str:
        if self.table.empty:
            return self._headline() + "\n(no VMs yet)"
        return self._headline() + "\n" + self.table.to_string(index=False)

    def _repr_html_(self) -> str:
        # Dollar signs would be typeset as LaTeX by JupyterLab's MathJax: opt out.
        return (
            '<div class="tex2jax_ignore mathjax_ignore">'
            f"<p><b>{html.escape(self._headline())}</b></p>"
            + self.table.to_html(index=False, float_format=lambda x: f"{x:.4f}")
            + "</div>"
        )


def cluster_status(cluster: Any, now: float | None = None) -> ClusterStatus:
    """The :class:`ClusterStatus` of ``cluster`` from its event log.

    Parameters
    ----------
    cluster
        A :class:`~transient_nb.TransientCluster` or a connected handle.
    now
        Wall-clock time of the status (default: now).

    Examples
    --------
    >>> cluster_status(cluster)  # doctest: +SKIP
    demo: $0.630/h now, $0.0105 so far (on demand $0.0275), saved 62%
    role    gpu           zone  pricing    state  count  $/h now  $ so far
    ...
    """
    events = [e for e in event_log(cluster) if e.get("kind") in TABLE_KINDS]
    minimum_s = float(getattr(getattr(cluster, "catalog", None), "minimum_s", 60.0))
    rows, cost = vm_rows(events, minimum_s, now)
    rows = [r for r in rows if not r["gone"]]
    per_vm = cost.per_vm
    records = []
    for r in rows:
        rate = 0.0
        if r["state"] not in ("requested", "provisioning") and not per_vm.empty:
            rate = float(per_vm["price"].get(r["name"], 0.0))
        records.append(
            {
                "role": r["role"],
                "gpu": r["gpu"],
                "zone": r["zone"],
                "pricing": "spot" if r["spot"] else "on-demand",
                "state": r["state"],
                "count": 1,
                "$/h now": rate,
                "$ so far": r["cost"],
            }
        )
    columns = ["role", "gpu", "zone", "pricing", "state", "count", "$/h now", "$ so far"]
    if records:
        table = (
            pd.DataFrame.from_records(records)
            .groupby(["role", "gpu", "zone", "pricing", "state"], as_index=False, sort=True)
            .sum()[columns]
        )
    else:
        table = pd.DataFrame(columns=columns)
    return ClusterStatus(str(getattr(cluster, "name", "?")), table, cost)
