"""The GPU suite still runs on the CPU: ``benchmarks/gpu_suite.sh --tiny``, once for the module,
and the tables of the three scripts it runs (a file of their own: pyproject's ``--dist loadfile``
keeps the module's fixture, the suite's one run, on one worker while the other benchmarks run
on others).
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

import pytest

from tests.conftest import BENCHMARKS, benchmark
from tests.test_benchmarks import assert_positive, first_table
from tests.warm import WarmPython

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def gpu_suite(tmp_path_factory: pytest.TempPathFactory, warm_python: WarmPython) -> dict[str, Any]:
    """The GPU suite's --tiny form, run once for the module: its steps run the data plane's
    benchmarks (``ps_throughput.py`` on both paths, ``dataplane_candidates.py``) in their tiny
    configuration, so their own tests read its tables rather than run them a second time. Its
    ``$PYTHON`` runs each step warm (:mod:`tests.warm`)."""
    out = tmp_path_factory.mktemp("gpu-suite")
    proc = subprocess.run(
        ["bash", str(BENCHMARKS / "gpu_suite.sh"), str(out), "--tiny"],
        capture_output=True,
        text=True,
        timeout=840,
        env={**os.environ, "PYTHON": warm_python.shim(tmp_path_factory.mktemp("bin"))},
    )
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    steps: dict[str, Any] = json.loads((out / "suite.json").read_text())["steps"]
    for name, step in steps.items():
        step["header"], _ = first_table((out / f"{name}.md").read_text(), name)
    return steps


@pytest.mark.timeout(900)
def test_ps_throughput(gpu_suite: dict[str, Any]) -> None:
    """``ps_throughput.py --tiny`` (the suite's ``dataplane`` step) and its cross-host path (ours
    only there: the torch.rpc peer does not depend on our path, and the tiny suite measures it
    once)."""
    ours = ["dask steps/s", "dask ms/step", "dask MB/s", "dask PS cpu ms/step", "dask/45"]
    peer = ["rpc steps/s", "rpc MB/s", "rpc PS cpu ms/step", "dask/rpc"]
    for name, path, with_peer in (
        ("dataplane", "default (unix)", True),
        ("dataplane-cross-host", "cross-host (tls)", False),
    ):
        step = gpu_suite[name]
        assert step["header"] == benchmark("ps_throughput").COLUMNS
        rows = step["rows"]
        assert [(r["model"], r["shards"], r["wire"], r["trainers"]) for r in rows] == [
            ("resnet32", "1", "float32", "1"),
            ("resnet32", "2", "float16", "1"),
        ]
        assert_positive(rows, *ours, *(peer if with_peer else ()))
        if not with_peer:
            assert all(r[c] == "n/a" for r in rows for c in peer), rows
        assert any(f"data-plane path {path}" in note for note in step["notes"])


@pytest.mark.timeout(900)
def test_dataplane_candidates(gpu_suite: dict[str, Any]) -> None:
    """``dataplane_candidates.py --tiny`` (the suite's ``carriers`` step)."""
    header = gpu_suite["carriers"]["header"]
    assert header == [
        "carrier",
        "round trips/s",
        "server CPU ms",
        "client CPU ms",
        "server / update",
    ]
    rows = gpu_suite["carriers"]["rows"]
    assert [r["carrier"] for r in rows] == ["unix", "tls"]
    assert_positive(rows, *header[1:])


@pytest.mark.timeout(900)
def test_gpu_suite_runs_on_cpu(gpu_suite: dict[str, Any]) -> None:
    """The GPU suite's --tiny form: pipelined worker efficiency, scaling, the device check and the
    data plane (both paths against the peer, and its carriers), with every table in
    suite.json."""
    suite = gpu_suite
    assert set(suite) == {
        "efficiency-pipelined",
        "scaling",
        "devices",
        "dataplane",
        "dataplane-cross-host",
        "carriers",
    }
    assert all(step["exit"] == 0 for step in suite.values())
    (eff,) = suite["efficiency-pipelined"]["rows"]
    assert eff["pipeline"] == "on"
    assert_positive([eff], "plain steps/s", "ps steps/s", "efficiency")
    scaling = suite["scaling"]["rows"]
    assert [(r["device"], r["N"]) for r in scaling] == [("cpu", "1"), ("cpu", "2")]
    assert_positive(scaling, "plain img/s", "ps img/s", "ps/plain")
    devices = suite["devices"]["rows"]
    assert [(r["worker"], r["device"]) for r in devices] == [("w-0", "cpu"), ("w-1", "cpu")]
    assert any("check: cpu run" in note for note in suite["devices"]["notes"])
    assert "data plane of the trainers: unix" in suite["devices"]["notes"]
