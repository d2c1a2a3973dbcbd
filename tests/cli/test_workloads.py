"""The CLI's own model and data: import paths on ``run`` (checked before any cluster exists), a
run's weights exported from its checkpoints, and ``estimate``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from transient_nb.cli.commands import main
from transient_nb.deploy import registry

DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.fixture
def tokmod(monkeypatch):
    monkeypatch.syspath_prepend(str(DATA))
    path = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", str(DATA) + (os.pathsep + path if path else ""))


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--model", "nosuchpkg.nets:make"], "module 'nosuchpkg.nets' cannot be imported"),
        (["--model", "tokmod:make_net", "--data", "tokmod:nothing"], "has no attribute 'nothing'"),
        (
            ["--model", "tokmod:make_net", "--data", "tokmod:make_data", "--loss", "mse"],
            r"the model returns shape (32, 3) but the targets have shape (32,): with loss='mse'",
        ),
        (["--loss", "huber"], "Unknown loss 'huber'"),
        (["--metrics", "auc"], "metric 'auc': unknown built-in 'auc'; use accuracy, mse"),
        (["--stop-at", "accuracy"], "--stop-at 'accuracy': write METRIC=VALUE"),
        (["--stop-at", "f1=0.9"], "stop_at names 'f1', which is not a metric of this run"),
        (
            [
                "--model",
                "tokmod:make_net",
                "--data",
                "tokmod:make_data",
                "--optimizer",
                "tokmod:optimizer",
                "--lr",
                "0.5",
            ],
            "lr=0.5 sets the paper's SGD, but optimizer= is your own",
        ),
    ],
)
def test_a_bad_model_or_data_is_refused_before_any_cluster_exists(
    argv, message, tmp_path, capsys, tokmod
):
    out = tmp_path / "out"
    assert main(["run", *argv, "--batch-size", "32", "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith("transient-nb: error: ")
    # No cluster was started: no run folder, no registry entry.
    assert not out.exists() and registry.entries() == []


def test_estimate_prints_the_table_and_its_basis(capsys):
    assert (
        main(
            ["estimate", "--model", "resnet32-t2t", "--workers", "p100=4", "--prices", "paper-2019"]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "1,857,722 parameters" in out and "serves at most 45.0 steps/s" in out
    assert "p100: 9.3 TFLOPS FP32 peak (catalog paper-2019) x 0.274 efficiency" in out
    assert (
        main(
            [
                "estimate",
                "--model",
                "resnet8",
                "--data",
                "digits",
                "--workers",
                "t4=2",
                "--measured",
                "t4=50",
                "--batch-size",
                "32",
            ]
        )
        == 0
    )
    assert "50 steps/s per worker, given" in capsys.readouterr().out
    assert main(["estimate", "--measured", "t4"]) == 2
    assert "--measured 't4': write TYPE=STEPS_PER_S" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_run_by_import_paths_then_export_its_weights(tmp_path, tokmod):
    """``transient-nb run`` with a model, data and optimizer named by import path trains on the
    workers (which import them too), and ``export`` writes what ``load_state_dict`` reads."""
    out = tmp_path / "out"
    env = {**os.environ}
    proc = subprocess.run(
        [
            sys.executable, "-m", "transient_nb.cli", "run",
            "--model", "tokmod:make_net", "--data", "tokmod:make_data",
            "--optimizer", "tokmod:optimizer", "--metrics", "accuracy,top=tokmod:top2",
            "--workers", "2", "--steps", "300", "--batch-size", "32", "--preemption", "none",
            "--provisioning-delay", "0s", "--out", str(out), "--quiet",
        ],
        capture_output=True, text=True, timeout=800, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "tokmod:make_net (16,579 parameters)" in proc.stdout
    assert "final test metrics" in proc.stdout and "top " in proc.stdout
    run_id = proc.stdout.split("transient-nb export ", 1)[1].split()[0]
    path = tmp_path / "w.pt"
    assert (
        main(["export", run_id, str(path), "--run-dir", str(out), "--model", "tokmod:make_net"])
        == 0
    )
    import tokmod

    net = tokmod.make_net()
    net.load_state_dict(torch.load(path))
    x, y = tokmod.make_data()[1].tensors
    with torch.no_grad():
        assert (net(x).argmax(1) == y).float().mean() > 0.6
