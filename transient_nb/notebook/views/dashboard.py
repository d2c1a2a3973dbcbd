"""The live Bokeh dashboard of a cluster and its training run, embedded in the notebook.

:class:`Dashboard` puts the figure group of :class:`~transient_nb.notebook.views.figures.RunFigures` (test
accuracy and loss; cumulative cost against on-demand; active workers by GPU type with a marker for
every notice, preemption and replacement; throughput per worker) into a notebook through
``jupyter_bokeh.BokehModel``, and keeps it live: a periodic callback on the cluster's event loop
reads the events it has not seen yet and *streams* them into the figures' sources
(``source.stream(rows, rollover)``). The training thread never touches the figures. BokehJS is
loaded inline (no CDN), once per kernel.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

from transient_nb.eventlog.folds import event_log, is_closed, minimum_s_of
from transient_nb.notebook.views.figures import RunFigures
from transient_nb.ticker import Ticker

Event = Mapping[str, Any]

#: Whether this kernel has been sent BokehJS (inline) already.
_bokehjs_loaded = False


def load_bokehjs(force: bool = False) -> None:
    """Send BokehJS to the notebook, inline (works offline), once per kernel.

    ``jupyter_bokeh`` renders Bokeh documents with the page's BokehJS; this provides it.
    """
    global _bokehjs_loaded
    if _bokehjs_loaded and not force:
        return
    from bokeh.io.notebook import load_notebook
    from bokeh.resources import INLINE

    load_notebook(resources=INLINE, hide_banner=True)
    _bokehjs_loaded = True


class Dashboard:
    """Live figures of a cluster (and of one training run on it), streamed from its event log.

    Parameters
    ----------
    cluster, interval, start
        As for :class:`~transient_nb.notebook.views.panel.ClusterPanel`: a cluster or a connected handle,
        the seconds between two looks at its event log, and whether to start looking at once.
    run
        A :class:`~transient_nb.TrainingRun` (or its id): only its training events are drawn;
        by default every run's.

    Attributes
    ----------
    figures
        The :class:`~transient_nb.notebook.views.figures.RunFigures` (each with its ``source``).
    root
        The Bokeh layout.

    Examples
    --------
    >>> from transient_nb.notebook.views.dashboard import Dashboard
    >>> dash = Dashboard(cluster, run)  # doctest: +SKIP
    >>> dash  # in a notebook: the live figures  # doctest: +SKIP
    """

    def __init__(self, cluster: Any, run: Any = None, interval: float = 0.5, start: bool = True):
        self.cluster = cluster
        self.run_id: str | None = run if isinstance(run, str) or run is None else run.id
        minimum_s = minimum_s_of(cluster)
        events = event_log(cluster)
        # One time axis for the whole cluster, so that workers joining before the run show.
        t0 = float(events[0]["time"]) if events else None
        self.figures = RunFigures(t0=t0, minimum_s=minimum_s)
        self.root = self.figures.root
        self.events: list[Event] = []  # what the figures have been fed (this run's view)
        self._seen = 0
        self._lock = threading.Lock()
        self._last_tick = 0.0
        self._model: Any = None
        self.closed_seen = False
        self.update()
        self._ticker = Ticker(cluster.loop, self.update, interval)
        if start and not self.closed_seen:
            self._ticker.start()

    def _keep(self, e: Event) -> bool:
        return self.run_id is None or e.get("run") in (None, self.run_id)

    def update(self, now: float | None = None) -> int:
        """Stream the events not seen yet into the figures; returns how many were new.

        Called by the periodic callback; safe to call from any thread.
        """
        with self._lock:
            log = event_log(self.cluster)
            n = len(log)
            new = [e for e in log[self._seen : n] if self._keep(e)]
            self._seen = n
            self.events.extend(new)
            if new:
                self.figures.update(self.events)
            now = time.time() if now is None else now
            closed = is_closed(self.cluster, log)
            # Dollars grow between events: one cost point a second while VMs run.
            if now - self._last_tick >= 1.0 and not closed and self.events:
                self.figures.tick(self.events, now)
                self._last_tick = now
            self.closed_seen = closed
        if closed and hasattr(self, "_ticker"):
            self._ticker.stop()  # nothing will change any more
        return len(new)

    @property
    def widget(self) -> Any:
        """The ``jupyter_bokeh.BokehModel`` that shows the figures in a notebook."""
        if self._model is None:
            from jupyter_bokeh import BokehModel

            self._model = BokehModel(self.root)
        return self._model

    def stop(self) -> None:
        """Stop following the event log (the figures keep what they have)."""
        self._ticker.stop()

    def close(self) -> None:
        """Stop following the log and close the notebook widget."""
        self.stop()
        if self._model is not None:
            import ipywidgets

            # Only the widget's comm: jupyter_bokeh's own close also unregisters it from the
            # document, and closes again when collected, where a second unregistering raises.
            ipywidgets.Widget.close(self._model)

    def _ipython_display_(self) -> None:
        from IPython.display import display

        load_bokehjs()
        display(self.widget)

    def __repr__(self) -> str:
        name = getattr(self.cluster, "name", "?")
        run = f", run {self.run_id}" if self.run_id else ""
        return f"<Dashboard {name}{run}: {len(self.events)} events>"


def sources(dashboard: Dashboard) -> dict[str, int]:
    """Rows in each named source of ``dashboard`` (what tests and scripts look at)."""
    from bokeh.models import ColumnDataSource

    out: dict[str, int] = {}
    for model in dashboard.root.select({"type": ColumnDataSource}):
        if model.name:
            data = model.data  # type: ignore[attr-defined]
            out[model.name] = len(next(iter(data.values()), []))
    return out
