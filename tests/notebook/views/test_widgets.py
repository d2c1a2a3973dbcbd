"""Tests for transient_nb.notebook.views.widgets: the names notebooks import from the former module."""

from __future__ import annotations

from transient_nb import ticker
from transient_nb.eventlog import folds as state
from transient_nb.notebook.views import panel, progress, status, vm_table, widgets


def test_former_names_are_the_new_modules_objects() -> None:
    assert widgets.ClusterPanel is panel.ClusterPanel and widgets.panel_for is panel.panel_for
    assert widgets.RunPanel is progress.RunPanel
    assert widgets.ClusterStatus is status.ClusterStatus
    assert widgets.cluster_status is status.cluster_status
    assert widgets.vm_rows is vm_table.vm_rows
    assert widgets.RunTracker is state.RunTracker and widgets.Ticker is ticker.Ticker
    # One set of constants for every view (the lab panel's model uses the same).
    assert widgets.MAX_GONE_ROWS == state.MAX_GONE_ROWS
    assert widgets.PACE_WINDOW_S == state.PACE_WINDOW_S
