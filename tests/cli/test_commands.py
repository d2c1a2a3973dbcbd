from __future__ import annotations

import json
import subprocess
import sys

import pytest

from transient_nb.cli.commands import main


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
        (["run", "--steps", "0"], "--steps 0"),
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
    assert main(["down", "cli-det"]) == 0
    assert not psutil.pid_exists(head) or psutil.Process(head).status() == psutil.STATUS_ZOMBIE
    assert registry.entries() == []
    assert main(["status", "cli-det"]) == 2  # gone: a clear error, not a traceback
    assert "cli-det" in capsys.readouterr().err


def test_ps_hosts_reach_the_cluster_and_set_the_default_shards():
    from transient_nb.cli.commands import _cluster_kwargs, _parser, _train_kwargs

    args = _parser().parse_args(["run", "--ps-hosts", "2"])
    assert _cluster_kwargs(args)["ps_hosts"] == 2 and _train_kwargs(args)["shards"] == 2
    args = _parser().parse_args(["run", "--ps-hosts", "2", "--shards", "3"])
    assert _train_kwargs(args)["shards"] == 3
    args = _parser().parse_args(["run"])
    assert _cluster_kwargs(args)["ps_hosts"] is None and _train_kwargs(args)["shards"] == 1


def test_zero_ps_hosts_is_refused_before_anything_starts(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["run", "--ps-hosts", "0", "--out", str(out), "--quiet"]) == 2
    assert "ps_hosts=0 must be a whole number of at least 1" in capsys.readouterr().err
    assert list(out.glob("*/events.jsonl")) == []


def test_workers_take_a_mix_of_gpu_types_and_refuse_bad_ones(tmp_path, capsys):
    from transient_nb.cli.commands import _parser

    args = _parser().parse_args(["up", "--workers", "k80=2,p100=1,v100=1"])
    assert args.workers == {"k80": 2, "p100": 1, "v100": 1}
    assert _parser().parse_args(["up", "--workers", "3"]).workers == 3
    args = _parser().parse_args(["scale", "demo", "3", "--gpu", "v100"])
    assert (args.name, args.n, args.gpu, args.on_demand) == ("demo", 3, "v100", None)
    # --on-demand: a plain number stays a number; TYPE=N pairs parse as the mix does.
    assert _parser().parse_args(["scale", "demo", "3", "--on-demand", "1"]).on_demand == 1
    args = _parser().parse_args(["scale", "demo", "k80=2,v100=2", "--on-demand", "k80=1,V100=2"])
    assert args.on_demand == {"k80": 1, "v100": 2}
    assert _parser().parse_args(["scale", "demo", "3", "--on-demand", "v100=0"]).on_demand == {}
    for bad, words in [
        ("-1", "workers=-1 must be a whole number of at least 0"),
        ("one", "'one' is not a number"),
        ("v100=-1", "v100=-1 is not a number of workers"),
        ("v100=1,v100=2", "'v100' is given twice"),
    ]:
        with pytest.raises(SystemExit) as exit_:
            _parser().parse_args(["scale", "demo", "3", "--on-demand", bad])
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert "argument --on-demand" in err and words in err
    args = _parser().parse_args(["move-ps", "demo", "us-east1-c", "--reason", "closer"])
    assert (args.command, args.name, args.zone, args.reason) == (
        "move-ps",
        "demo",
        "us-east1-c",
        "closer",
    )
    for bad, words in [
        ("k80=-1", "k80=-1 is not a number of workers"),
        ("three", "'three' is not a number"),
        ("k80=2,k80=1", "'k80' is given twice"),
    ]:
        with pytest.raises(SystemExit):
            _parser().parse_args(["up", "--workers", bad])
        assert words in capsys.readouterr().err
    # A type the catalog has no price for: refused before anything starts.
    out = tmp_path / "o"
    assert main(["run", "--workers", "t4=1,h900=1", "--out", str(out), "--quiet"]) == 2
    assert "Unknown GPU type 'h900'" in capsys.readouterr().err
    assert list(out.glob("*/events.jsonl")) == []


@pytest.mark.slow
def test_a_detached_mixed_cluster_scales_by_type(tmp_path, capsys):
    import dask

    from tests.conftest import of_kind, wait_for_sync
    from transient_nb.deploy import registry
    from transient_nb.deploy.connect import connect

    argv = ["up", "--name", "cli-mix", "--workers", "k80=1,v100=1", "--prices", "paper-2019"]
    # A fallback zone in another region, for move-ps (the head takes this process's settings).
    with dask.config.set({"transient.replacement.fallback-zones": ["us-east1-c"]}):
        assert main([*argv, "--preemption", "none", "--provisioning-delay", "0s"]) == 0
    capsys.readouterr()
    cluster = connect("cli-mix", prefer_local=False)
    try:

        def joined() -> dict[str, int]:
            df = cluster.vms()
            df = df[(df["role"] == "worker") & (df["state"] == "joined")]
            return {str(g): int(n) for g, n in df.groupby("gpu").size().items()}

        wait_for_sync(lambda: joined() == {"k80": 1, "v100": 1}, timeout=90)
        # On-demand counts the head refuses: exit 2, the value named, nothing changed.
        for on_demand, words in [
            ("3", "scale(on_demand=3): 3 v100 on demand, but the mix keeps 2 v100"),
            ("h900=1", "1 h900 on demand, but the mix keeps 0 h900"),
        ]:
            assert main(["scale", "cli-mix", "2", "--gpu", "v100", "--on-demand", on_demand]) == 2
            assert words in capsys.readouterr().err
        assert cluster.mix == {"k80": 1, "v100": 1}
        # The new v100 worker runs on demand (the head's on_demand says 1 v100).
        assert main(["scale", "cli-mix", "2", "--gpu", "v100", "--on-demand", "1"]) == 0
        assert "scaling to 2 v100 workers, 1 on demand." in capsys.readouterr().out
        wait_for_sync(lambda: joined() == {"k80": 1, "v100": 2}, timeout=90)
        assert cluster.mix == {"k80": 1, "v100": 2}
        wait_for_sync(
            lambda: of_kind(cluster.monitor.events, "scale", on_demand={"v100": 1}), timeout=30
        )
        vms = cluster.vms()
        dear = vms[(vms["role"] == "worker") & (vms["state"] == "joined") & vms["spot"].eq(False)]
        assert list(dear["gpu"]) == ["v100"]
        # A plain number is ambiguous for a mixed cluster: the owner's answer says so.
        assert main(["scale", "cli-mix", "4"]) == 2
        assert "this cluster mixes k80=1,v100=2" in capsys.readouterr().err
        # A second PS host, asked of the head: refused past four, then it joins.
        assert main(["scale-ps", "cli-mix", "5"]) == 2
        assert "scale_ps(5): at most 4 PS hosts" in capsys.readouterr().err
        assert main(["scale-ps", "cli-mix", "0"]) == 2
        assert "hosts=0: give a whole number of PS hosts, 1 or more" in capsys.readouterr().err
        assert main(["scale-ps", "cli-mix", "2"]) == 0
        assert "Cluster cli-mix: keeping 2 PS host(s)" in capsys.readouterr().out
        wait_for_sync(
            lambda: "ps-1" in set(cluster.vms().query("state == 'joined'").index), timeout=90
        )
        # The PS hosts move to the fallback zone, asked of the head; a zone it may not use is
        # refused with the zones it may.
        assert main(["move-ps", "cli-mix", "europe-west4-a"]) == 2
        assert (
            "move_ps('europe-west4-a'): not a zone this cluster may use "
            "(us-central1-a, us-east1-c)" in capsys.readouterr().err
        )
        assert main(["move-ps", "cli-mix", "us-east1-c", "--reason", "cli"]) == 0
        assert "Cluster cli-mix: moving the PS to us-east1-c." in capsys.readouterr().out
        wait_for_sync(
            lambda: of_kind(cluster.monitor.events, "ps-move", zone="us-east1-c", reason="cli"),
            timeout=30,
        )

        def ps_zones() -> list[str]:
            vms = cluster.vms()
            return sorted(vms[(vms["role"] == "ps") & (vms["state"] == "joined")]["zone"])

        # Both PS hosts anew in us-east1-c, the old ones given back (no run to move first).
        wait_for_sync(lambda: ps_zones() == ["us-east1-c", "us-east1-c"], timeout=120)
        assert main(["status", "cli-mix"]) == 0
        status = capsys.readouterr().out
        assert "per type" in status and "k80 1 VMs" in status and "v100 2 VMs" in status
    finally:
        cluster.close()
        assert main(["down", "cli-mix"]) == 0
    assert registry.entries() == []


def test_the_summary_shows_each_gpu_types_steps(capsys):
    from transient_nb.cli.commands import _print_summary
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


@pytest.mark.slow
def test_spot_only_keeps_the_policy_from_on_demand_workers():
    from transient_nb.cli.commands import _parser, _policy_kwargs

    for argv, on_demand in (
        (["adapt", "c", "deadline:1h", "--spot-only"], {"on_demand": False}),
        (["adapt", "c", "deadline:1h"], {}),
        (["run", "--adapt", "cost-per-step", "--spot-only"], {"on_demand": False}),
    ):
        args = _parser().parse_args(argv)
        goal, kwargs = _policy_kwargs(args, args.goal if argv[0] == "adapt" else args.adapt)
        assert goal in ("deadline", "cost-per-step")
        assert {k: v for k, v in kwargs.items() if k == "on_demand"} == on_demand
    # A history file from the adapt and run commands (default: the configuration's).
    for argv in (["adapt", "c", "deadline:1h", "--history", "h.json"],
                 ["run", "--adapt", "cost-per-step", "--history", "h.json"]):  # fmt: skip
        args = _parser().parse_args(argv)
        _, kwargs = _policy_kwargs(args, args.goal if argv[0] == "adapt" else args.adapt)
        assert kwargs["history"] == "h.json"
    _, kwargs = _policy_kwargs(_parser().parse_args(["adapt", "c", "off", "--history", "h"]), "off")
    assert "history" not in kwargs


def test_adapt_starts_and_stops_the_policy_of_a_detached_cluster(capsys):
    from transient_nb import connect

    argv = ["--name", "cli-adapt", "--workers", "1", "--preemption", "none"]
    assert main(["up", *argv, "--provisioning-delay", "0s"]) == 0
    try:
        assert main(["adapt", "cli-adapt", "deadline:10m", "--gpus", "t4,v100"]) == 0
        assert "Cluster cli-adapt: policy on, goal deadline:10m." in capsys.readouterr().out
        assert main(["adapt", "cli-adapt", "soon"]) == 2  # refused here, nothing sent
        assert main(["adapt", "cli-adapt", "off"]) == 0
        assert "policy off" in capsys.readouterr().out
        cluster = connect("cli-adapt")
        try:
            answers = [
                e
                for e in cluster.monitor.events
                if e["kind"] == "control" and e.get("action") == "adapt"
            ]
        finally:
            cluster.close()
        assert [a["ok"] for a in answers] == [True, True]  # the head ran both
    finally:
        assert main(["down", "cli-adapt"]) == 0


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


def test_attach_to_a_failed_run_says_why_and_exits_non_zero(capsys, monkeypatch):
    from types import SimpleNamespace

    from transient_nb.cli import commands as cli

    failed = {"kind": "train-finished", "reason": "error", "error": "eval_images=0:\nno images"}
    job = SimpleNamespace(
        id="run-0dead",
        done=True,
        step=3,
        accuracy=None,
        status={},
        started_event={"steps": 50},
        finished_event=failed,
        reason=failed["reason"],
        error=failed["error"],
    )
    closed = []
    cluster = SimpleNamespace(name="c", run=job, close=lambda: closed.append(True))
    monkeypatch.setattr(cli, "_connect", lambda name: cluster)
    assert main(["attach", "c", "--quiet"]) == 1
    out, err = capsys.readouterr()
    assert "transient-nb: run run-0dead failed (error): eval_images=0: no images" in err
    assert "Summary" not in out and closed == [True]


def test_the_progress_bar_shows_the_runs_eta_not_tqdms(capsys):
    """The bar's ETA is RunProgress.eta_s (the panels' ETA, from the run's pace in its events):
    700 steps left at 20 steps/s is 35 s, whatever tqdm would have estimated."""
    from types import SimpleNamespace

    from transient_nb.cli.commands import _progress

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
