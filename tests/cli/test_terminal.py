"""Tests for transient_nb.cli.terminal: a run's progress bar and summary in the terminal."""

from __future__ import annotations


def test_the_summary_shows_each_gpu_types_steps(capsys):
    from transient_nb.cli.terminal import _print_summary
    from transient_nb.eventlog.folds import summarize

    s = summarize([])
    s["by_gpu"] = {
        "k80": {"workers": 2, "steps": 180, "steps_per_s": 9.0},
        "v100": {"workers": 1, "steps": 300, "steps_per_s": 15.0},
    }
    _print_summary(s)
    out = capsys.readouterr().out
    assert "steps per GPU type" in out
    assert "k80 180 (2 workers, 9.00/s), v100 300 (1 workers, 15.00/s)" in out


def test_the_progress_bar_shows_the_runs_eta_not_tqdms(capsys):
    """The bar's ETA is RunProgress.eta_s (the panels' ETA, from the run's pace in its events):
    700 steps left at 20 steps/s is 35 s, whatever tqdm would have estimated."""
    from types import SimpleNamespace

    from transient_nb.cli.terminal import _progress

    t0 = 1_000.0
    events = [
        {"kind": "train-started", "time": t0, "run": "r", "steps": 1000, "model": "m"},
        {"kind": "metrics", "time": t0 + 10, "run": "r", "step": 100, "img_per_s": 50.0},
        {"kind": "metrics", "time": t0 + 20, "run": "r", "step": 300, "img_per_s": 70.0},
    ]

    class Job:
        id, step, accuracy, status = "r", 300, 0.5, {"active": ["w-0", "w-1"]}
        cluster = SimpleNamespace(monitor=SimpleNamespace(events=events))
        looks = 0

        @property
        def done(self):  # running for one look, then finished
            self.looks += 1
            return self.looks > 1

    _progress(Job(), 1000, quiet=False)
    err = capsys.readouterr().err
    assert "300/1000" in err and "acc 50.0%, 2 active workers, ETA 35 s" in err
    assert "<" not in err  # no "elapsed<remaining" of tqdm's own
