"""Tests for transient_nb.notebook.views.status: the compact status table."""

from __future__ import annotations

import pytest

from tests.notebook.views.views_logs import LIFE, T0, FakeCluster
from transient_nb.notebook.views.status import cluster_status


def test_status_table_groups_vms() -> None:
    cluster = FakeCluster(list(LIFE))
    status = cluster_status(cluster, now=T0 + 200)
    table = status.table
    assert list(table["count"]) == [1, 1]  # the gone VM is not in the status
    assert set(table["state"]) == {"joined"}
    assert "fake: $" in repr(status) and "saved" in repr(status)
    assert "<table" in status._repr_html_()
    # The PS host runs on demand; the worker is a spot one; both cost their price now.
    assert set(table["pricing"]) == {"spot", "on-demand"}
    assert table["$/h now"].sum() == pytest.approx(0.2 + 0.5)
    assert "—" in set(table["gpu"])  # the PS host has no GPU
