"""The benchmark scripts still run: each one's ``--tiny`` configuration, as a subprocess.

Only that they run and print the table they promise, with positive numbers; the figures
themselves are recorded in ``benchmarks/NOTES.md`` and are never asserted here.
"""

from __future__ import annotations

import os

import pytest

from tests.conftest import BENCHMARKS, benchmark
from tests.warm import WarmPython

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def tiny(warm: WarmPython, script: str, timeout: float = 240) -> str:
    """Run ``benchmarks/SCRIPT --tiny`` (warm: :mod:`tests.warm`); what it printed on stdout (it
    must exit 0)."""
    proc = warm.run(
        [str(BENCHMARKS / script), "--tiny"],
        env=os.environ,
        cwd=os.getcwd(),
        timeout=timeout,
        merged=False,
    )
    assert proc.returncode == 0, f"{script} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def first_table(out: str, script: str) -> tuple[list[str], list[dict[str, str]]]:
    """The header and rows of the first markdown table in ``out``."""
    lines = [ln.strip() for ln in out.splitlines() if ln.strip().startswith("|")]
    assert len(lines) >= 3, f"no table in the output of {script}:\n{out}"
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert set(lines[1].replace("|", "")) == {"-"}, lines[1]
    rows = [
        dict(zip(header, (c.strip() for c in ln.strip("|").split("|")), strict=True))
        for ln in lines[2:]
    ]
    return header, rows


def run_tiny(warm: WarmPython, script: str) -> tuple[list[str], list[dict[str, str]]]:
    """Run ``benchmarks/SCRIPT --tiny``; the header and rows of the table it prints."""
    return first_table(tiny(warm, script), script)


def assert_positive(rows: list[dict[str, str]], *columns: str) -> None:
    for row in rows:
        for c in columns:
            assert float(row[c]) > 0, f"{c} = {row[c]!r} in {row}"


def test_dataplane_tls(warm_python: WarmPython) -> None:
    """``dataplane_tls.py --tiny``: the cross-host wire alone, TLS records and the sealed stream."""
    header, rows = run_tiny(warm_python, "dataplane_tls.py")
    assert header == [
        "stream",
        "round trips/s",
        "PS CPU ms/round trip",
        "trainer CPU ms/round trip",
    ]
    assert [r["stream"] for r in rows] == ["tls", "sealed"]
    assert_positive(rows, *header[1:])


def test_idle_vm(warm_python: WarmPython) -> None:
    """``idle_vm.py --tiny``: an idle cluster's VMs with Dask's settings and with
    ``transient.cluster-dask``'s, one row each."""
    header, rows = run_tiny(warm_python, "idle_vm.py")
    assert header == ["settings", "VMs", "% of a core per VM", "range", "owner %"]
    assert [(r["settings"], r["VMs"]) for r in rows] == [
        ("dask defaults", "2"),
        ("transient.cluster-dask", "2"),
    ]
    assert_positive(rows, "% of a core per VM", "owner %")


def test_worker_efficiency(warm_python: WarmPython) -> None:
    header, rows = run_tiny(warm_python, "worker_efficiency.py")
    assert header[:5] == ["device", "model", "batch", "threads", "pipeline"]
    assert len(rows) == 1 and rows[0]["device"] == "cpu" and rows[0]["pipeline"] == "off"
    assert_positive(rows, "plain steps/s", "ps steps/s", "efficiency")


def test_a_plain_loop_takes_its_steps_past_the_warm_up_however_long_they_take(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A loop stops on time *and* on steps: a loaded host makes it longer, never a span with too
    few steps for a rate (the "n/a" that failed test_gpu_suite_runs_on_cpu under load)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import _common

    times = _common.plain_loop(
        "resnet8", "synthetic:64", 4, "cpu", 1, warmup=0.2, seconds=0.0, min_steps=6
    )
    assert sum(t >= times[0] + 0.2 for t in times) >= 6
    assert times == sorted(times)


def test_recovery(warm_python: WarmPython) -> None:
    header, rows = run_tiny(warm_python, "recovery.py")
    assert header == benchmark("recovery").COLUMNS
    assert [r["scenario"] for r in rows] == ["worker, notice", "worker, no notice", "ps"]
    assert_positive(
        rows, "repeats", "stop s", "replacement up s", "first update s", "framework share s"
    )
    assert_positive(rows[:1], "drain s")


def test_ps_micro(warm_python: WarmPython) -> None:
    header, rows = run_tiny(warm_python, "ps_micro.py")
    assert header == ["model", "operation", "wire / data", "cpu ms"]
    ops = {r["operation"] for r in rows}
    assert {
        "push_pull (current)",
        "push_pull (legacy)",
        "numpy f32->f16",
        "torch f32->f16",
    } <= ops
    assert_positive(rows, "cpu ms")


def test_pipeline_accuracy(warm_python: WarmPython) -> None:
    header, rows = run_tiny(warm_python, "pipeline_accuracy.py")
    assert header == ["data", "pipeline", "steps", "accuracy", "accuracy range", "wall s"]
    assert [(r["data"], r["pipeline"]) for r in rows] == [("digits", "off"), ("digits", "on")]
    assert_positive(rows, "steps", "accuracy", "wall s")


def test_estimate_cpu(warm_python: WarmPython) -> None:
    out = tiny(warm_python, "estimate_cpu.py")
    measured, calibration = out.split("\n\n", 1)  # two tables
    header, rows = first_table(measured, "estimate_cpu.py")
    assert header[:3] == ["model", "GFLOP/sample", "operators"]
    assert [r["model"] for r in rows] == ["resnet32", "vgg-3"]
    assert_positive(rows, "measured ms", "predicted ms", "GFLOP/s")
    _, paper = first_table(calibration, "estimate_cpu.py")
    assert [(r["gpu"], r["worker steps/s"]) for r in paper if r["workers"] == "1"] == [
        ("k80", "4.56"),
        ("p100", "12.2"),
        ("v100", "15.6"),
    ]


def test_reference_identity(warm_python: WarmPython) -> None:
    header, rows = run_tiny(warm_python, "reference_identity.py")
    assert header == ["model", "data", "steps", "sha256 of w, v, bn"]
    assert [len(r["sha256 of w, v, bn"]) for r in rows] == [16, 16]
