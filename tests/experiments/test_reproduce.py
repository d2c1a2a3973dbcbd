"""The paper's experiments: the pure parts (revocation curve, speed shape, measuring a run's
events). The runs themselves are exercised by tests/test_benchmarks.py and the notebook's test."""

from __future__ import annotations

import pytest

from transient_nb.experiments.reproduce import PAPER_TABLE, measure, paper_speed, revoked_by


def test_revoked_by_follows_the_papers_k80_curve():
    assert revoked_by("k80", 0) == 0
    assert revoked_by("k80", 1) == pytest.approx(0.078)
    assert revoked_by("k80", 2) == pytest.approx(0.141)
    assert revoked_by("k80", 1.5) == pytest.approx((0.078 + 0.141) / 2)
    assert revoked_by("k80", 30) == 1.0


def test_paper_speed_is_linear_then_the_ps_plateau():
    assert paper_speed("k80", 8, 1) == pytest.approx(8 * 4.56)  # under 45: linear
    assert paper_speed("v100", 8, 1) == 45.0
    assert paper_speed("v100", 8, 2) == pytest.approx(45 * 1.75)
    assert PAPER_TABLE["4 transient K80"]["hours"] == 1.05


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


def test_setups_of_the_mixed_and_growing_experiments():
    from transient_nb.experiments.reproduce import (
        DYNAMIC_SETUPS,
        MIXED_SETUPS,
        Setup,
        grow_marks,
        model_speed,
    )

    slow, mix, dear = MIXED_SETUPS
    assert mix.types == {"k80": 2, "p100": 1, "v100": 1} and mix.workers == 4
    assert slow.types == {"k80": 4} and dear.types == {"v100": 4}
    # The paper's model: the mix asks for 36.9 global steps/s, under one PS's 45; 4 V100 hit it.
    assert model_speed(mix) == pytest.approx(2 * 4.56 + 12.2 + 15.6)
    assert model_speed(dear) == 45.0 and model_speed(slow) == pytest.approx(4 * 4.56)
    static, growing, big = DYNAMIC_SETUPS
    assert static.bill_ps is True and static.most_workers == 1
    assert growing.most_workers == 4 and big.most_workers == 4
    # One worker more at each quarter, as the paper's one more every 16K of 64K steps.
    assert grow_marks(growing, 64000) == [16000, 32000, 48000]
    assert grow_marks(growing, 640) == [160, 320, 480]
    assert grow_marks(static, 640) == [] and grow_marks(
        Setup("2->3", "t4", 2, True, grow_to=3), 90
    ) == [45]


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


def test_a_growing_cluster_bills_its_ps_from_the_start():
    from transient_nb.experiments.reproduce import DYNAMIC_SETUPS, TABLE_SETUPS

    static, growing, big = DYNAMIC_SETUPS
    assert static.bills_ps and growing.bills_ps and big.bills_ps
    assert not TABLE_SETUPS[0].bills_ps  # the paper's one-GPU baseline had no PS
