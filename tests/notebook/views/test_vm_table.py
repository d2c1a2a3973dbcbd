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


def test_a_long_runs_gone_vms_fold_into_one_line_under_the_live_ones() -> None:
    """Seventeen more preempted workers and one given back: the table shows the live VMs, then
    one line with the counts of all the gone ones and what they cost, which opens onto the
    latest ones' rows."""
    from transient_nb.eventlog.folds import MAX_GONE_ROWS, ClusterState

    log = list(LIFE)
    for i in range(2, 19):
        log += [vm("requested", f"w-{i}", 10 * i, price=0.5), vm("running", f"w-{i}", 10 * i + 1)]
        log += [vm("preempted", f"w-{i}", 10 * i + 5)]
    log += [vm("requested", "w-19", 300, price=0.5), vm("running", "w-19", 301)]
    log += [vm("deleted", "w-19", 320)]
    state = ClusterState(minimum_s=60)
    state.feed(log)
    now = T0 + 400
    rows, gone = state.rows(now), state.gone(now)
    html = table_html(rows, gone)
    live, _, folded = html.partition("<details")
    assert [r["name"] for r in rows if not r["gone"]] == ["ps-0", "w-0"]
    assert live.count("<tr class='transient-vm'") == 2 and "data-worker='w-19'" not in live
    # w-1 and the 17 others preempted, w-19 given back: all of them in the line and its money.
    assert gone["preempted"] == 18 and gone["given_back"] == 1
    assert gone["cost"] == pytest.approx(state.cost(now).total - sum(r["cost"] for r in rows[:2]))
    assert f"<summary>18 preempted, 1 given back, ${gone['cost']:,.3f}</summary>" in folded
    assert folded.count("<tr class='transient-vm'") == MAX_GONE_ROWS  # the latest ones
    assert "<details" not in table_html(rows[:2])
