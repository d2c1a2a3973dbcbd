"""The standalone HTML report of a run: the dashboard's figures, BokehJS inline (works offline)."""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from typing import Any

from bokeh.embed import file_html
from bokeh.layouts import column
from bokeh.models.widgets import Div
from bokeh.resources import INLINE

from transient_nb.views.figures import RunFigures


def report_html(
    events: Sequence[Mapping[str, Any]],
    summary: Mapping[str, Any] | None = None,
    title: str = "transient_nb run",
) -> str:
    """A complete HTML page of a run's figures (and its summary table, if given)."""
    events = list(events)
    t0 = next((float(e["time"]) for e in events if e.get("kind") == "train-started"), None)
    figs = RunFigures(t0=t0)
    figs.update(events)
    parts: list[Any] = [Div(text=f"<h2>{html.escape(title)}</h2>")]
    if summary:
        rows = "".join(
            f"<tr><th style='text-align:left'>{html.escape(str(k))}</th><td>{html.escape(_fmt(v))}</td></tr>"
            for k, v in summary.items()
        )
        parts.append(Div(text=f"<table>{rows}</table>"))
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
