"""The notebook widgets, by their former module name.

The panel, the run progress, the VM table and the status live in one module each
(:mod:`~transient_nb.notebook.views.panel`, :mod:`~transient_nb.notebook.views.progress`,
:mod:`~transient_nb.notebook.views.vm_table`, :mod:`~transient_nb.notebook.views.status`); what the views show is
computed in :mod:`transient_nb.eventlog.folds`, and the periodic callback is :mod:`transient_nb.ticker`.
This module keeps the names that notebooks import from here.
"""

from __future__ import annotations

from transient_nb.eventlog.folds import (
    MAX_GONE_ROWS,
    PACE_WINDOW_S,
    RunProgress,
    RunTracker,
    event_log,
)
from transient_nb.notebook.views.panel import ClusterPanel, panel_for
from transient_nb.notebook.views.progress import RunPanel
from transient_nb.notebook.views.status import ClusterStatus, cluster_status
from transient_nb.notebook.views.vm_table import vm_rows
from transient_nb.ticker import Ticker

__all__ = [
    "MAX_GONE_ROWS",
    "PACE_WINDOW_S",
    "ClusterPanel",
    "ClusterStatus",
    "RunPanel",
    "RunProgress",
    "RunTracker",
    "Ticker",
    "cluster_status",
    "event_log",
    "panel_for",
    "vm_rows",
]
