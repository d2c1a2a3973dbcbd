"""Tests for transient_nb.eventlog.bill: per-second billing from hand-made event lists."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest

from transient_nb.eventlog.bill import Bill, bill, compute_costs

T0 = 1_000_000.0


def vm(name: str, price: float, od: float, role: str = "worker", **extra: Any) -> dict[str, Any]:
    return {
        "kind": "requested",
        "time": T0,
        "worker": name,
        "role": role,
        "gpu": None if role == "ps" else "t4",
        "zone": "us-central1-a",
        "spot": role != "ps",
        "price": price,
        "price_on_demand": od,
        **extra,
    }


def ev(kind: str, t: float, worker: str | None = None, **fields: Any) -> dict[str, Any]:
    return {"kind": kind, "time": T0 + t, "worker": worker, **fields}


def test_bill() -> None:
    assert bill(0, 3.6) == 0.0
    assert bill(-5, 3.6) == 0.0
    assert bill(1, 3.6) == pytest.approx(0.06)  # the one-minute minimum
    assert bill(60, 3.6) == pytest.approx(0.06)
    assert bill(61, 3.6) == pytest.approx(0.061)
    assert bill(3600, 3.6) == pytest.approx(3.6)
    assert bill(10, 3.6, minimum_s=0) == pytest.approx(0.01)


def test_minimum_charge_and_per_second() -> None:
    events = [
        ev("started", 0, time_scale=1.0),
        vm("w-0", 3.6, 7.2),
        ev("provisioning", 1, "w-0"),
        ev("running", 90, "w-0"),  # provisioning is not billed
        ev("joined", 95, "w-0"),
        ev("notice", 100, "w-0"),
        ev("left", 105, "w-0"),
        ev("preempted", 120, "w-0"),  # 30 s running: billed the minute
        vm("w-1", 3.6, 7.2),
        ev("running", 120, "w-1"),
        ev("deleted", 420, "w-1"),  # 300 s
        ev("closed", 500),
    ]
    report = compute_costs(events)
    assert report.per_vm.loc["w-0", "seconds"] == pytest.approx(30)
    assert report.per_vm.loc["w-0", "cost"] == pytest.approx(0.06)
    assert report.per_vm.loc["w-0", "cost_on_demand"] == pytest.approx(0.12)
    assert report.per_vm.loc["w-1", "seconds"] == pytest.approx(300)
    assert report.per_vm.loc["w-1", "cost"] == pytest.approx(0.30)
    assert report.total == pytest.approx(0.36)
    assert report.total_on_demand == pytest.approx(0.72)
    assert report.saved == pytest.approx(0.36)
    assert report.saved_fraction == pytest.approx(0.5)
    assert report.rate == 0.0  # nothing runs after close
    assert report.to_dict()["saved_fraction"] == pytest.approx(0.5)
    assert "saved 50%" in repr(report)
    assert "<table" in report._repr_html_()


def test_custom_minimum() -> None:
    events = [vm("w-0", 3.6, 3.6), ev("running", 0, "w-0"), ev("preempted", 10, "w-0")]
    assert compute_costs(events, minimum_s=0).total == pytest.approx(0.01)
    assert compute_costs(events, minimum_s=30).total == pytest.approx(0.03)


def test_time_scale_from_started_event_and_argument() -> None:
    events = [
        ev("started", 0, time_scale=120.0),
        vm("w-0", 1.0, 2.0),
        ev("running", 0, "w-0"),
        ev("preempted", 30, "w-0"),  # 30 wall seconds = one simulated hour
    ]
    report = compute_costs(events)
    assert report.time_scale == 120.0
    assert report.per_vm.loc["w-0", "seconds"] == pytest.approx(3600)
    assert report.total == pytest.approx(1.0)
    assert report.total_on_demand == pytest.approx(2.0)
    # An explicit time_scale wins; 30 s then falls under the minimum.
    assert compute_costs(events, time_scale=1.0).total == pytest.approx(60 / 3600)


def test_running_vm_billed_until_now_and_counted_in_rate() -> None:
    events = [
        vm("ps-0", 0.19, 0.19, role="ps"),
        ev("running", 0, "ps-0"),
        vm("w-0", 0.22, 0.73),
        ev("running", 10, "w-0"),
        vm("w-1", 0.22, 0.73),
        ev("provisioning", 10, "w-1"),  # never ran: costs nothing, not in the rate
    ]
    report = compute_costs(events, now=T0 + 610)
    assert report.per_vm.loc["ps-0", "seconds"] == pytest.approx(610)
    assert report.per_vm.loc["w-0", "seconds"] == pytest.approx(600)
    assert report.per_vm.loc["w-1", "seconds"] == 0
    assert report.per_vm.loc["w-1", "cost"] == 0
    expected = 610 * 0.19 / 3600 + 600 * 0.22 / 3600
    assert report.total == pytest.approx(expected)
    assert report.rate == pytest.approx(0.19 + 0.22)
    assert report.rate_on_demand == pytest.approx(0.19 + 0.73)
    # Without ``now`` or a closed event the meter keeps running: later is dearer.
    assert compute_costs(events).total > report.total


def test_ps_host_is_included_and_never_saves() -> None:
    events = [
        vm("ps-0", 0.19, 0.19, role="ps"),
        ev("running", 0, "ps-0"),
        ev("deleted", 3600, "ps-0"),
        ev("closed", 3600),
    ]
    report = compute_costs(events)
    assert report.per_vm.loc["ps-0", "role"] == "ps"
    assert report.total == pytest.approx(0.19)
    assert report.total_on_demand == pytest.approx(0.19)
    assert report.saved_fraction == 0.0


def test_first_end_wins_and_unknown_vms_ignored() -> None:
    events = [
        vm("w-0", 3.6, 3.6),
        ev("running", 0, "w-0"),
        ev("preempted", 100, "w-0"),
        ev("deleted", 200, "w-0"),  # close deletes it again: still billed until the preemption
        ev("running", 0, "w-9"),  # never requested: not a VM of this run
        ev("closed", 300),
    ]
    report = compute_costs(events)
    assert list(report.per_vm.index) == ["w-0"]
    assert report.total == pytest.approx(0.1)


def test_nothing_spent() -> None:
    report = compute_costs([])
    assert report.total == 0 and report.total_on_demand == 0
    assert report.saved_fraction == 0.0
    assert report.per_vm.empty


# -- edges found by mutation testing (benchmarks/mutation.py) ------------------------------------
def test_vm_still_running_at_close_is_billed_until_the_closed_event() -> None:
    events = [
        vm("w-0", 3.6, 7.2),
        ev("running", 0, "w-0"),  # never preempted nor deleted: billed until the close
        ev("closed", 600),
    ]
    report = compute_costs(events)
    assert report.per_vm.loc["w-0", "seconds"] == pytest.approx(600)
    assert report.total == pytest.approx(0.6)
    assert report.total_on_demand == pytest.approx(1.2)
    # The last close counts (a cluster reopened on the same record), and ``now`` wins over both.
    assert compute_costs([*events, ev("closed", 900)]).total == pytest.approx(0.9)
    assert compute_costs(events, now=T0 + 120).total == pytest.approx(0.12)


def test_preempted_and_deleted_both_end_billing() -> None:
    for end in ("preempted", "deleted"):
        events = [vm("w-0", 3.6, 7.2), ev("running", 0, "w-0"), ev(end, 120, "w-0")]
        report = compute_costs(events, now=T0 + 10_000)
        assert report.per_vm.loc["w-0", "seconds"] == pytest.approx(120), end
        assert report.total == pytest.approx(0.12), end
        assert report.rate == 0.0 and report.rate_on_demand == 0.0, end
    # ``notice`` and ``left`` do not: the VM is billed until the provider takes it back.
    events = [
        vm("w-0", 3.6, 7.2),
        ev("running", 0, "w-0"),
        ev("notice", 100, "w-0"),
        ev("left", 110, "w-0"),
    ]
    assert compute_costs(events, now=T0 + 300).per_vm.loc["w-0", "seconds"] == pytest.approx(300)


def test_on_demand_counterfactual_uses_the_same_seconds_and_minimum() -> None:
    events = [vm("w-0", 0.36, 3.6), ev("running", 0, "w-0"), ev("preempted", 10, "w-0")]
    report = compute_costs(events, minimum_s=30)
    assert report.per_vm.loc["w-0", "cost"] == pytest.approx(0.003)
    assert report.per_vm.loc["w-0", "cost_on_demand"] == pytest.approx(0.03)
    report = compute_costs(events, minimum_s=0)
    assert report.per_vm.loc["w-0", "cost_on_demand"] == pytest.approx(0.01)
    assert report.saved == pytest.approx(0.009)
    assert report.saved_fraction == pytest.approx(0.9)


def test_an_end_before_the_start_bills_nothing() -> None:
    # The running and the deletion event come from different hosts whose clocks may disagree.
    events = [vm("w-0", 3.6, 7.2), ev("running", 10, "w-0"), ev("deleted", 9.5, "w-0")]
    report = compute_costs(events, time_scale=1.0)
    assert report.per_vm.loc["w-0", "seconds"] == 0
    assert report.total == 0 and report.total_on_demand == 0


def test_per_vm_rows_carry_the_placement_and_prices() -> None:
    events = [
        vm("w-0", 0.22, 0.73, zone="us-east1-c"),
        ev("running", 0, "w-0"),
        vm("ps-0", 0.19, 0.19, role="ps"),
        ev("running", 0, "ps-0"),
        # A bare request (an old run record): worker, no GPU nor zone, not spot, priced at 0.
        {"kind": "requested", "time": T0, "worker": "w-1"},
        ev("running", 0, "w-1"),
    ]
    rows = compute_costs(events, now=T0 + 3600).per_vm
    assert list(rows.columns) == [
        "role",
        "gpu",
        "zone",
        "spot",
        "price",
        "price_on_demand",
        "start",
        "end",
        "seconds",
        "cost",
        "cost_on_demand",
    ]
    w0 = rows.loc["w-0"]
    assert (w0["role"], w0["gpu"], w0["zone"], w0["spot"]) == ("worker", "t4", "us-east1-c", True)
    assert (w0["price"], w0["price_on_demand"]) == (0.22, 0.73)
    assert w0["start"] == T0 and pd.isna(w0["end"])  # still running
    assert rows.loc["ps-0", "role"] == "ps" and rows.loc["ps-0", "spot"] == False  # noqa: E712
    w1 = rows.loc["w-1"]
    assert w1["role"] == "worker" and pd.isna(w1["gpu"]) and pd.isna(w1["zone"])
    assert w1["spot"] == False  # noqa: E712
    assert (w1["price"], w1["price_on_demand"], w1["cost"], w1["cost_on_demand"]) == (0, 0, 0, 0)
    assert w1["seconds"] == pytest.approx(3600)


def test_to_dict_and_html() -> None:
    events = [vm("w-0", 1.8, 3.6), ev("running", 0, "w-0"), ev("deleted", 3600, "w-0")]
    events += [vm("w-1", 0.9, 1.8), ev("running", 0, "w-1")]
    report = compute_costs(events, now=T0 + 3600)
    assert report.to_dict() == pytest.approx(
        {
            "cost": 2.7,
            "cost_on_demand": 5.4,
            "saved": 2.7,
            "saved_fraction": 0.5,
            "rate_per_hour": 0.9,
            "rate_on_demand_per_hour": 1.8,
        }
    )
    html = report._repr_html_()
    # Dollar signs must not be typeset by MathJax: the whole block opts out, and is closed.
    assert html.startswith('<div class="tex2jax_ignore mathjax_ignore">')
    assert html.endswith("</table></div>")
    assert "<b>$2.7000</b> spent" in html and "saved <b>50%</b>" in html
    assert "<td>1.8000</td>" in html and "<td>0.9000</td>" in html  # four decimals in the table


def test_cost_per_gpu_type_adds_up_to_the_total() -> None:
    events = [
        vm("ps-0", 0.143, 0.143, role="ps"),
        vm("w-0", 0.256, 0.723, gpu="k80"),
        vm("w-1", 0.256, 0.723, gpu="k80"),
        vm("w-2", 0.861, 2.144, gpu="v100"),
    ]
    events += [ev("running", 0, w) for w in ("ps-0", "w-0", "w-1", "w-2")]
    events += [ev("preempted", 1800, "w-1")]
    report = compute_costs(events, now=T0 + 3600)
    by_gpu = report.by_gpu
    assert list(by_gpu.index) == ["ps", "k80", "v100"]
    assert by_gpu.loc["k80", "vms"] == 2
    assert by_gpu.loc["k80", "cost"] == pytest.approx(0.256 * 1.5)
    assert by_gpu.loc["v100", "cost_on_demand"] == pytest.approx(2.144)
    assert by_gpu["cost"].sum() == pytest.approx(report.total)
    assert by_gpu["cost_on_demand"].sum() == pytest.approx(report.total_on_demand)
    # A mixed cluster's HTML shows the per-type table; an empty report has no rows.
    assert "Per GPU type" in report._repr_html_()
    assert compute_costs([], now=T0).by_gpu.empty


def _four(x: float) -> str:
    return f"{x:.4f}"


def test_html_shows_the_per_type_table_only_for_a_mixed_cluster() -> None:
    one_type = [vm("ps-0", 0.143, 0.143, role="ps"), vm("w-0", 0.256, 0.723, gpu="k80")]
    one_type += [ev("running", 0, "ps-0"), ev("running", 0, "w-0")]
    report = compute_costs(one_type, now=T0 + 3600)
    assert len(report.by_gpu) == 2  # the PS host and one GPU type: nothing to break down
    _, after_head = report._repr_html_().split("</p>", 1)
    assert after_head == report.per_vm.to_html(float_format=_four) + "</div>"
    mixed = [*one_type, vm("w-1", 0.861, 2.144, gpu="v100"), ev("running", 0, "w-1")]
    report = compute_costs(mixed, now=T0 + 3600)
    _, after_head = report._repr_html_().split("</p>", 1)
    assert after_head == (
        "<p>Per GPU type:</p>"
        + report.by_gpu.to_html(float_format=_four)
        + report.per_vm.to_html(float_format=_four)
        + "</div>"
    )


def test_cost_per_type_names_a_worker_without_a_gpu_and_keeps_its_columns_when_empty() -> None:
    events = [vm("ps-0", 0.143, 0.143, role="ps"), vm("c-0", 0.1, 0.2, gpu=None)]
    events += [ev("running", 0, "ps-0"), ev("running", 0, "c-0"), ev("deleted", 1800, "c-0")]
    by_gpu = compute_costs(events, now=T0 + 3600).by_gpu
    assert by_gpu.index.name == "gpu"
    assert list(by_gpu.columns) == ["vms", "seconds", "cost", "cost_on_demand"]
    assert by_gpu.loc["none"].tolist() == pytest.approx([1, 1800.0, 0.05, 0.1])
    assert by_gpu.loc["ps"].tolist() == pytest.approx([1, 3600.0, 0.143, 0.143])
    empty = compute_costs([], now=T0).by_gpu
    assert empty.index.name == "gpu"
    assert list(empty.columns) == ["vms", "seconds", "cost", "cost_on_demand"]


def test_the_repr_says_what_was_spent_saved_and_the_rate_now() -> None:
    events = [vm("w-0", 1.8, 3.6), ev("running", 0, "w-0"), ev("deleted", 3600, "w-0")]
    events += [vm("w-1", 0.9, 1.8), ev("running", 0, "w-1")]
    report = compute_costs(events, now=T0 + 3600)
    assert repr(report) == "<CostReport $2.7000 spent, $5.4000 on demand, saved 50%; now $0.900/h>"


# -- the incremental bill (what the views and the policy ask between events) --------------------
def fed(b: Bill, *events: dict[str, Any]) -> Bill:
    for e in events:
        b.feed(e)
    return b


def ran(
    name: str, price: float, od: float, ended: tuple[str, float] | None = None
) -> tuple[dict[str, Any], ...]:
    """A worker VM's events: requested at ``price`` (``od`` on demand), running from 0 and, with
    ``ended`` (a kind and a time), ended."""
    events = (vm(name, price, od), ev("running", 0, name))
    return events if ended is None else (*events, ev(ended[0], ended[1], name))


def test_a_given_time_scale_wins_over_the_started_event_and_scales_running_vms() -> None:
    b = fed(Bill(minimum_s=0, time_scale=200.0), ev("started", 0, time_scale=5.0))
    fed(b, *ran("w-0", 3.6, 3.6))
    assert b.time_scale == 200.0
    # Half a wall second at 200x is 100 billed seconds (not 200: no one-second floor).
    assert b.vm_cost("w-0", now=T0 + 0.5) == pytest.approx(bill(100, 3.6, 0))
    total, total_od, rate, rate_od = b.totals(now=T0 + 0.5)
    assert total == total_od == pytest.approx(0.1)
    assert rate == rate_od == 3.6


def test_a_started_event_after_stopped_vms_rebills_them_once() -> None:
    # Never in a real log, but a fold that starts mid-log must not keep wall-time prices.
    b = fed(
        Bill(minimum_s=0),
        *ran("w-0", 3.6, 7.2, ("preempted", 10)),
        *ran("w-1", 3.6, 7.2, ("deleted", 20)),
        *ran("w-2", 3.6, 7.2),
    )
    assert b.totals(now=T0)[:2] == pytest.approx((0.03, 0.06))
    fed(b, ev("started", 30, time_scale=2.0))
    # 10 s and 20 s at 2x: 60 billed seconds, on demand at twice the price; w-2 has not stopped.
    assert b.totals(now=T0)[:2] == pytest.approx((0.06, 0.12))
    assert b.vm_cost("w-0") == pytest.approx(0.02)
    fed(b, ev("started", 40, time_scale=7.0))  # a second one changes nothing
    assert b.time_scale == 2.0 and b.totals(now=T0)[:2] == pytest.approx((0.06, 0.12))


def test_a_started_event_at_the_real_clock_rebills_nothing() -> None:
    b = fed(Bill(minimum_s=60), *ran("w-0", 3.6, 7.2))
    fed(b, ev("preempted", 10, "w-0"), ev("started", 20, time_scale=1.0))
    assert b.totals(now=T0)[:2] == pytest.approx((0.06, 0.12))  # one minimum each, kept


def test_the_same_name_requested_again_replaces_its_row_and_its_money() -> None:
    # The per-VM rows are by name: the totals must always be the sum of the rows.
    b = fed(Bill(minimum_s=0), *ran("w-0", 3.6, 7.2, ("preempted", 100)), vm("w-0", 36.0, 72.0))
    assert b.totals(now=T0 + 100)[:2] == (0.0, 0.0)  # the new one has not run yet
    assert not b.is_running("w-0") and b.price("w-0") == 36.0
    fed(b, ev("running", 200, "w-0"))
    assert b.is_running("w-0") and b.vm_cost("w-0", now=T0 + 210) == pytest.approx(0.1)
    fed(b, vm("w-0", 3.6, 7.2))  # requested again while running: no longer billed
    assert not b.is_running("w-0") and b.totals(now=T0 + 300) == (0.0, 0.0, 0.0, 0.0)
    report = b.report(now=T0 + 300)
    assert report.total == report.per_vm["cost"].sum() == 0.0


def test_vm_cost_of_unknown_waiting_stopped_and_running_vms() -> None:
    b = fed(Bill(minimum_s=600), vm("w-0", 3.6, 7.2), vm("w-1", 3.6, 7.2), ev("running", 0, "w-0"))
    assert b.vm_cost("nobody") == 0.0 and b.price("nobody") == 0.0 and not b.is_running("nobody")
    assert b.vm_cost("w-1", now=T0 + 5) == 0.0  # requested, never running
    assert b.vm_cost("w-0", now=T0 + 5) == pytest.approx(0.6)  # the minimum: 600 s
    assert b.totals(now=T0 + 5)[:2] == pytest.approx((0.6, 1.2))
    assert b.vm_cost("w-0", now=T0 + 1200) == pytest.approx(1.2)
    fed(b, ev("deleted", 900, "w-0"))
    assert b.vm_cost("w-0", now=T0 + 5000) == pytest.approx(0.9)  # the spot price, fixed
    assert b.report().per_vm.loc["w-0", "end"] == T0 + 900
