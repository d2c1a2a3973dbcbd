"""The notebook control panel of a transient cluster (and of a training run on it), in ipywidgets.

:class:`ClusterPanel` composes stock ipywidgets: a table of the cluster's VMs (name, GPU, zone, Spot
or on-demand, lifecycle state and time in it, dollars so far), the totals (dollars per hour now,
dollars so far, the on-demand counterfactual, the fraction saved), buttons to scale, to preempt the
selected worker and to stop, and for a training run its progress (step of the target, accuracy,
images per second, ETA and projected cost at the current pace).

Everything it shows is folded from the cluster's event log by :class:`~transient_nb.eventlog.folds.
ClusterState` (the same fold as the JupyterLab panel's), never by asking the trainers, and kept
live by :class:`~transient_nb.notebook.views.live.LiveState` (within a quarter of a second of an event, also
while a notebook cell blocks the kernel's own loop, ``run.wait()``).
"""

from __future__ import annotations

import html
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import ipywidgets as widgets

from transient_nb.eventlog.bill import CostReport
from transient_nb.eventlog.folds import ClusterState, minimum_s_of
from transient_nb.eventlog.format import gone_text, money, policy_text
from transient_nb.notebook.views.live import LiveView
from transient_nb.notebook.views.progress import RunPanel, RunView
from transient_nb.notebook.views.vm_table import rows_html, table_html, totals_html


class ClusterPanel(LiveView, widgets.VBox):
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
    >>> from transient_nb.notebook.views.panel import ClusterPanel
    >>> cluster = TransientCluster(workers=2)  # doctest: +SKIP
    >>> ClusterPanel(cluster)  # doctest: +SKIP
    """

    def __init__(self, cluster: Any, run: Any = None, interval: float = 0.25, start: bool = True):
        self.cluster = cluster
        self.run = run
        self.minimum_s = minimum_s_of(cluster)
        self.state = ClusterState(run_id=getattr(run, "id", None), minimum_s=self.minimum_s)
        self.rows: list[dict[str, Any]] = []
        self.cost: CostReport | None = None
        #: GPU workers asked for (the last ``started``/``scale``, or this panel's own request).
        self.target: int | None = None

        self.header = widgets.HTML()
        self.totals = widgets.HTML()
        self.policy_line = widgets.HTML()
        self.table = widgets.HTML()
        # The VMs gone (revoked, given back), folded into one line that opens on a click: an
        # Accordion keeps itself open across refreshes (a <details> in the table's HTML would
        # close at every one).
        self.gone_rows = widgets.HTML()
        self.gone = widgets.Accordion(
            children=[self.gone_rows], selected_index=None, layout=widgets.Layout(display="none")
        )
        self.gone.add_class("transient-gone")
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
        self.run_box = RunView(run, on_message=self._say)
        self.progress, self.run_info = self.run_box.progress, self.run_box.run_info
        self.stop_run_button = self.run_box.stop_run_button

        self.scale_up.on_click(lambda _: self._scale(+1))
        self.scale_down.on_click(lambda _: self._scale(-1))
        self.preempt_button.on_click(lambda _: self.preempt())
        self.stop_button.on_click(lambda _: self.shutdown())
        super().__init__(
            [
                self.header,
                self.totals,
                self.policy_line,
                self.table,
                self.gone,
                controls,
                self.run_box,
                self.message,
            ],
            layout=widgets.Layout(padding="4px"),
        )
        self.add_class("transient-panel")
        self._follow(cluster, interval, start)

    # -- reading the log ----------------------------------------------------------------------------
    def _draw(self, new: Sequence[Mapping[str, Any]], now: float, closed: bool) -> bool:
        for e in new:
            kind = e.get("kind")
            if kind in ("started", "scale"):
                self.target = self.state.target_workers
            elif kind == "control" and not e.get("ok"):
                self._say(f"The cluster refused {e.get('action')}: {e.get('error')}", error=True)
        self._render(now, closed)
        return closed

    def _render(self, now: float, closed: bool) -> None:
        self.rows, self.cost = self.state.rows(now), self.state.cost(now)
        workers = [r for r in self.rows if r["role"] == "worker" and not r["gone"]]
        joined = sum(1 for r in workers if r["state"] == "joined")
        name = html.escape(str(getattr(self.cluster, "name", "?")))
        status = "closed" if closed else "running"
        owner = "" if hasattr(self.cluster, "run_path") else " &middot; connected"
        self.header.value = (
            f"<b>{name}</b> &middot; {status}{owner} &middot; {joined} of {len(workers)} GPU "
            f"workers working"
        )
        self.totals.value = totals_html(self.cost)
        self.policy_line.value = html.escape(policy_text(self.state.policy))
        live = [r for r in self.rows if not r["gone"]]
        self.table.value = table_html(live)
        line = gone_text(self.state.gone(now))
        self.gone.layout.display = "block" if line else "none"
        if line:
            self.gone.titles = (line,)
            self.gone_rows.value = rows_html([r for r in self.rows if r["gone"]])
        self.workers_label.value = self._workers_text()
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
        self.run_box.render(self.state.progress, self.cost)

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

    def _mixed(self) -> dict[str, int] | None:
        """The cluster's mix when it has more than one GPU type asked for, else None."""
        mix = {g: n for g, n in (self.state.target_mix or {}).items() if n > 0}
        return mix if len(mix) > 1 else None

    def _workers_text(self) -> str:
        mix = self._mixed()
        if mix is not None:
            return " + ".join(f"{n} {g}" for g, n in mix.items())
        return f"{self.target if self.target is not None else '?'} workers"

    def _scale(self, delta: int) -> None:
        mix = self._mixed()
        if mix is not None:
            # A mixed cluster: the buttons add or remove workers of its main (first) type.
            gpu = str(getattr(self.cluster, "gpu", None) or next(iter(mix)))
            n = max(0, mix.get(gpu, 0) + delta)
            done = self._act(
                f"scale {gpu} to {n} workers", lambda: self.cluster.scale(n, gpu=gpu) or True
            )
            if done:
                self._say(f"Scaling {gpu} to {n} GPU workers…")
            return
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
        self.run_box.stop_run()

    def close(self) -> None:
        """Stop following the log and close the widgets."""
        self._live.stop()
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
            f"<ClusterPanel {name}: {live} GPU workers, {money(self.cost.total)} so far, "
            f"saved {self.cost.saved_fraction:.0%}>"
        )


#: One view per cluster or run, so that displaying an object twice shows the same live view.
_panels: weakref.WeakKeyDictionary[Any, widgets.VBox] = weakref.WeakKeyDictionary()


def _is_run(obj: Any) -> bool:
    return hasattr(obj, "cluster") and hasattr(obj, "hp")


def panel_for(obj: Any) -> Any:
    """The live view of a cluster (its :class:`ClusterPanel`) or of a training run (its
    :class:`~transient_nb.notebook.views.progress.RunPanel`), created once, then reused.

    A run's view shows its progress only: the cluster's panel is shown once, by the cluster.

    Examples
    --------
    >>> panel_for(cluster)  # doctest: +SKIP
    """
    panel = _panels.get(obj)
    if panel is None:
        panel = RunPanel(obj) if _is_run(obj) else ClusterPanel(obj)
        _panels[obj] = panel
    return panel
