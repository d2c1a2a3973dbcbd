"""Tests for transient_nb.eventlog.progress: a run's step, pace and ETA, folded event by event."""

from __future__ import annotations

import pytest

from transient_nb.eventlog.progress import RunTracker


def test_progress_follows_the_latest_run_with_a_windowed_pace() -> None:
    t = RunTracker(pace_window_s=10)
    t.feed(
        [
            {"kind": "train-started", "time": 0.0, "run": "a", "steps": 1000},
            {"kind": "metrics", "time": 1.0, "run": "a", "step": 10},
            {"kind": "metrics", "time": 21.0, "run": "a", "step": 20},  # a slow spell...
            {"kind": "metrics", "time": 25.0, "run": "a", "step": 100},  # ...then fast again
            {"kind": "metrics", "time": 30.0, "run": "a", "step": 200},
        ]
    )
    p = t.progress
    assert p is not None and p.steps_per_s == pytest.approx(20)  # the last 10 s only
    assert p.eta_s == pytest.approx(40)
    t.feed(
        [
            {
                "kind": "train-finished",
                "time": 31.0,
                "run": "a",
                "reason": "error",
                "step": 200,
                "error": "PS gone",
            }
        ]
    )
    assert (p.state, p.error, p.finished, p.eta_s) == ("error", "PS gone", True, 0.0)
    t.feed([{"kind": "train-started", "time": 40.0, "run": "b", "steps": 5}])
    assert t.progress is not None and t.progress.run == "b" and t.progress.step == 0
