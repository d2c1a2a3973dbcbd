"""Tests for transient_nb.notebook.views.progress: a run's progress, on its own or in the panel."""

from __future__ import annotations

from typing import Any

import pytest

from tests.notebook.views.views_logs import LIFE, T0, FakeCluster, vm
from transient_nb.eventlog.bill import compute_costs
from transient_nb.eventlog.folds import RunTracker
from transient_nb.notebook.views.progress import RunPanel


def test_run_tracker_eta_and_projected_cost() -> None:
    tracker = RunTracker()
    tracker.feed(
        [
            {"kind": "train-started", "time": T0, "run": "r", "steps": 1000, "model": "m"},
            {"kind": "metrics", "time": T0 + 10, "run": "r", "step": 100, "img_per_s": 50.0},
            {"kind": "metrics", "time": T0 + 20, "run": "r", "step": 300, "img_per_s": 70.0},
            {"kind": "eval", "time": T0 + 21, "run": "r", "step": 300, "accuracy": 0.5},
            {"kind": "metrics", "time": T0 + 21, "run": "other", "step": 5},
            vm("preempted", "w-1", 22),
        ]
    )
    p = tracker.progress
    assert p is not None
    assert (p.step, p.target, p.accuracy, p.img_per_s, p.preemptions) == (300, 1000, 0.5, 70.0, 1)
    assert p.steps_per_s == pytest.approx(20)
    assert p.eta_s == pytest.approx(35)
    cost = compute_costs(LIFE[:9], now=T0 + 50, minimum_s=60)
    # $/h of the running VMs (per simulated hour) times the ETA in simulated hours.
    expected = cost.total + cost.rate * 35 * 2.0 / 3600
    assert p.projected_cost(cost) == pytest.approx(expected)
    tracker.feed(
        [{"kind": "train-finished", "time": T0 + 30, "run": "r", "reason": "steps", "step": 1000}]
    )
    assert (p.state, p.step, p.eta_s, p.projected_cost(cost)) == ("steps", 1000, 0.0, cost.total)


class FakeRun:
    """What a run's view reads: an id, its cluster, and a stop that records the call."""

    hp = None

    def __init__(self, cluster: FakeCluster):
        self.id = "r"
        self.cluster = cluster
        self.stopped: list[bool] = []

    def stop(self, wait: bool = True) -> None:
        self.stopped.append(wait)


def test_run_panel_shows_only_its_run() -> None:
    events: list[dict[str, Any]] = [
        *LIFE,
        {"kind": "train-started", "time": T0 + 5, "run": "r", "steps": 100, "model": "m"},
        {"kind": "metrics", "time": T0 + 10, "run": "r", "step": 10, "img_per_s": 5.0},
        {"kind": "metrics", "time": T0 + 20, "run": "r", "step": 30, "img_per_s": 5.0},
    ]
    run = FakeRun(FakeCluster(events))
    panel = RunPanel(run, start=False)
    assert "ClusterPanel" not in repr(panel) and "step 30/100, running" in repr(panel)
    assert (panel.progress.value, panel.progress.max) == (30, 100)
    assert "ETA <b>35 s</b>" in panel.run_info.value  # 70 steps at 2 steps/s
    # No VM table, no cluster buttons: the cluster's panel is shown once, by the cluster.
    assert not hasattr(panel, "table") and not hasattr(panel, "preempt_button")
    panel.view.stop_run_button.click()
    assert run.stopped == [False] and "Stopping" in panel.message.value
    events.append(
        {"kind": "train-finished", "time": T0 + 30, "run": "r", "reason": "steps", "step": 100}
    )
    assert panel.update()
    assert panel.progress.value == 100 and "finished" in panel.run_info.value
    assert panel.view.stop_run_button.disabled
    events.append(vm("preempted", "w-0", 31))
    panel.update(force=True)
    assert "1 preemptions" in panel.run_info.value


def test_a_failed_run_shows_its_error_escaped_in_the_panel() -> None:
    """Trainers that kept failing stop the run; the panel says so, with the error, as text."""
    error = "Every trainer kept failing: OutOfMemoryError: <tried 2 GiB> & gave up"
    events: list[dict[str, Any]] = [
        *LIFE,
        {"kind": "train-started", "time": T0 + 5, "run": "r", "steps": 100, "model": "m"},
        {"kind": "metrics", "time": T0 + 10, "run": "r", "step": 10, "img_per_s": 5.0},
    ]
    run = FakeRun(FakeCluster(events))
    panel = RunPanel(run, start=False)
    for attempt in (1, 2):
        events.append(
            {
                "kind": "trainer-failed",
                "time": T0 + 10 + attempt,
                "run": "r",
                "worker": "w-0",
                "error": "OutOfMemoryError: <tried 2 GiB>",
                "attempt": attempt,
                "gave_up": attempt == 2,
            }
        )
    panel.update(force=True)
    assert "ETA" in panel.run_info.value and "finished" not in panel.run_info.value
    events.append(
        {
            "kind": "train-finished",
            "time": T0 + 13,
            "run": "r",
            "reason": "trainer-failed",
            "step": 10,
            "error": error,
        }
    )
    assert panel.update()
    info = panel.run_info.value
    assert "<b>finished</b> (trainer-failed): " in info
    assert "Every trainer kept failing: OutOfMemoryError: &lt;tried 2 GiB&gt; &amp; gave up" in info
    assert "<tried" not in info  # the error is text, never markup
    assert panel.view.stop_run_button.disabled
    assert panel.progress.bar_style == "danger"  # an error, not a warning


def test_the_progress_line_shows_the_model_its_size_and_every_metric() -> None:
    from transient_nb.eventlog.bill import CostReport
    from transient_nb.eventlog.folds import RunProgress
    from transient_nb.notebook.views.progress import progress_html

    p = RunProgress(run="r", target=100, step=40, model="Net", parameters=1234,
                    metrics={"mae": 0.3125, "accuracy": 0.5})  # fmt: skip
    cost = CostReport(
        per_vm={}, total=0.0, total_on_demand=0.0, rate=0.0, rate_on_demand=0.0, time_scale=1.0
    )
    text = progress_html(p, cost)
    assert "Net (1,234 parameters)" in text
    assert "mae <b>0.3125</b>" in text and "accuracy <b>50.0%</b>" in text
    builtin = progress_html(RunProgress(run="r", target=10, accuracy=0.25), cost)
    assert "accuracy <b>25.0%</b>" in builtin
