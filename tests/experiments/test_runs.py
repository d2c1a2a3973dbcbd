"""Tests for transient_nb.experiments.runs: measuring a paced run from its events (the runs
themselves are exercised by tests/test_paper_benchmarks.py and
tests/test_reproduce_notebook.py)."""

from __future__ import annotations

import pytest

from transient_nb.experiments.runs import measure


def _vm(t, name, role, price, od):
    fields = {"worker": name, "role": role, "price": price, "price_on_demand": od}
    return [
        {"kind": "requested", "time": t, **fields},
        {"kind": "running", "time": t, **fields},
    ]


def _events(time_scale=100.0):
    ev = [{"kind": "started", "time": 0.0, "time_scale": time_scale}]
    ev += _vm(0.0, "ps-0", "ps", 0.143, 0.143)
    ev += _vm(0.0, "w-0", "worker", 0.256, 0.723) + _vm(0.0, "w-1", "worker", 0.256, 0.723)
    ev.append({"kind": "train-started", "time": 5.0, "run": "r", "batch_size": 32})
    for w, t in (("w-0", 10.0), ("w-1", 12.0)):
        ev.append({"kind": "emulation-paced", "time": t, "worker": w, "role": "worker"})
    # Steps from the first metrics once both run (t=12.5) to the last: 10 steps/s.
    ev += [
        {"kind": "metrics", "time": 11.0, "step": 3, "shard": 0},
        {"kind": "metrics", "time": 12.5, "step": 20, "shard": 0},
        {"kind": "metrics", "time": 22.5, "step": 120, "shard": 0},
    ]
    ev.append({"kind": "preempted", "time": 20.0, "worker": "w-1", "role": "worker"})
    ev.append({"kind": "train-finished", "time": 24.0, "step": 120, "run": "r"})
    return ev


def test_measure_extrapolates_the_window_once_every_trainer_runs():
    m = measure(_events(), workers=2, steps=120, time_scale=100.0, step_scale=50.0)
    # 120 steps at 10 steps/s: 12 wall s, 1200 simulated s.
    assert m["hours"] == pytest.approx(1200 / 3600)
    assert m["global_steps_per_s"] == pytest.approx(10 * 50 / 100)
    # Billed over the window [12.5, 22.5], w-1 only until it was revoked at 20.0, x1.2 to the
    # whole run (12 s of 10).
    window = (0.143 + 0.256) * 10 + 0.256 * 7.5
    assert m["cost"] == pytest.approx(window * 100 / 3600 * 1.2)
    assert m["revocations"] == 1 and m["behind"] == 0
    no_ps = measure(
        _events(), workers=2, steps=120, time_scale=100.0, step_scale=50.0, with_ps=False
    )
    assert no_ps["cost"] == pytest.approx((0.256 * 10 + 0.256 * 7.5) * 100 / 3600 * 1.2)


def test_measure_refuses_a_run_too_short_or_unfinished():
    events = [e for e in _events() if e["kind"] != "train-finished"]
    with pytest.raises(ValueError, match="finished"):
        measure(events, workers=2, steps=120, time_scale=1.0, step_scale=1.0)
    short = [e for e in _events() if e["kind"] != "metrics"]
    with pytest.raises(ValueError, match="too short"):
        measure(short, workers=2, steps=120, time_scale=1.0, step_scale=1.0)


def test_a_trainer_too_late_for_two_windows_is_measured_over_every_window_and_counts_behind():
    # A loaded host: w-1's first call timed out and it started at 22.6, after the last window.
    events = [
        {**e, "time": 22.6} if e["kind"] == "emulation-paced" and e["worker"] == "w-1" else e
        for e in _events()
    ]
    m = measure(events, workers=2, steps=120, time_scale=100.0, step_scale=50.0)
    # Every window there was, from t=11 (3 steps) to 22.5 (120): 117 / 11.5 steps/s.
    assert m["global_steps_per_s"] == pytest.approx(117 / 11.5 * 50 / 100)
    assert m["behind"] == 1  # the row says the host did not keep the pace
    on_time = measure(_events(), workers=2, steps=120, time_scale=100.0, step_scale=50.0)
    assert on_time["behind"] == 0


def test_join_delays_pair_each_scale_up_with_the_next_new_trainer():
    from transient_nb.experiments.reproduce import join_delays

    events = [
        {"kind": "emulation-paced", "time": 1.0, "worker": "w-0", "role": "worker"},
        {"kind": "scale", "time": 10.0, "workers": 2},
        {"kind": "emulation-paced", "time": 10.5, "worker": "ps-0", "role": "ps"},  # not a worker
        {"kind": "emulation-paced", "time": 12.0, "worker": "w-1", "role": "worker"},
        {"kind": "scale", "time": 20.0, "workers": 3},
        {"kind": "emulation-paced", "time": 23.0, "worker": "w-2", "role": "worker"},
        {"kind": "scale", "time": 30.0, "workers": 4},  # the run ended before it joined
    ]
    assert join_delays(events, time_scale=40.0) == [80.0, 120.0]


def test_measure_reports_each_types_steps():
    events = _events()
    for e in events:
        if e["kind"] == "requested" and e["worker"] == "w-0":
            e["gpu"] = "k80"
    events.insert(-1, {"kind": "worker-metrics", "time": 23.0, "worker": "w-0", "local_step": 90})
    out = measure(events, workers=2, steps=1000, time_scale=100.0, step_scale=64.0)
    assert out["by_gpu"]["k80"]["steps"] == 90
