"""Tests for transient_nb.preemption: lifetime models, trace files, delays."""

from __future__ import annotations

import random
import statistics
from pathlib import Path

import pytest

from transient_nb.preemption import (
    HOUR,
    PAPER_LIFETIME_CDF,
    EmpiricalLifetimes,
    Exponential,
    NoPreemption,
    Trace,
    TraceEntry,
    parse_delay,
    parse_preemption,
    parse_trace,
    validate_delay,
)


@pytest.mark.parametrize(
    "gpu, checkpoints",
    [
        ("k80", {2: 0.141, 6: 0.195, 23: 0.344}),
        ("v100", {1: 0.273, 6: 0.318, 23: 0.348}),
    ],
)
def test_paper_sampler_reproduces_the_table(gpu: str, checkpoints: dict[int, float]) -> None:
    model = parse_preemption(f"paper:{gpu}")
    assert isinstance(model, EmpiricalLifetimes)
    rng = random.Random(2019)
    n = 20_000
    draws = [model.lifetime(rng) for _ in range(n)]
    assert all(d is None or 0 <= d <= 24 * HOUR for d in draws)
    for hours, fraction in checkpoints.items():
        below = sum(1 for d in draws if d is not None and d < hours * HOUR) / n
        assert below == pytest.approx(fraction, abs=0.02), (gpu, hours)
    # Every preemptible VM is gone by 24 h: about 65% of K80s live the whole day.
    assert sum(1 for d in draws if d is not None and d <= 24 * HOUR) / n > 0.99


def test_paper_models_cover_every_table() -> None:
    for gpu, points in PAPER_LIFETIME_CDF.items():
        model = parse_preemption(f"paper:{gpu}")
        assert model.spec == f"paper:{gpu}"
        assert list(model.fractions) == sorted(model.fractions)
        assert model.fractions[-1] == 1.0 and model.hours == tuple(p[0] for p in points)


def test_exponential() -> None:
    model = parse_preemption("exp:mean=4s")
    assert isinstance(model, Exponential) and model.mean_s == 4.0
    assert parse_preemption("exp:mean=2 minutes").mean_s == 120.0
    rng = random.Random(1)
    draws = [model.lifetime(rng) for _ in range(20_000)]
    assert statistics.fmean(draws) == pytest.approx(4.0, rel=0.05)


def test_none() -> None:
    for spec in (None, "", "none"):
        model = parse_preemption(spec)
        assert isinstance(model, NoPreemption)
        assert model.lifetime(random.Random(0)) is None


@pytest.mark.parametrize(
    "spec, match",
    [
        ("paper:h100", "Unknown paper lifetime model 'paper:h100'.*paper:k80"),
        ("exp:mean=-3s", "Bad exponential preemption spec 'exp:mean=-3s'"),
        ("exp:mean=soon", "Bad exponential preemption spec 'exp:mean=soon'"),
        ("exp:rate=3", "Bad exponential preemption spec 'exp:rate=3'"),
        ("exp:mean=0", "Bad exponential preemption spec"),
        ("poisson:3", "Unknown preemption spec 'poisson:3'"),
        ("trace:", "needs a file"),
        (42, "must be a string"),
    ],
)
def test_bad_specs(spec: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_preemption(spec)  # type: ignore[arg-type]


def test_trace_file(tmp_path: Path) -> None:
    path = tmp_path / "trace.txt"
    path.write_text(
        "# time, target, mode\n"
        "\n"
        "1s,w-1\n"
        "0.5s,slot:0,kill   # kill without notice\n"
        "90, slot:2 , notice\n"
    )
    model = parse_preemption(f"trace:{path}")
    assert isinstance(model, Trace)
    assert model.spec == f"trace:{path}"
    assert model.entries == (
        TraceEntry(0.5, "slot:0", notice=False),
        TraceEntry(1.0, "w-1", notice=True),
        TraceEntry(90.0, "slot:2", notice=True),
    )
    assert model.lifetime(random.Random(0)) is None


@pytest.mark.parametrize(
    "bad, why",
    [
        ("1s", "expected 2 or 3"),
        ("soon,w-1", "soon"),
        ("-5,w-1", "'-5,w-1'"),
        ("1s,slot:x", "slot:N"),
        ("1s,", "empty target"),
        ("1s,w-1,politely", "notice' or 'kill"),
        ("1,w-1,kill,now", "expected 2 or 3"),
    ],
)
def test_malformed_trace_names_the_line(tmp_path: Path, bad: str, why: str) -> None:
    path = tmp_path / "trace.txt"
    path.write_text(f"# header\n1s,w-0\n\n{bad}\n2s,w-2\n")
    with pytest.raises(ValueError, match=r"Malformed line 4 in preemption trace") as info:
        parse_trace(str(path))
    assert why in str(info.value)
    assert str(path) in str(info.value)


def test_missing_trace_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        parse_preemption(f"trace:{tmp_path / 'nope.txt'}")


def test_delays() -> None:
    rng = random.Random(0)
    spot = [parse_delay("paper", spot=True, rng=rng) for _ in range(200)]
    assert all(81 <= d <= 98 for d in spot)
    on_demand = [parse_delay("paper", spot=False, rng=rng) for _ in range(200)]
    assert all(69 <= d <= 82 for d in on_demand)
    assert parse_delay("90s", spot=True, rng=rng) == 90.0
    assert parse_delay(0, spot=True, rng=rng) == 0.0
    assert validate_delay("paper") == "paper"
    assert validate_delay("1 minute") == 60.0
    for bad in ("-1s", "later", None):
        with pytest.raises(ValueError, match="Bad provisioning delay"):
            validate_delay(bad)
