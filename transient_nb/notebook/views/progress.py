"""The progress of a training run in the notebook: a bar, the figures, the ETA and a stop button.

:class:`RunView` renders a :class:`~transient_nb.eventlog.progress.RunProgress` (the control panel embeds
one); :class:`RunPanel` is the live view of one run on its own, which the ``train`` magic shows
under the cluster's panel instead of a second copy of that panel.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

import ipywidgets as widgets

from transient_nb.eventlog.bill import CostReport
from transient_nb.eventlog.folds import ClusterState, RunProgress, minimum_s_of
from transient_nb.eventlog.format import duration, metric_value, model_text, money
from transient_nb.notebook.views.live import LiveView

__all__ = ["RunPanel", "RunProgress", "RunView", "progress_html"]

_BAR_STYLES = {
    "running": "info",
    "steps": "success",
    "accuracy": "success",
    "metric": "success",  # a stop_at condition was met
    "error": "danger",
    "trainer-failed": "danger",  # every trainer kept failing: the run ended in error
}


def progress_html(p: RunProgress, cost: CostReport) -> str:
    """The model and its size, step of the target, every metric (accuracy where it is one),
    img/s, preemptions, and the ETA with its projected cost (or how the run finished)."""
    names = list(p.metrics) or ["accuracy"]
    values: dict[str, Any] = p.metrics or {"accuracy": p.accuracy}
    shown = " &middot; ".join(
        f"{html.escape(k)} <b>{metric_value(k, values.get(k))}</b>" for k in names
    )
    ips = f"{p.img_per_s:,.0f}" if p.img_per_s else "–"
    if p.state == "running":
        tail = (
            f"ETA <b>{duration(p.eta_s)}</b> &middot; projected cost to the target "
            f"<b>{money(p.projected_cost(cost))}</b>"
        )
    else:
        tail = f"<b>finished</b> ({html.escape(p.state)})"
        if p.error:
            tail += f": {html.escape(p.error[:200])}"
    model = html.escape(model_text(p.model, p.parameters)) if p.model else ""
    return (
        f"&nbsp;{model + ' &middot; ' if model else ''}{p.step:,} / {p.target:,} &middot; "
        f"{shown} &middot; {ips} img/s &middot; {p.preemptions} preemptions &middot; {tail}"
    )


class RunView(widgets.VBox):
    """A progress bar and the run's figures; a "Stop training" button when given the run.

    Hidden until a run shows up in the log.

    Parameters
    ----------
    run
        The :class:`~transient_nb.TrainingRun` that the stop button stops (None: no button).
    on_message
        Called with ``(text, error)`` to tell the user what a button did.
    """

    def __init__(self, run: Any = None, on_message: Any = None):
        self.run = run
        self._on_message = on_message
        self.progress = widgets.IntProgress(
            value=0, min=0, max=1, description="step", layout=widgets.Layout(width="420px")
        )
        self.run_info = widgets.HTML()
        self.stop_run_button = widgets.Button(
            description="Stop training",
            tooltip="Trainers stop after their current step",
            icon="stop",
        )
        self.stop_run_button.on_click(lambda _: self.stop_run())
        children: list[widgets.Widget] = [
            widgets.HBox(
                [self.progress, self.run_info], layout=widgets.Layout(align_items="center")
            )
        ]
        if run is not None:
            children.append(self.stop_run_button)
        super().__init__(children, layout=widgets.Layout(display="none"))

    def render(self, p: RunProgress | None, cost: CostReport) -> None:
        """Show ``p`` (nothing before the run starts)."""
        if p is None:
            return
        self.layout.display = "flex"
        self.progress.max = max(1, p.target)
        self.progress.value = min(p.step, p.target)
        self.progress.bar_style = _BAR_STYLES.get(p.state, "warning")
        self.run_info.value = progress_html(p, cost)
        self.stop_run_button.disabled = p.state != "running"

    def stop_run(self) -> None:
        """Stop the training run (trainers stop after their current step)."""
        if self.run is None:
            return
        self._say("Stopping the training run…")
        try:
            self.run.stop(wait=False)
        except Exception as e:  # shown in the panel: a button has nowhere else to raise to
            self._say(f"Could not stop the run: {e}", error=True)

    def _say(self, text: str, error: bool = False) -> None:
        if self._on_message is not None:
            self._on_message(text, error)


class RunPanel(LiveView, widgets.VBox):
    """Live progress of one training run, from the cluster's event log.

    Parameters
    ----------
    run
        The :class:`~transient_nb.TrainingRun` to follow.
    interval, start
        As for :class:`~transient_nb.notebook.views.panel.ClusterPanel`: the seconds between two looks
        at the event log, and whether to start looking at once.

    Examples
    --------
    >>> from transient_nb.notebook.views.progress import RunPanel
    >>> RunPanel(run)  # doctest: +SKIP
    """

    def __init__(self, run: Any, interval: float = 0.25, start: bool = True):
        self.run = run
        self.cluster = run.cluster
        self.state = ClusterState(run_id=run.id, minimum_s=minimum_s_of(self.cluster))
        self.message = widgets.HTML()
        self.view = RunView(run, on_message=self._say)
        self.progress, self.run_info = self.view.progress, self.view.run_info
        super().__init__([self.view, self.message], layout=widgets.Layout(padding="4px"))
        self.add_class("transient-run")
        self._follow(self.cluster, interval, start)

    def _draw(self, new: Sequence[Mapping[str, Any]], now: float, closed: bool) -> bool:
        self.view.render(self.state.progress, self.state.cost(now))
        p = self.state.progress
        return closed or (p is not None and p.finished)

    def _say(self, text: str, error: bool = False) -> None:
        color = "#d62728" if error else "inherit"
        self.message.value = f"<span style='color:{color}'>{html.escape(text)}</span>"

    def __repr__(self) -> str:
        p = self.state.progress
        where = f"step {p.step}/{p.target}, {p.state}" if p is not None else "not started"
        return f"<RunPanel {getattr(self.run, 'id', '?')}: {where}>"
