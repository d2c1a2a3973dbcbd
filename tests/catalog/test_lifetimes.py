"""Tests for transient_nb.catalog.lifetimes: lifetime models, trace files, delays."""

from __future__ import annotations

import math
import random
import re
import statistics
from pathlib import Path

import pytest

from transient_nb.catalog.lifetimes import (
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
    for bad in ("-1s", "later", None, "", "1e400"):
        with pytest.raises(ValueError, match="Bad provisioning delay"):
            validate_delay(bad)


# -- edges found by mutation testing (benchmarks/mutation.py) ------------------------------------
class FixedDraw(random.Random):
    """A random source whose ``random()`` returns the given values in turn."""

    def __init__(self, *values: float) -> None:
        super().__init__(0)
        self.values = list(values)

    def random(self) -> float:
        return self.values.pop(0)


def test_empirical_sampler_interpolates_inside_a_segment() -> None:
    model = parse_preemption("paper:k80")
    assert isinstance(model, EmpiricalLifetimes)
    # k80: 7.8% revoked by 1 h, 14.1% by 2 h: the middle of that stretch is 1.5 h.
    mid = (0.078 + 0.141) / 2
    assert model.lifetime(FixedDraw(mid)) == pytest.approx(1.5 * HOUR)
    # A quarter of the way through the first hour.
    assert model.lifetime(FixedDraw(0.078 / 4)) == pytest.approx(0.25 * HOUR)
    # The last stretch: every VM still there at 23 h is gone at 24 h.
    assert model.lifetime(FixedDraw(0.344 + (1 - 0.344) / 2)) == pytest.approx(23.5 * HOUR)


def test_empirical_sampler_edges() -> None:
    # random() may return exactly 0: the first point of the CDF, not a division by zero.
    model = EmpiricalLifetimes("custom", hours=(0.5, 1.0, 2.0), fractions=(0.0, 0.5, 0.8))
    assert model.lifetime(FixedDraw(0.0)) == pytest.approx(0.5 * HOUR)
    assert model.lifetime(FixedDraw(0.25)) == pytest.approx(0.75 * HOUR)
    # A CDF that stops short of 1: the rest are never preempted.
    assert model.lifetime(FixedDraw(0.9)) is None
    assert model.lifetime(FixedDraw(0.8)) == pytest.approx(2.0 * HOUR)


def test_exponential_spec_forms() -> None:
    for spec, mean in (
        ("exp:mean=90", 90.0),
        ("exp:mean=0.5s", 0.5),
        ("exp:mean=1.5 minutes", 90.0),
    ):
        model = parse_preemption(spec)
        assert isinstance(model, Exponential) and model.mean_s == mean, spec
        assert model.spec == spec
    for bad in ("exp:mean=", "exp:mean", "exp:mean=5 lightyears"):
        with pytest.raises(
            ValueError,
            match=re.escape(
                "write 'exp:mean=DURATION' with a positive duration, e.g. 'exp:mean=60s'"
            ),
        ):
            parse_preemption(bad)


def test_error_messages_name_every_valid_form() -> None:
    forms = (
        "'none', 'paper', 'paper:k80|p100|v100|cpu', 'exp:mean=60s', 'trace:PATH' or "
        "'zones:ZONE=SPEC;*=SPEC'"
    )
    with pytest.raises(ValueError) as info:
        parse_preemption("poisson:3")
    assert str(info.value) == f"Unknown preemption spec 'poisson:3': use {forms}."
    with pytest.raises(ValueError) as info:
        parse_preemption(42)  # type: ignore[arg-type]
    assert str(info.value) == f"Preemption spec 42 must be a string: {forms}."
    with pytest.raises(ValueError) as info:
        parse_preemption("paper:t4")
    assert str(info.value) == (
        "Unknown paper lifetime model 'paper:t4': use one of "
        "paper:k80, paper:p100, paper:v100, paper:cpu."
    )


def test_trace_path_may_hold_colons_and_comments_may_hold_hashes(tmp_path: Path) -> None:
    folder = tmp_path / "run:1"
    folder.mkdir()
    path = folder / "trace.txt"
    path.write_text("0,w-1   # at the start # of the run\n1e3,slot:1,kill\n")
    model = parse_preemption(f"trace:{path}")
    assert isinstance(model, Trace)
    assert model.entries == (TraceEntry(0.0, "w-1", True), TraceEntry(1000.0, "slot:1", False))


def test_trace_rejects_infinite_times_by_name(tmp_path: Path) -> None:
    path = tmp_path / "trace.txt"
    path.write_text("1e400,w-1\n")
    with pytest.raises(ValueError) as info:
        parse_trace(str(path))
    assert "(time '1e400' is not a non-negative duration)" in str(info.value)
    assert str(info.value).endswith(
        "Each line must read TIME,TARGET[,notice|kill], e.g. '90s,w-1' or '120,slot:0,kill'."
    )


@pytest.mark.parametrize(
    "bad, why",
    [("1s", "(expected 2 or 3 comma-separated fields)"), ("1s,", "(empty target)")],
)
def test_trace_errors_say_why(tmp_path: Path, bad: str, why: str) -> None:
    path = tmp_path / "trace.txt"
    path.write_text(bad + "\n")
    with pytest.raises(ValueError) as info:
        parse_trace(str(path))
    assert f"Malformed line 1 in preemption trace {str(path)!r}: {bad!r} {why}." in str(info.value)


def test_missing_trace_file_says_what_to_give(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.txt")
    with pytest.raises(ValueError) as info:
        parse_trace(missing)
    assert str(info.value) == (
        f"Preemption trace file {missing!r} does not exist: give the path of a file "
        "of 'TIME,TARGET[,notice|kill]' lines."
    )


def test_delay_forms() -> None:
    assert validate_delay(90) == 90.0
    assert validate_delay("90") == 90.0
    assert validate_delay("0") == 0.0
    with pytest.raises(ValueError) as info:
        validate_delay("later")
    assert str(info.value) == (
        "Bad provisioning delay 'later': use 'paper' (the paper's measured start-up times) or a "
        "non-negative duration such as '0s' or '90s'."
    )


def test_paper_lifetimes_follow_each_workers_type() -> None:
    model = parse_preemption("paper")
    assert model.spec == "paper"
    assert model.for_gpu("v100").spec == "paper:v100"
    assert model.for_gpu("P100").spec == "paper:p100"
    # Types the paper did not measure get its K80 curve (the one with the most servers).
    assert model.for_gpu("t4").spec == "paper:k80" and model.for_gpu(None).spec == "paper:k80"
    # V100s were revoked early far more often than K80s (27.3% vs 7.8% within the first hour).
    rng = random.Random(0)
    early = {
        g: sum((model.for_gpu(g).lifetime(rng) or 1e9) < 3600 for _ in range(4000)) / 4000
        for g in ("k80", "v100")
    }
    assert early["k80"] == pytest.approx(0.078, abs=0.02)
    assert early["v100"] == pytest.approx(0.273, abs=0.03)


def test_odds_of_a_revocation_within_the_hour_follow_the_age() -> None:
    """Selective revocation reads these: the paper's curves make a young K80 and one near GCE's
    24 h limit the likeliest to go; an exponential model is memoryless; no model, no odds."""
    from transient_nb.catalog.lifetimes import HOUR, PaperLifetimesByGpu, revoked_within

    paper = PaperLifetimesByGpu()
    k80 = paper.for_gpu("k80")
    assert k80.revoked_within(0) == pytest.approx(0.078)
    # Hours 12-23: 0.149 of the servers over 11 h, of the 0.805 still up at 12 h.
    assert k80.revoked_within(12 * HOUR) == pytest.approx(0.149 / 11 / 0.805)
    assert k80.revoked_within(22.5 * HOUR) == pytest.approx((0.672 - 0.33727) / (1 - 0.33727), 1e-3)
    assert k80.revoked_within(24 * HOUR) == 1.0 and k80.revoked_within(30 * HOUR) == 1.0
    assert k80.revoked_within(0, horizon_s=2 * HOUR) == pytest.approx(0.141)
    assert k80.cdf(-1) == 0.0 and k80.cdf(0.5) == pytest.approx(0.039)
    # Per type, and the fallback curve for a type the paper did not measure.
    assert revoked_within(paper, "v100", 0) == pytest.approx(0.273)
    assert revoked_within(paper, "k80", 0, horizon_s=2 * HOUR) == pytest.approx(0.141)
    assert revoked_within(paper, "t4", 0) == pytest.approx(0.078)
    assert revoked_within(paper, "k80", -5) == pytest.approx(0.078)  # a clock skew is age 0
    exp = parse_preemption("exp:mean=2h")
    assert revoked_within(exp, None, 0) == revoked_within(exp, None, 20 * HOUR)
    assert revoked_within(exp, None, 0) == pytest.approx(1 - math.exp(-0.5))
    assert revoked_within(parse_preemption("none"), "k80", 0) == 0.0
    assert revoked_within(object(), "k80", 0) == 0.0


def test_each_zone_its_own_lifetimes() -> None:
    """A storm in one zone while the next is calm: Spot capacity runs out zone by zone."""
    from transient_nb.catalog.lifetimes import HOUR, LifetimesByZone, model_of, revoked_within

    model = parse_preemption("zones: us-central1-a = exp:mean=300s ; *=paper")
    assert isinstance(model, LifetimesByZone)
    assert model.for_zone("us-central1-a") == parse_preemption("exp:mean=300s")
    assert model.for_zone("us-east1-c").spec == "paper" and model.for_zone(None).spec == "paper"
    # The zone's model first, then the GPU type's curve within it.
    assert model_of(model, "v100", "us-east1-c").spec == "paper:v100"
    assert model_of(model, "v100", "us-central1-a").spec == "exp:mean=300s"
    assert revoked_within(model, "k80", 0, zone="us-central1-a") == pytest.approx(
        1 - math.exp(-HOUR / 300)
    )
    assert revoked_within(model, "k80", 0, zone="us-west1-b") == pytest.approx(0.078)
    # Zones not named and no "*": never preempted.
    only = parse_preemption("zones:us-central1-a=exp:mean=1h")
    assert only.for_zone("us-east1-c").spec == "none"
    assert revoked_within(only, "k80", 0, zone="us-east1-c") == 0.0
    assert only.lifetime(random.Random(0)) is None
    rng = random.Random(1)
    draws = [model.for_zone("us-central1-a").lifetime(rng) or 0.0 for _ in range(2000)]
    assert sum(draws) / len(draws) == pytest.approx(300, rel=0.1)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (
            "zones:",
            "Preemption spec 'zones:' names no zone: e.g. 'zones:us-central1-a=exp:mean=300s;*=paper'.",
        ),
        (
            "zones:us-central1-a",
            "Preemption spec 'zones:us-central1-a': 'us-central1-a' is not ZONE=SPEC; e.g. 'zones:us-central1-a=exp:mean=300s;*=paper'.",
        ),
        (
            "zones:=none",
            "Preemption spec 'zones:=none': '=none' is not ZONE=SPEC; e.g. 'zones:us-central1-a=exp:mean=300s;*=paper'.",
        ),
        (
            "zones:a=",
            "Preemption spec 'zones:a=': 'a=' is not ZONE=SPEC; e.g. 'zones:us-central1-a=exp:mean=300s;*=paper'.",
        ),
        ("zones:a=none;a=paper", "Preemption spec 'zones:a=none;a=paper' names zone 'a' twice."),
        ("zones:*=none;*=paper", "Preemption spec 'zones:*=none;*=paper' names zone '*' twice."),
        (
            "zones:a=trace:t.csv",
            "Preemption spec 'zones:a=trace:t.csv': zone 'a' has 'trace:t.csv'; a zone's model is 'none', 'paper', 'paper:GPU' or 'exp:mean=DURATION' (a trace names workers, not zones).",
        ),
        (
            "zones:a=zones:b=none",
            "Preemption spec 'zones:a=zones:b=none': zone 'a' has 'zones:b=none'; a zone's model is 'none', 'paper', 'paper:GPU' or 'exp:mean=DURATION' (a trace names workers, not zones).",
        ),
        (
            "zones:a=exp:mean=0s",
            "Preemption spec 'zones:a=exp:mean=0s', zone 'a': Bad exponential preemption spec 'exp:mean=0s': write 'exp:mean=DURATION' with a positive duration, e.g. 'exp:mean=60s'.",
        ),
    ],
)
def test_a_bad_zone_spec_names_the_part_and_what_to_write(bad: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_preemption(bad)
    assert str(info.value) == message


def test_a_zones_model_keeps_its_spec_and_draws_from_its_default() -> None:
    """The spec is what the run record and the views show; a VM whose zone is unknown draws
    from the ``*`` model with the caller's generator (seeded: the same draws again)."""
    spec = "zones:us-central1-a=paper;*=exp:mean=60s"
    model = parse_preemption(spec)
    assert model.spec == spec
    expected = Exponential("exp:mean=60s", 60.0).lifetime(random.Random(3))
    assert model.lifetime(random.Random(3)) == expected and expected is not None


def test_the_paper_model_of_an_unknown_type_draws_the_k80_curve_and_a_trace_no_odds() -> None:
    from transient_nb.catalog.lifetimes import PaperLifetimesByGpu

    paper = PaperLifetimesByGpu()
    k80 = paper.for_gpu("k80").lifetime(random.Random(7))
    assert paper.lifetime(random.Random(7)) == k80 and k80 is not None
    trace = Trace("trace:t.txt", (TraceEntry(5.0, "w-1"),))
    assert trace.lifetime(random.Random(0)) is None
    assert trace.revoked_within(0.0) == 0.0 and trace.revoked_within(HOUR, horizon_s=1e9) == 0.0
