"""A compact status of a cluster: workers by state, GPU and zone, and the money.

What ``%transient_cluster status`` shows, folded from the event log by
:class:`~transient_nb.eventlog.folds.ClusterState`.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

import pandas as pd

from transient_nb.eventlog.bill import CostReport
from transient_nb.eventlog.folds import ClusterState, event_log, minimum_s_of
from transient_nb.notebook.views.vm_table import gpu_label


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
    state = ClusterState(minimum_s=minimum_s_of(cluster))
    state.feed(event_log(cluster))
    rows = [r for r in state.rows(now) if not r["gone"]]
    cost = state.cost(now)
    records = []
    for r in rows:
        # A VM costs its price from "running" on; one being requested or placed costs nothing yet.
        rate = state.bill.price(r["name"]) if state.bill.is_running(r["name"]) else 0.0
        records.append(
            {
                "role": r["role"],
                "gpu": gpu_label(r),
                "zone": r["zone"] or "",
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
