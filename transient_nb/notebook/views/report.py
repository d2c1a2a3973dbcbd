"""The standalone HTML report of a run: its summary, its VMs and the dashboard's figures, BokehJS inline
(works offline). Both are computed from the event log alone (a run record will do)."""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from typing import Any

from bokeh.embed import file_html
from bokeh.layouts import column
from bokeh.models.widgets import Div
from bokeh.resources import INLINE

from transient_nb.catalog.prices import BILLING_MINIMUM_S
from transient_nb.eventlog.folds import ClusterState, summarize
from transient_nb.notebook.views.figures import RunFigures
from transient_nb.notebook.views.vm_table import table_html


def report_html(
    events: Sequence[Mapping[str, Any]],
    summary: Mapping[str, Any] | None = None,
    title: str = "transient_nb run",
    minimum_s: float = BILLING_MINIMUM_S,
) -> str:
    """A complete HTML page of a run's summary table and figures.

    Parameters
    ----------
    events
        The run's events, in order.
    summary
        The table at the top; by default :func:`transient_nb.eventlog.summary.summarize` of ``events``.
    title
        The page's title and heading.
    minimum_s
        Minimum billed seconds per VM, for the default summary and the cost curve.

    Examples
    --------
    >>> page = report_html([])
    >>> page.startswith("<!DOCTYPE html>")
    True
    """
    events = list(events)
    if summary is None:
        summary = summarize(events, minimum_s)
    t0 = next((float(e["time"]) for e in events if e.get("kind") == "train-started"), None)
    figs = RunFigures(t0=t0, minimum_s=minimum_s)
    figs.update(events)
    parts: list[Any] = [Div(text=f"<h2>{html.escape(title)}</h2>")]
    if summary:
        rows = "".join(
            f"<tr><th style='text-align:left'>{html.escape(str(k))}</th><td>{html.escape(_fmt(v))}</td></tr>"
            for k, v in summary.items()
        )
        parts.append(Div(text=f"<table>{rows}</table>"))
    # The VMs: the live ones at the end, those gone folded into one line that opens on a click.
    state = ClusterState(minimum_s=minimum_s)
    state.feed(events)
    if events:
        end = max(float(e.get("time", 0.0)) for e in events)
        parts.append(Div(text=table_html(state.rows(end), state.gone(end))))
    parts.append(figs.root)
    return file_html(column(*parts), resources=INLINE, title=title)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return v if isinstance(v, str) else json.dumps(v, default=str)


def save_report(
    path: str,
    events: Sequence[Mapping[str, Any]],
    summary: Mapping[str, Any] | None = None,
    title: str = "transient_nb run",
) -> str:
    """Write :func:`report_html` to ``path``; returns the path."""
    with open(path, "w") as f:
        f.write(report_html(events, summary, title))
    return path
