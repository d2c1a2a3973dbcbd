"""Tests for transient_nb.notebook.views.vm_table: the VM table's rows and HTML."""

from __future__ import annotations

import pytest

from tests.notebook.views.views_logs import LIFE, T0, vm
from transient_nb.eventlog.bill import compute_costs
from transient_nb.notebook.views.vm_table import table_html, totals_html, vm_rows


def test_vm_rows_from_lifecycle_events() -> None:
    rows, cost = vm_rows(LIFE, minimum_s=60, now=T0 + 200)
    assert [(r["name"], r["state"], r["gone"]) for r in rows] == [
        ("ps-0", "joined", False),
        ("w-0", "joined", False),
        ("w-1", "preempted", True),
    ]
    ps, w0, w1 = rows
    assert ps["gpu"] is None and not ps["spot"] and w0["spot"]
    assert w1["seconds_in_state"] == pytest.approx(90)
    # Billing in simulated time (time_scale 2): w-1 ran 109 wall seconds.
    assert w1["cost"] == pytest.approx(109 * 2 * 0.5 / 3600)
    # The bill is taken at the same ``now`` as the times in state.
    assert cost.total == pytest.approx(compute_costs(LIFE, now=T0 + 200, minimum_s=60).total)


def test_table_html_marks_states_and_greys_gone_vms() -> None:
    rows, cost = vm_rows([*LIFE, vm("notice", "w-0", 150)], minimum_s=60, now=T0 + 200)
    html = table_html(rows)
    assert html.count("<tr class='transient-vm'") == 3
    assert "ps-0 (PS)" in html and "color:#e6a700'>notice" in html
    assert "data-worker='w-1' style='opacity:0.45'" in html
    assert "saved" in totals_html(cost) and "/h</b> now" in totals_html(cost)
