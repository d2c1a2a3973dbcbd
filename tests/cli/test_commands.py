from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest

from transient_nb.cli.commands import main


class _Records(logging.Handler):
    """The records a logger handles (after its level and filters)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.mark.slow
def test_run_writes_summary_record_and_inline_report(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "transient_nb.cli",
            "run",
            "--workers",
            "2",
            "--steps",
            "60",
            "--data",
            "digits",
            "--preemption",
            "none",
            "--provisioning-delay",
            "0s",
            "--batch-size",
            "32",
            "--out",
            str(out),
            "--json",
            str(tmp_path / "s.json"),
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "s.json").read_text())
    for key in (
        "steps",
        "wall_s",
        "accuracy",
        "preemptions",
        "replacements",
        "cost",
        "cost_on_demand",
    ):
        assert key in summary
    assert summary["steps"] >= 60 and summary["cost"] > 0
    assert summary["cost_on_demand"] > summary["cost"]
    assert "final test accuracy" in proc.stdout and "speedup over one worker" in proc.stdout
    report = (out / "report.html").read_text()
    assert "Bokeh" in report and "cdn.bokeh.org" not in report  # BokehJS inline: works offline
    records = list(out.glob("*/events.jsonl"))
    assert len(records) == 1 and '"train-finished"' in records[0].read_text()


@pytest.mark.parametrize(
    "argv, word",
    [
        (["run", "--model", "resnet9000"], "resnet9000"),
        (["run", "--data", "cifar10:/nonexistent/cifar"], "/nonexistent/cifar"),
        (["run", "--steps", "0"], "argument --steps: '0' is not a whole number of steps"),
        (["run", "--gpu", "h900"], "h900"),
        (["run", "--preemption", "weibull"], "weibull"),
    ],
)
def test_bad_input_is_reported_before_anything_starts(argv, word, capsys, tmp_path):
    assert main([*argv, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert word in err and "error" in err


def test_run_refuses_worker_counts_and_hourly_costs_above_the_limits(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["run", "--workers", "1000", "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "1000 workers is above max_workers=64" in err
    assert main(["run", "--workers", "3", "--max-workers", "2", "--out", str(out)]) == 2
    assert "3 workers is above max_workers=2" in capsys.readouterr().err
    assert main(["run", "--workers", "4", "--max-hourly-cost", "0.5", "--out", str(out)]) == 2
    assert "above max_hourly_cost=$0.50/h" in capsys.readouterr().err
    assert not (out / "events.jsonl").exists() and list(out.glob("*/events.jsonl")) == []


@pytest.mark.slow
def test_detached_run_status_attach_and_down(tmp_path, capsys):
    import psutil

    from transient_nb.deploy import registry

    argv = ["--name", "cli-det", "--workers", "1", "--preemption", "none"]
    argv += ["--provisioning-delay", "0s"]
    assert (
        main(
            ["run", "--detach", *argv, "--data", "digits", "--steps", "150", "--eval-images", "100"]
        )
        == 0
    )
    started = capsys.readouterr().out
    assert "transient-nb attach cli-det" in started
    head = int(registry.lookup("cli-det")["pid"])
    # attach follows the run the head drives to its end, then prints its summary.
    assert main(["attach", "cli-det", "--quiet"]) == 0
    attached = capsys.readouterr().out
    import re

    steps = int(re.search(r"global steps\s+(\d+)", attached).group(1))
    assert steps >= 150
    assert main(["status", "cli-det"]) == 0
    status = capsys.readouterr().out
    assert f"head pid {head}" in status and f"step {steps}/150" in status and ", steps" in status
    # The head ends the client's stream before its scheduler goes: the client never tries to
    # reconnect to it (a reconnect that raced the closing listener failed `down` in CI), and
    # nothing is logged as an error.
    client_log = logging.getLogger("distributed.client")
    seen, level = _Records(), client_log.level
    client_log.addHandler(seen)
    client_log.setLevel(logging.INFO)  # distributed's default for it is WARNING
    try:
        assert main(["down", "cli-det"]) == 0
    finally:
        client_log.removeHandler(seen)
        client_log.setLevel(level)
    said = [r.getMessage() for r in seen.records]
    assert not [m for m in said if "Reconnecting" in m or "report stream closed" in m], said
    assert [r for r in seen.records if r.levelno >= logging.ERROR] == []
    assert not psutil.pid_exists(head) or psutil.Process(head).status() == psutil.STATUS_ZOMBIE
    assert registry.entries() == []
    assert main(["status", "cli-det"]) == 2  # gone: a clear error, not a traceback
    assert "cli-det" in capsys.readouterr().err


def test_zero_ps_hosts_is_refused_before_anything_starts(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["run", "--ps-hosts", "0", "--out", str(out), "--quiet"]) == 2
    assert "'0' is not a whole number of PS hosts of at least 1" in capsys.readouterr().err
    assert list(out.glob("*/events.jsonl")) == []


@pytest.mark.parametrize(
    "goal, word",
    [
        ("fastest", "goal 'fastest': write deadline:DURATION"),
        ("deadline:soon", "not 'soon'"),
        ("budget:-3", "needs budget= a positive number of dollars, not -3.0"),
    ],
)
def test_a_bad_policy_goal_is_refused_before_anything_starts(goal, word, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["run", "--adapt", goal, "--out", str(out), "--quiet"]) == 2
    assert word in capsys.readouterr().err
    assert list(out.glob("*/events.jsonl")) == [] and registry_entries() == []


def registry_entries():
    from transient_nb.deploy import registry

    return registry.entries()


def test_a_failed_run_is_one_clear_line_and_a_non_zero_exit(tmp_path, capsys, monkeypatch):
    """A run that fails once started (here every trainer kept failing) ends the command with
    what failed and why, in one line, and exit status 1: no traceback."""
    from types import SimpleNamespace

    from transient_nb.deploy import cluster as cluster_module
    from transient_nb.training import run as run_module

    record = str(tmp_path / "out" / "events.jsonl")

    class StandInCluster:
        name = "stand-in"
        run_record = record
        backend = SimpleNamespace(describe=lambda: "a stand-in cluster")

        def __init__(self, **kwargs):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def wait_for_workers(self, *args, **kwargs):
            pass

    error = RuntimeError(
        "Every trainer kept failing (1 worker(s), 3 restarts each):\n"
        "  OutOfMemoryError: CUDA out of memory <tried 2 GiB>"
    )

    class FailedRun:  # what TrainingRun holds and raises after such a run
        id, reason, step, accuracy, status, done = "run-0dead", "trainer-failed", 7, None, {}, True
        hp = SimpleNamespace(steps=50)

        def __init__(self):
            self.error = error

        def wait(self, timeout=None):
            raise RuntimeError(f"Training run {self.id} failed: {self.error}") from self.error

    monkeypatch.setattr(cluster_module, "TransientCluster", StandInCluster)
    monkeypatch.setattr(run_module, "train", lambda cluster, **kwargs: FailedRun())
    argv = ["run", "--workers", "1", "--steps", "50", "--data", "digits", "--quiet"]
    assert main([*argv, "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    (line,) = [x for x in err.splitlines() if x.startswith("transient-nb:")]
    assert line == (
        "transient-nb: run run-0dead failed (trainer-failed): Every trainer kept failing "
        "(1 worker(s), 3 restarts each): OutOfMemoryError: CUDA out of memory <tried 2 GiB>"
    )
    assert f"Run record: {record}" in err
