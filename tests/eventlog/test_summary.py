"""Tests for transient_nb.eventlog.summary: a run's summary and its training curve, from its event log.

A run record of a real run (``data/run-record.jsonl``: 2 workers, 21 preemptions and replacements,
400 steps of ResNet-8 on digits, 10x time compression) is the input of the first ones.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from transient_nb.eventlog.bill import compute_costs
from transient_nb.eventlog.folds import ClusterState
from transient_nb.eventlog.records import read_run_record
from transient_nb.eventlog.summary import summarize, training_curve
from transient_nb.eventlog.vocabulary import make_event

RECORD = Path(__file__).parents[1] / "data" / "run-record.jsonl"


@pytest.fixture(scope="module")
def log() -> list[dict[str, Any]]:
    return read_run_record(RECORD)


def test_summary_is_the_runs(log: list[dict[str, Any]]) -> None:
    s = summarize(log, minimum_s=60)
    # What training.run.summarize said of this record when the run ended.
    assert s["run"] == "run-ade2ef1d" and s["reason"] == "steps" and s["steps"] == 400
    assert (s["preemptions"], s["replacements"], s["ps_recoveries"]) == (21, 21, 0)
    assert s["lost_in_flight"] == 3 and s["speedup_over_one_worker"] is None
    assert s["error"] is None and s["trainer_failures"] == 0
    assert s["wall_s"] == pytest.approx(45.94508504867554)
    assert s["accuracy"] == pytest.approx(0.9722222222222222)
    assert s["cost"] == pytest.approx(0.11144500942362681)
    assert s["cost_on_demand"] == pytest.approx(0.30964690899186664)
    assert s["img_per_s"] == pytest.approx(278.593455348691)
    # The live fold gives the same summary.
    state = ClusterState(minimum_s=60)
    state.feed(log)
    assert state.summary() == s


def test_training_curve_prices_each_row_like_a_fresh_bill(log: list[dict[str, Any]]) -> None:
    t0 = next(e["time"] for e in log if e["kind"] == "train-started")
    h = training_curve(log, t0=t0, minimum_s=60)
    metrics = [(i, e) for i, e in enumerate(log) if e["kind"] == "metrics"]
    assert len(h) == len(metrics) and list(h["step"]) == [e["step"] for _, e in metrics]
    for row, (i, e) in zip(h.itertuples(), metrics, strict=True):
        ref = compute_costs(log[: i + 1], now=e["time"], minimum_s=60)
        assert row.cost == pytest.approx(ref.total) and row.time == e["time"] - t0
    assert h["accuracy"].iloc[-1] is not None and not math.isnan(h["accuracy"].iloc[-1])


def _speedup_log(devices: list[str]) -> list[dict]:
    events = [
        {"kind": "train-started", "time": 0.0, "run": "r", "batch_size": 10},
    ]
    for i, device in enumerate(devices):
        events.append(
            {
                "kind": "worker-metrics",
                "time": 1.0,
                "run": "r",
                "worker": f"w-{i}",
                "img_per_s": 100.0,
                "device": device,
            }
        )
    events.append(
        {"kind": "train-finished", "time": 10.0, "run": "r", "step": 300, "reason": "steps"}
    )
    return events


def test_speedup_only_where_one_worker_was_measured_alone():
    # Three trainers on GPUs of their own: 300 steps x 10 images in 10 s = 300 img/s over 100.
    own = summarize(_speedup_log(["cuda:GPU-a", "cuda:GPU-b", "cuda:GPU-c"]))
    assert own["speedup_over_one_worker"] == pytest.approx(3.0)
    # Workers sharing the host's cores, or one GPU: their rates are not one worker's alone.
    cpu = summarize(_speedup_log(["cpu", "cpu"]))
    assert cpu["speedup_over_one_worker"] is None and "CPU cores" in cpu["speedup_note"]
    shared = summarize(_speedup_log(["cuda:GPU-a", "cuda:GPU-a"]))
    assert shared["speedup_over_one_worker"] is None and "share a GPU" in shared["speedup_note"]
    old = summarize(_speedup_log(["unknown"]))  # a record from before devices were reported
    assert old["speedup_over_one_worker"] is None


def test_the_summary_says_whether_the_host_kept_the_emulated_pace():
    def of_worker(kind: str, worker: str, gpu: str, **fields: Any) -> dict[str, Any]:
        return make_event(kind, run="r", worker=worker, role="worker", gpu=gpu, **fields)

    paced = [  # a GPU with a step rate to keep, and one without
        of_worker(
            "emulation-paced",
            worker,
            gpu,
            steps_per_s=rate,
            wall_steps_per_s=wall_rate,
            time_scale=5.0,
            step_scale=1.0,
        )
        for worker, gpu, rate, wall_rate in (
            ("w-0", "k80", 4.56, 22.8),
            ("w-1", "h100", None, None),
        )
    ]
    kept = summarize(paced)
    assert kept["emulated"] and kept["emulation_behind"] == 0
    assert "kept the emulated pace" in kept["emulation_note"] and "w-1" in kept["emulation_note"]
    behind = of_worker(
        "emulation-behind",
        "w-0",
        "k80",
        target_steps_per_s=22.8,
        achieved_steps_per_s=11.4,
        window_s=2.0,
    )
    s = summarize([*paced, behind])
    assert s["emulation_behind"] == 1 and "could NOT keep" in s["emulation_note"]
    assert "50%" in s["emulation_note"]
    plain = summarize([])
    assert not plain["emulated"] and plain["emulation_note"].startswith("not emulated")


def test_summary_groups_each_workers_steps_by_gpu_type() -> None:
    def req(name: str, gpu: str) -> dict:
        return make_event("requested", worker=name, role="worker", gpu=gpu, zone="z", spot=True)

    def wm(name: str, local: int, t: float) -> dict:
        e = make_event(
            "worker-metrics", run="r", worker=name, step=0, img_per_s=1.0, local_step=local
        )
        return {**e, "time": t}

    events = [
        {**make_event("train-started", run="r", steps=100, batch_size=32), "time": 0.0},
        req("w-0", "k80"),
        req("w-1", "k80"),
        req("w-2", "v100"),
        wm("w-0", 5, 1.0),
        wm("w-0", 10, 2.0),
        wm("w-1", 8, 2.0),
        wm("w-2", 30, 2.0),
        {**make_event("train-finished", run="r", step=48, reason="steps"), "time": 10.0},
    ]
    by_gpu = summarize(events)["by_gpu"]
    assert by_gpu == {
        "k80": {"workers": 2, "steps": 18, "steps_per_s": 1.8},
        "v100": {"workers": 1, "steps": 30, "steps_per_s": 3.0},
    }
    assert summarize([])["by_gpu"] == {}


def test_a_spare_asked_for_ahead_counts_as_the_replacement_of_its_worker():
    t = 1_800_000_000.0
    events = [
        {"kind": "started", "time": t, "time_scale": 1.0, "workers": 1},
        {"kind": "train-started", "time": t + 1, "run": "r", "steps": 10, "batch_size": 8},
        {"kind": "spare-requested", "time": t + 2, "worker": "w-0", "role": "worker", "odds": 1.0},
        {"kind": "preempted", "time": t + 3, "worker": "w-0", "role": "worker"},
        {"kind": "train-finished", "time": t + 4, "run": "r", "reason": "steps", "step": 10},
    ]
    s = summarize(events)
    assert (s["preemptions"], s["replacements"]) == (1, 1)
