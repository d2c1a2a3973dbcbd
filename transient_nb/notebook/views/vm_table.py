"""The VM table of the notebook panel: rows from :mod:`transient_nb.eventlog.folds`, rendered as HTML."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

from transient_nb.catalog.prices import BILLING_MINIMUM_S
from transient_nb.eventlog.bill import CostReport
from transient_nb.eventlog.folds import ClusterState
from transient_nb.eventlog.format import duration, gone_text, money, percent, rate

Event = Mapping[str, Any]


def vm_rows(
    events: Sequence[Event], minimum_s: float = BILLING_MINIMUM_S, now: float | None = None
) -> tuple[list[dict[str, Any]], CostReport]:
    """The rows of the VM table and the bill, from a whole event log.

    A one-shot convenience over :class:`~transient_nb.eventlog.folds.ClusterState` (live views keep a
    state and feed it).

    Parameters
    ----------
    events
        The run's events.
    minimum_s
        Minimum billed seconds per VM (the price catalog's).
    now
        Wall-clock time of the times in state and of the bill (default: now).

    Returns
    -------
    rows, cost
        :meth:`ClusterState.rows <transient_nb.eventlog.folds.ClusterState.rows>` and the
        :class:`~transient_nb.eventlog.bill.CostReport`.

    Examples
    --------
    >>> rows, cost = vm_rows([])
    >>> rows, cost.total
    ([], 0.0)
    """
    state = ClusterState(minimum_s=minimum_s)
    state.feed(events)
    return state.rows(now), state.cost(now)


_HEAD = (
    ("worker", "left"),
    ("GPU", "left"),
    ("zone", "left"),
    ("pricing", "left"),
    ("state", "left"),
    ("for", "right"),
    ("$ so far", "right"),
)


def gpu_label(row: Mapping[str, Any]) -> str:
    """The GPU column of a VM row: its GPU type, or a dash for the PS host (it has none)."""
    gpu = row.get("gpu")
    return gpu if row.get("role") != "ps" and isinstance(gpu, str) else "—"


def _state_html(state: str) -> str:
    if state == "notice":
        return f"<b style='color:#e6a700'>{state}</b>"
    if state == "preempted":
        return f"<span style='color:#d62728'>{state}</span>"
    return html.escape(state)


def rows_html(rows: Sequence[Mapping[str, Any]]) -> str:
    """``rows`` as one HTML table, in their order, gone VMs greyed (no folding)."""
    body = []
    for r in rows:
        cells = [
            f"{html.escape(r['name'])}{' (PS)' if r['role'] == 'ps' else ''}",
            html.escape(gpu_label(r)),
            html.escape(str(r["zone"] or "")),
            "spot" if r["spot"] else "on-demand",
            _state_html(str(r["state"])),
            duration(r["seconds_in_state"]),
            money(r["cost"]),
        ]
        tds = "".join(
            f"<td style='text-align:{'right' if i >= 5 else 'left'};padding:1px 10px'>{c}</td>"
            for i, c in enumerate(cells)
        )
        style = "opacity:0.45" if r["gone"] else ""
        body.append(
            f"<tr class='transient-vm' data-worker='{html.escape(r['name'])}' "
            f"style='{style}'>{tds}</tr>"
        )
    head = "".join(f"<th style='text-align:{a};padding:2px 10px'>{h}</th>" for h, a in _HEAD)
    return (
        "<table class='transient-vms' style='border-collapse:collapse;font-size:90%'>"
        f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
    )


def table_html(rows: Sequence[Mapping[str, Any]], gone: Mapping[str, Any] | None = None) -> str:
    """The VM table as HTML: one ``tr.transient-vm`` per row, the live VMs first.

    The VMs gone (revoked, given back) fold into one line under the table, "17 preempted,
    $0.063" (``gone``: :meth:`ClusterState.gone
    <transient_nb.eventlog.folds.ClusterState.gone>`, all of them; default: counted from
    ``rows``), that opens on a click (a ``<details>``: no script needed) onto the latest ones'
    rows, greyed. An overnight run would otherwise list hundreds above the few that work.
    """
    live = [r for r in rows if not r["gone"]]
    shown = [r for r in rows if r["gone"]]
    if gone is None:
        preempted = sum(1 for r in shown if r["state"] == "preempted")
        gone = {
            "preempted": preempted,
            "given_back": len(shown) - preempted,
            "cost": sum(float(r["cost"] or 0.0) for r in shown),
        }
    out = rows_html(live)
    line = gone_text(gone)
    if line:
        out += (
            "<details class='transient-gone' style='font-size:90%;margin-top:2px'>"
            f"<summary>{html.escape(line)}</summary>{rows_html(shown)}</details>"
        )
    return out


def totals_html(cost: CostReport) -> str:
    """Dollars per hour now, dollars so far, the on-demand counterfactual and the saving; for a
    mixed cluster (more than one GPU type), what each type cost."""
    text = (
        f"<b>{rate(cost.rate)}</b> now &middot; <b>{money(cost.total)}</b> so far "
        f"&middot; on demand {money(cost.total_on_demand)} &middot; "
        f"saved <b>{percent(cost.saved_fraction)}</b>"
    )
    by_gpu = cost.by_gpu
    if len(by_gpu.index.difference(["ps"])) > 1:
        parts = [
            f"{html.escape(str(g))} {int(r['vms'])} VM{'s' if r['vms'] != 1 else ''} "
            f"{money(r['cost'])}"
            for g, r in by_gpu.iterrows()
        ]
        text += "<br>per type: " + " &middot; ".join(parts)
    return text
