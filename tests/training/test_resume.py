"""Finding where a run resumes from, and joining its records into one run (training/resume.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from transient_nb.training import checkpoint, resume
from transient_nb.training.run import _resumed_settings


def _checkpoint(url: str, step: int, run: str = "run-1a2b3c4d") -> None:
    entry = checkpoint.write_shard(url, step, 0, {"weights": np.ones(3, np.float32)})
    meta = {
        "run": run,
        "model": "resnet8",
        "data": "digits",
        "shards": 1,
        "hparams": {"steps": 900, "lr": 0.05},
    }
    checkpoint.write_manifest(url, step, meta, [entry])


def _record(path: Path, events: list[dict]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return str(path)


def test_a_run_id_is_found_in_the_newest_record_with_its_last_step(tmp_path: Path) -> None:
    url = str(tmp_path / "ck")
    _checkpoint(url, 200)
    _checkpoint(url, 400)
    started = {
        "kind": "train-started",
        "time": 1.0,
        "run": "run-1a2b3c4d",
        "model": "resnet8",
        "data": "digits",
        "shards": 1,
        "steps": 900,
        "checkpoint_url": url,
        "hparams": json.dumps({"steps": 900, "lr": 0.05}),
    }
    metrics = {"kind": "metrics", "time": 2.0, "run": "run-1a2b3c4d", "step": 437}
    other = {"kind": "metrics", "time": 2.0, "run": "run-99999999", "step": 5000}
    record = _record(tmp_path / "runs" / "c-1" / "events.jsonl", [started, metrics, other])
    point = resume.find("run-1a2b3c4d", str(tmp_path / "runs"))
    assert point.run_id == "run-1a2b3c4d" and point.checkpoint_url == url
    assert point.record == record and point.last_step == 437  # another run's steps do not count
    assert point.settings["model"] == "resnet8" and point.settings["hparams"]["lr"] == 0.05


def test_a_checkpoint_url_carries_its_own_settings(tmp_path: Path) -> None:
    url = str(tmp_path / "ck")
    _checkpoint(url, 300)
    point = resume.find(url)
    assert point.run_id == "run-1a2b3c4d" and point.record is None
    assert point.settings["shards"] == 1 and point.settings["steps"] == 900


@pytest.mark.parametrize(
    ("what", "message"),
    [
        ("run-00000000", "no run record"),
        ("", "give a run id"),
    ],
)
def test_nothing_to_resume_is_a_clear_error(tmp_path: Path, what: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        resume.find(what, str(tmp_path / "runs"))


def test_a_folder_without_a_complete_checkpoint_cannot_be_resumed(tmp_path: Path) -> None:
    url = str(tmp_path / "ck")
    checkpoint.write_shard(url, 100, 0, {"weights": np.ones(3, np.float32)})  # no manifest: torn
    with pytest.raises(ValueError, match="no complete checkpoint"):
        resume.find(url)


def test_a_shared_url_resumes_its_one_run_and_lists_several(tmp_path: Path) -> None:
    """Issue 30: runs share a checkpoint_url, each in URL/<run id>/."""
    shared = str(tmp_path / "runs-shared")
    _checkpoint(checkpoint.run_url(shared, "run-0000000a"), 10, run="run-0000000a")
    point = resume.find(shared)
    assert point.run_id == "run-0000000a"
    assert point.checkpoint_url == f"{shared}/run-0000000a"
    _checkpoint(checkpoint.run_url(shared, "run-0000000b"), 20, run="run-0000000b")
    with pytest.raises(ValueError) as info:
        resume.find(shared)
    assert str(info.value) == (
        f"{shared} holds the checkpoints of 2 runs (run-0000000a, run-0000000b): name one, by "
        f"its id (e.g. 'run-0000000b') or its folder ('{shared}/run-0000000b')."
    )
    assert resume.find(f"{shared}/run-0000000b").run_id == "run-0000000b"


def test_a_run_id_without_a_record_is_found_under_the_checkpoint_url(tmp_path: Path) -> None:
    shared = str(tmp_path / "runs-shared")
    _checkpoint(checkpoint.run_url(shared, "run-0000000a"), 10, run="run-0000000a")
    _checkpoint(checkpoint.run_url(shared, "run-0000000b"), 20, run="run-0000000b")
    point = resume.find("run-0000000b", str(tmp_path / "runs"), checkpoint_url=shared)
    assert point.run_id == "run-0000000b" and point.checkpoint_url == f"{shared}/run-0000000b"
    assert point.settings["model"] == "resnet8"
    with pytest.raises(ValueError, match="no complete checkpoint"):
        resume.find("run-0000000c", str(tmp_path / "runs"), checkpoint_url=shared)


def test_a_resume_never_takes_another_runs_checkpoint(tmp_path: Path) -> None:
    shared = str(tmp_path / "runs-shared")
    # Run b's folder holds a checkpoint of run a (copied, or named by mistake).
    _checkpoint(checkpoint.run_url(shared, "run-0000000b"), 30, run="run-0000000a")
    for what in (f"{shared}/run-0000000b", "run-0000000b"):
        with pytest.raises(
            checkpoint.NotOwned, match="is run 'run-0000000a''s, not run 'run-0000000b''s"
        ):
            resume.find(what, str(tmp_path / "runs"), checkpoint_url=shared)
    # The run record names the run's folder; its newest checkpoint there is another run's.
    url = str(tmp_path / "ck")
    _checkpoint(url, 40, run="run-0000000c")
    started = {
        "kind": "train-started",
        "time": 1.0,
        "run": "run-1a2b3c4d",
        "checkpoint_url": url,
        "hparams": "{}",
    }
    _record(tmp_path / "runs" / "c-1" / "events.jsonl", [started])
    with pytest.raises(checkpoint.NotOwned, match="pass resume='run-0000000c'"):
        resume.find("run-1a2b3c4d", str(tmp_path / "runs"))


def test_resumed_settings_keep_the_runs_own_and_refuse_other_weights(tmp_path: Path) -> None:
    url = str(tmp_path / "ck")
    _checkpoint(url, 300)
    point = resume.find(url)
    model, data, shards, steps, hp = _resumed_settings(point, None, None, None, None, {"lr": 0.01})
    assert (model, data, shards, steps) == ("resnet8", "digits", 1, 900)
    assert hp == {"lr": 0.01}  # what was given wins; steps is not a hyperparameter here
    with pytest.raises(ValueError, match="model='resnet32' differs"):
        _resumed_settings(point, "resnet32", None, None, None, {})


def test_summaries_and_history_join_the_earlier_attempt(tmp_path: Path) -> None:
    vm = {
        "worker": "w-1",
        "role": "worker",
        "spot": True,
        "price": 3600.0,
        "price_on_demand": 7200.0,
    }
    earlier = [
        {"kind": "requested", "time": 0.0, **vm},
        {"kind": "running", "time": 0.0, **vm},
        {"kind": "train-started", "time": 0.0, "run": "run-1a2b3c4d", "batch_size": 10},
        {
            "kind": "metrics",
            "time": 100.0,
            "run": "run-1a2b3c4d",
            "step": 250,
            "loss": 1.0,
            "active_workers": 1,
            "staleness": 0,
            "img_per_s": 1.0,
            "lr": 0.1,
        },
    ]
    record = _record(tmp_path / "old" / "events.jsonl", earlier)
    later = [
        {"kind": "requested", "time": 1000.0, **vm},
        {"kind": "running", "time": 1000.0, **vm},
        {
            "kind": "train-started",
            "time": 1000.0,
            "run": "run-1a2b3c4d",
            "batch_size": 10,
            "resumed_from": record,
            "resumed_step": 200,
            "steps_lost": 50,
        },
        {
            "kind": "metrics",
            "time": 1100.0,
            "run": "run-1a2b3c4d",
            "step": 500,
            "loss": 0.5,
            "active_workers": 1,
            "staleness": 0,
            "img_per_s": 1.0,
            "lr": 0.1,
        },
        {
            "kind": "train-finished",
            "time": 1100.0,
            "run": "run-1a2b3c4d",
            "reason": "steps",
            "step": 500,
        },
    ]
    s = resume.summarize_run(later, minimum_s=0)
    assert s["attempts"] == 2 and s["steps"] == 500 and s["steps_lost"] == 50
    assert s["wall_s"] == pytest.approx(200.0)
    assert s["cost"] == pytest.approx(200.0)  # $3600/h for 100 s, twice
    assert s["cost_on_demand"] == pytest.approx(400.0)
    assert s["img_per_s"] == pytest.approx((250 + 300) * 10 / 200.0)
    h = resume.run_history(later, t0=1000.0, minimum_s=0)
    assert list(h["step"]) == [250, 500]
    assert list(h["time"]) == [pytest.approx(100.0), pytest.approx(200.0)]
    assert list(h["cost"]) == [pytest.approx(100.0), pytest.approx(200.0)]


def test_a_users_optimizer_must_come_with_its_resume() -> None:
    from transient_nb.training.resume import ResumePoint, check_optimizer

    adamw = ResumePoint("run-1", "memory://x", settings={"optimizer": "partial(AdamW, lr=0.01)"})
    sgd = ResumePoint("run-2", "memory://y", settings={"optimizer": "sgd"})
    old = ResumePoint("run-3", "memory://z", settings={})  # a record from before: no check
    check_optimizer(adamw, lambda p: None)
    check_optimizer(sgd, None)
    check_optimizer(old, lambda p: None)
    with pytest.raises(ValueError, match="pass the same optimizer= again"):
        check_optimizer(adamw, None)
    with pytest.raises(ValueError, match="drop optimizer= to resume it"):
        check_optimizer(sgd, lambda p: None)
