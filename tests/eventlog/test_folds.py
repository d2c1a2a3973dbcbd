"""Tests for transient_nb.eventlog.folds: one fold of the event log for every view.

A run record of a real run (``data/run-record.jsonl``: 2 workers, 21 preemptions and replacements,
400 steps of ResNet-8 on digits, 10x time compression) is the input throughout.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from tests.notebook.views.views_logs import FakeCluster
from transient_nb.eventlog.bill import compute_costs
from transient_nb.eventlog.folds import (
    MAX_GONE_ROWS,
    Bill,
    ClusterState,
    RunTracker,
    summarize,
    training_curve,
    vm_states,
)
from transient_nb.eventlog.format import policy_text
from transient_nb.eventlog.records import read_run_record
from transient_nb.eventlog.vocabulary import LIFECYCLE
from transient_nb.notebook.views.panel import ClusterPanel
from transient_nb.server.model import make_cluster_model

RECORD = Path(__file__).parents[1] / "data" / "run-record.jsonl"


@pytest.fixture(scope="module")
def log() -> list[dict[str, Any]]:
    return read_run_record(RECORD)


def cuts(log: list[dict[str, Any]], n: int = 12) -> list[int]:
    """``n`` prefix lengths spread over the log, the whole log last."""
    return sorted({max(1, len(log) * i // n) for i in range(1, n + 1)})


# -- money -------------------------------------------------------------------------------------------
def test_bill_matches_compute_costs_at_every_point(log: list[dict[str, Any]]) -> None:
    bill = Bill(minimum_s=60)
    for i, e in enumerate(log, 1):
        bill.feed(e)
        if i % 5 and i != len(log):
            continue
        t = float(e["time"]) + 3.0  # between events too: running VMs keep billing
        want = compute_costs(log[:i], now=t, minimum_s=60)
        total, total_od, rate, rate_od = bill.totals(now=t)
        assert total == pytest.approx(want.total, rel=1e-12, abs=1e-15)
        assert total_od == pytest.approx(want.total_on_demand, rel=1e-12, abs=1e-15)
        assert (rate, rate_od) == pytest.approx((want.rate, want.rate_on_demand))
    got = bill.report(now=t).per_vm
    assert got.index.tolist() == want.per_vm.index.tolist()
    pd.testing.assert_series_equal(got["cost"], want.per_vm["cost"], rtol=1e-12)


def test_a_closed_cluster_stops_billing_at_its_close(log: list[dict[str, Any]]) -> None:
    state = ClusterState(minimum_s=60)
    state.feed(log)
    assert state.closed
    assert state.cost(now=log[-1]["time"] + 3600).total == state.cost().total
    assert state.cost().total == pytest.approx(compute_costs(log, minimum_s=60).total)


# -- the VM table -------------------------------------------------------------------------------------
def test_vm_table_keeps_live_vms_and_the_latest_gone_ones(log: list[dict[str, Any]]) -> None:
    state = ClusterState()
    state.feed(log[: len(log) // 2])
    now = log[len(log) // 2]["time"]
    rows = state.rows(now)
    live = [r for r in rows if not r["gone"]]
    gone = [r for r in rows if r["gone"]]
    assert live[0]["name"] == "ps-0" and live[0]["role"] == "ps"
    assert len(gone) == MAX_GONE_ROWS  # far more went by the middle of this run
    assert [r["since"] for r in gone] == sorted((r["since"] for r in gone), reverse=True)
    # Every row's state is its VM's last lifecycle event (a late "left" aside).
    for r in rows:
        last = [e for e in log[: len(log) // 2] if e.get("worker") == r["name"]]
        last = [e for e in last if e["kind"] in LIFECYCLE and e["time"] <= r["since"]]
        assert r["state"] == last[-1]["kind"] and r["seconds_in_state"] == now - r["since"]
    workers = [r["state"] for r in live if r["role"] == "worker"]
    assert state.counts() == {s: workers.count(s) for s in workers}


def test_a_late_left_does_not_revive_a_preempted_vm() -> None:
    state = ClusterState()
    base = {"worker": "w-0", "role": "worker"}
    state.feed(
        [
            {"kind": "requested", "time": 0.0, **base},
            {"kind": "preempted", "time": 1.0, **base},
            {"kind": "left", "time": 2.0, **base},
        ]
    )
    assert [(r["state"], r["gone"]) for r in state.rows(now=3.0)] == [("preempted", True)]


def test_the_policy_on_its_last_decision_and_off() -> None:
    """What the panels show of a policy: the goal that is on, its latest decision, nothing once
    it is turned off (a decision of an earlier policy is not shown under a new goal)."""
    state = ClusterState()
    decision = {"reason": "8 k80 ...: ETA 3.90 h -> 0.49 h", "acted": True, "feasible": True}
    decision |= {"eta_s": 1764.0, "expected_cost": 1.07, "mix": {"k80": 8}}
    decision |= {"p_lose_1h": [0.48, 0.14, 0.03], "goal": "deadline", "liveput": 36.4}
    state.feed([{"kind": "policy-decision", "time": 0.5, **decision}])  # no policy on: ignored
    assert state.policy is None
    state.feed(
        [
            {"kind": "policy", "time": 1.0, "goal": "deadline", "deadline_s": 3600.0},
            {"kind": "policy-decision", "time": 2.0, **decision},
        ]
    )
    assert state.policy is not None
    assert (state.policy["goal"], state.policy["deadline_s"]) == ("deadline", 3600.0)
    assert state.policy["decision"]["time"] == 2.0
    assert state.policy["decision"]["p_lose_1h"] == [0.48, 0.14, 0.03]
    assert state.policy["decision"]["eta_s"] == 1764.0 and "liveput" not in state.policy["decision"]
    model = make_cluster_model({"name": "c"}, [], state=state)
    assert model["policy"] == {**state.policy, "text": policy_text(state.policy)}
    assert model["policy"]["text"].startswith("Policy: deadline in 1 h 00 min · 8 k80")
    assert model["policy"]["text"].endswith("within 1 h): 48%, 14%, 3%")
    state.feed([{"kind": "policy", "time": 3.0, "goal": "budget", "budget": 5.0}])
    assert state.policy["decision"] is None and state.policy["budget"] == 5.0
    state.feed([{"kind": "policy", "time": 4.0, "goal": None}])
    assert state.policy is None


# -- one fold for the run: its progress, summary and curve ------------------------------------
def test_folding_keeps_no_copy_of_the_log(log: list[dict[str, Any]]) -> None:
    # Incremental: what a state holds grows with the VMs and the rare events, not the metrics.
    many = [*log[:-1]]
    t = log[-2]["time"]
    many += [
        {"kind": "metrics", "time": t + k * 0.01, "run": "run-ade2ef1d", "step": 400 + k}
        for k in range(5000)
    ]
    state = ClusterState()
    state.feed(many)
    sizes = [len(v) for v in vars(state.summary_fold).values() if isinstance(v, list)]
    assert max(sizes) < 100
    assert len(state.tracker._pace) < 100 * 60  # bounded by the pace window
    assert state.n_events == len(many)


# -- one fold, every view -------------------------------------------------------------------------------
def panel_figures(panel: ClusterPanel) -> dict[str, Any]:
    p = panel.state.progress
    assert panel.cost is not None
    return {
        "rows": [(r["name"], r["state"], r["gone"], round(r["cost"], 9)) for r in panel.rows],
        "cost": round(panel.cost.total, 9),
        "on_demand": round(panel.cost.total_on_demand, 9),
        "rate": round(panel.cost.rate, 9),
        "target": panel.target,
        "step": p.step if p else None,
        "accuracy": p.accuracy if p else None,
        "eta_s": p.eta_s if p else None,
        "finished": p.finished if p else None,
    }


def lab_figures(model: dict[str, Any]) -> dict[str, Any]:
    t = model["training"]
    return {
        "rows": [(r["name"], r["state"], r["gone"], round(r["cost"], 9)) for r in model["workers"]],
        "cost": round(model["cost"]["cost"], 9),
        "on_demand": round(model["cost"]["cost_on_demand"], 9),
        "rate": round(model["cost"]["rate_per_hour"], 9),
        "target": model["target_workers"],
        "step": t["step"] if t else None,
        "accuracy": t["accuracy"] if t else None,
        "eta_s": t["eta_s"] if t else None,
        "finished": t["finished"] if t else None,
    }


def test_notebook_and_lab_panels_show_the_same_figures(log: list[dict[str, Any]]) -> None:
    shown: list[dict[str, Any]] = []
    cluster = FakeCluster(shown)
    panel = ClusterPanel(cluster, start=False)
    entry = {"name": "fake", "backend": "local"}
    etas = 0
    for n in cuts(log, 16):
        shown[:] = log[:n]
        now = float(log[n - 1]["time"]) + 1.5
        panel.update(force=True, now=now)
        lab = make_cluster_model(entry, log[:n], now=now, minimum_s=60)
        assert panel_figures(panel) == lab_figures(lab), f"after {n} events"
        etas += lab["training"] is not None and lab["training"]["eta_s"] not in (None, 0.0)
    assert etas >= 3  # the comparison covered the ETA while the run went on
    assert lab["status"] == "closed" and "closed" in panel.header.value


def test_vm_states() -> None:
    events = [
        {"kind": "started", "time": 0.0},
        {"kind": "requested", "time": 1.0, "worker": "w-0", "role": "worker", "gpu": "t4",
         "zone": "z", "spot": True, "price": 0.2},
        {"kind": "running", "time": 2.0, "worker": "w-0"},
        {"kind": "joined", "time": 3.0, "worker": "w-0", "address": "tcp://a"},
        {"kind": "requested", "time": 1.0, "worker": "w-1", "role": "worker", "gpu": "t4"},
        {"kind": "running", "time": 2.0, "worker": "w-1"},
        {"kind": "preempted", "time": 5.0, "worker": "w-1"},
        {"kind": "left", "time": 6.0, "worker": "w-1"},  # late: does not revive it
        {"kind": "replacement-requested", "time": 6.0, "worker": "w-1"},  # not a lifecycle event
    ]  # fmt: skip
    df = vm_states(events, now=10.0)
    assert df.loc["w-0", "state"] == "joined"
    assert df.loc["w-0", "seconds_in_state"] == pytest.approx(7.0)
    assert df.loc["w-0", "address"] == "tcp://a" and df.loc["w-0", "gpu"] == "t4"
    assert df.loc["w-1", "state"] == "preempted"
    assert df.loc["w-1", "since"] == 5.0
    assert vm_states([]).empty


# -- the vocabulary ---------------------------------------------------------------------------------


def _own_run_log() -> list[dict[str, Any]]:
    """A user's run: its metrics in every evaluation, no accuracy among them."""
    return [
        {"kind": "train-started", "time": 0.0, "run": "r", "steps": 100, "batch_size": 8,
         "model": "Net", "parameters": 385, "metrics": ["mae", "mse"]},
        {"kind": "metrics", "time": 1.0, "run": "r", "step": 10, "loss": 2.0, "lr": 0.01,
         "active_workers": 2, "staleness": 0.5, "img_per_s": 80.0},
        {"kind": "eval", "time": 1.5, "run": "r", "step": 10, "accuracy": None, "test_loss": 1.2,
         "metrics": {"mae": 0.9, "mse": 1.2}},
        {"kind": "metrics", "time": 2.0, "run": "r", "step": 20, "loss": 1.0, "lr": 0.01,
         "active_workers": 2, "staleness": 0.5, "img_per_s": 80.0},
        {"kind": "eval", "time": 2.5, "run": "r", "step": 20, "accuracy": None, "test_loss": 0.6,
         "metrics": {"mae": 0.5, "mse": 0.6}},
        {"kind": "metrics", "time": 3.0, "run": "r", "step": 30, "loss": 0.7, "lr": 0.01,
         "active_workers": 2, "staleness": 0.5, "img_per_s": 80.0},
        {"kind": "train-finished", "time": 3.5, "run": "r", "reason": "metric", "step": 30,
         "metrics": {"mae": 0.5, "mse": 0.6}, "stopped_by": "mae<=0.5"},
    ]  # fmt: skip


def test_every_metric_is_a_column_of_the_curve_and_in_the_summary_and_progress() -> None:
    from transient_nb.eventlog.folds import CURVE_COLUMNS, eval_metrics

    log = _own_run_log()
    h = training_curve(log, t0=0.0)
    assert list(h.columns) == [*CURVE_COLUMNS, "mae", "mse"]
    assert h["mae"].isna().tolist() == [True, False, False]  # before the first evaluation
    assert h["mae"].tolist()[1:] == [0.9, 0.5] and h["accuracy"].isna().all()
    s = summarize(log)
    assert s["metrics"] == {"mae": 0.5, "mse": 0.6} and s["accuracy"] is None
    assert s["parameters"] == 385 and s["reason"] == "metric"
    tracker = RunTracker()
    tracker.feed(log)
    assert tracker.progress is not None
    assert tracker.progress.metrics == {"mae": 0.5, "mse": 0.6}
    assert tracker.progress.parameters == 385
    # A built-in run's evaluation has accuracy alone, and its curve no further column.
    assert eval_metrics({"kind": "eval", "accuracy": 0.9}) == {"accuracy": 0.9}
    assert list(training_curve([], t0=0.0).columns) == CURVE_COLUMNS
