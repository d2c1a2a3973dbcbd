"""Where preemptions come from: lifetime models and trace files.

A preemption model answers one question for every worker VM that starts running: after how many
simulated seconds will the provider take it back (``None``: never)? Sources:

- ``"paper:k80"``, ``"paper:p100"``, ``"paper:v100"``, ``"paper:cpu"``: the empirical lifetime
  CDFs measured by Li et al. (ICAC 2019, Fig. 3), preemptible VMs living at most 24 h;
- ``"exp:mean=DURATION"``: exponential lifetimes with the given mean (e.g. ``exp:mean=60s``);
- ``"trace:PATH"``: replay of a file of ``TIME,TARGET[,notice|kill]`` lines (TIME in simulated
  seconds since the cluster started or a duration like ``90s``; TARGET a worker name like ``w-1`` or
  ``slot:N``, the N-th worker slot whoever holds it then);
- ``"zones:ZONE=SPEC;ZONE=SPEC;*=SPEC"``: each zone its own lifetime model (any of the above but a
  trace), ``*`` for the zones not named (none named and no ``*``: never preempted). Spot
  capacity runs out zone by zone: a storm in one zone while the next is calm;
- ``"none"``.
"""

from __future__ import annotations

import bisect
import math
import os
import random
from dataclasses import dataclass
from typing import Any, Protocol

from dask.utils import parse_timedelta

HOUR = 3600.0

#: What ``dask.utils.parse_timedelta`` raises for text that is no duration: besides ValueError and
#: KeyError (unknown unit), IndexError for "" and OverflowError for "1e400".
_BAD_DURATION = (ValueError, TypeError, KeyError, IndexError, OverflowError)

#: Fraction of servers revoked by hour t, Li et al. Fig. 3 (data/lifetime/plot.py), with the first
#: measured point placed at 1 h (the figure bins by hour) and every preemptible VM gone at 24 h.
PAPER_LIFETIME_CDF: dict[str, list[tuple[float, float]]] = {
    "k80": [(0, 0.0), (1, 0.078), (2, 0.141), (6, 0.195), (12, 0.195), (23, 0.344), (24, 1.0)],
    "p100": [(0, 0.0), (1, 0.048), (2, 0.048), (6, 0.190), (12, 0.214), (23, 0.238), (24, 1.0)],
    "v100": [(0, 0.0), (1, 0.273), (2, 0.318), (6, 0.318), (12, 0.318), (23, 0.348), (24, 1.0)],
    "cpu": [(0, 0.0), (1, 0.040), (2, 0.083), (6, 0.121), (12, 0.158), (23, 0.175), (24, 1.0)],
}

#: The curve of a GPU type the paper did not measure (T4, L4, A100): the K80's, a GPU server's
#: measured on the most servers (128 of the study's GPU VMs). One default for the simulator, the
#: planner and every view (a CPU server's curve would make them look twice as calm).
UNMEASURED_GPU_CURVE = "k80"


def paper_curve(gpu: str | None) -> list[tuple[float, float]]:
    """The paper's lifetime CDF of a ``gpu`` server (:data:`UNMEASURED_GPU_CURVE`'s if it did
    not measure that type).

    Examples
    --------
    >>> paper_curve("t4") == paper_curve("k80") != paper_curve("v100")
    True
    """
    key = gpu.lower() if gpu and gpu.lower() in PAPER_LIFETIME_CDF else UNMEASURED_GPU_CURVE
    return PAPER_LIFETIME_CDF[key]


#: Seconds from API request to a booted VM (Li et al. §5): preemptible GPU 81-98 s, on-demand 69-82 s.
PAPER_STARTUP_S = {"spot": (81.0, 98.0), "on_demand": (69.0, 82.0)}


class PreemptionModel(Protocol):
    """Draws the lifetime of a newly running VM, in simulated seconds (None: never preempted)."""

    @property
    def spec(self) -> str: ...

    def lifetime(self, rng: random.Random) -> float | None: ...


class _NoDrawnLifetimes:
    """A model that draws no lifetimes: no VM dies of a draw, so none is more at risk than another.

    Shared by :class:`NoPreemption` (nothing is revoked) and :class:`Trace` (revocations come at
    the times the trace names, which say nothing of the odds, so no VM is preferred).
    """

    def lifetime(self, rng: random.Random) -> float | None:
        return None

    def revoked_within(self, age_s: float, horizon_s: float = HOUR) -> float:
        """Probability of a revocation within ``horizon_s`` of a VM ``age_s`` old, by a draw: 0."""
        return 0.0


@dataclass(frozen=True)
class NoPreemption(_NoDrawnLifetimes):
    """Workers live until they are scaled away."""

    spec: str = "none"


@dataclass(frozen=True)
class EmpiricalLifetimes:
    """Inverse-CDF sampling of a piecewise-linear empirical lifetime distribution."""

    spec: str
    hours: tuple[float, ...]
    fractions: tuple[float, ...]

    def lifetime(self, rng: random.Random) -> float | None:
        u = rng.random()
        i = bisect.bisect_left(self.fractions, u)
        if i == 0:
            return self.hours[0] * HOUR
        if i >= len(self.fractions):
            return None
        f0, f1 = self.fractions[i - 1], self.fractions[i]
        h0, h1 = self.hours[i - 1], self.hours[i]
        # Flat stretches of the CDF hold no probability, so u never lands inside them.
        h = h0 + (h1 - h0) * (u - f0) / (f1 - f0)
        return h * HOUR

    def cdf(self, hours: float) -> float:
        """Fraction of VMs revoked by ``hours`` of age (1 past the last point: GCE's 24 h)."""
        if hours >= self.hours[-1]:
            return self.fractions[-1]
        i = max(1, bisect.bisect_right(self.hours, hours))
        h0, h1 = self.hours[i - 1], self.hours[i]
        f0, f1 = self.fractions[i - 1], self.fractions[i]
        return f0 + (f1 - f0) * (max(hours, h0) - h0) / (h1 - h0)

    def revoked_within(self, age_s: float, horizon_s: float = HOUR) -> float:
        """Probability that a VM that lived ``age_s`` is revoked within the next ``horizon_s``.

        Examples
        --------
        >>> k80 = PaperLifetimesByGpu().for_gpu("k80")
        >>> round(k80.revoked_within(0), 3), round(k80.revoked_within(22.5 * HOUR), 3)
        (0.078, 0.505)
        """
        a, b = age_s / HOUR, (age_s + horizon_s) / HOUR
        alive = 1.0 - self.cdf(a)
        return 1.0 if alive <= 0 else (self.cdf(b) - self.cdf(a)) / alive


@dataclass(frozen=True)
class PaperLifetimesByGpu:
    """The paper's lifetime curve of each worker's own GPU type (``preemption="paper"``).

    What a mixed cluster needs: a K80 lives as the paper's K80s did, a V100 as its V100s. Types
    the paper did not measure (T4, L4, A100) get the K80 curve, the one measured on the most
    servers (128); say so wherever such figures are shown.
    """

    spec: str = "paper"
    fallback: str = UNMEASURED_GPU_CURVE

    def for_gpu(self, gpu: str | None) -> EmpiricalLifetimes:
        """The paper's model of a ``gpu`` worker (the fallback type's if it has none)."""
        key = gpu.lower() if gpu and gpu.lower() in PAPER_LIFETIME_CDF else self.fallback
        points = PAPER_LIFETIME_CDF[key]
        return EmpiricalLifetimes(
            f"paper:{key}", tuple(p[0] for p in points), tuple(p[1] for p in points)
        )

    def lifetime(self, rng: random.Random) -> float | None:
        return self.for_gpu(None).lifetime(rng)


@dataclass(frozen=True)
class Exponential:
    """Memoryless lifetimes with mean ``mean_s`` (the paper's K80 fit: 3.33e-4 per minute)."""

    spec: str
    mean_s: float

    def lifetime(self, rng: random.Random) -> float | None:
        return rng.expovariate(1.0 / self.mean_s)

    def revoked_within(self, age_s: float, horizon_s: float = HOUR) -> float:
        """Probability of a revocation within ``horizon_s``, whatever the age (memoryless)."""
        return 1.0 - math.exp(-horizon_s / self.mean_s)


@dataclass(frozen=True)
class TraceEntry:
    """One line of a trace file."""

    time_s: float
    target: str  # a worker name, or "slot:N"
    notice: bool = True


@dataclass(frozen=True)
class Trace(_NoDrawnLifetimes):
    """Preemptions replayed at fixed times; lifetimes of individual VMs are not drawn."""

    spec: str
    entries: tuple[TraceEntry, ...]


@dataclass(frozen=True)
class LifetimesByZone:
    """Each zone its own lifetime model (``"zones:us-central1-a=exp:mean=300s;*=paper"``).

    Examples
    --------
    >>> storm = parse_preemption("zones:us-central1-a=exp:mean=300s;*=paper")
    >>> storm.for_zone("us-central1-a").mean_s
    300.0
    >>> storm.for_zone("us-east1-c").spec
    'paper'
    """

    spec: str
    zones: tuple[tuple[str, PreemptionModel], ...]
    default: PreemptionModel = NoPreemption()

    def for_zone(self, zone: str | None) -> PreemptionModel:
        """The model of a VM in ``zone`` (the ``*`` model for a zone not named)."""
        return dict(self.zones).get(zone or "", self.default)

    def lifetime(self, rng: random.Random) -> float | None:
        return self.default.lifetime(rng)


def model_of(model: Any, gpu: str | None = None, zone: str | None = None) -> Any:
    """The model one VM's lifetime is drawn from: its zone's (a model with ``for_zone``), then
    its GPU type's (a model with ``for_gpu``)."""
    for_zone = getattr(model, "for_zone", None)
    model = for_zone(zone) if callable(for_zone) else model
    for_gpu = getattr(model, "for_gpu", None)
    return for_gpu(gpu) if callable(for_gpu) else model


def revoked_within(
    model: Any, gpu: str | None, age_s: float, horizon_s: float = HOUR, zone: str | None = None
) -> float:
    """Probability that a ``gpu`` VM in ``zone``, ``age_s`` old, is revoked within ``horizon_s``
    under ``model`` (see :func:`model_of`; a model without odds answers 0)."""
    odds = getattr(model_of(model, gpu, zone), "revoked_within", None)
    return float(odds(max(0.0, age_s), horizon_s)) if callable(odds) else 0.0


def parse_trace(path: str) -> Trace:
    """Read a trace file; a malformed line raises ``ValueError`` naming the file and line."""
    full = os.path.expanduser(path)
    if not os.path.exists(full):
        raise ValueError(
            f"Preemption trace file {path!r} does not exist: give the path of a file "
            "of 'TIME,TARGET[,notice|kill]' lines."
        )
    entries = []
    with open(full) as f:
        for lineno, raw in enumerate(f, start=1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            parts = [p.strip() for p in line.split(",")]
            try:
                if len(parts) not in (2, 3):
                    raise ValueError("expected 2 or 3 comma-separated fields")
                try:
                    t = parse_timedelta(parts[0], default="seconds")
                except _BAD_DURATION:
                    t = None
                if t is None or not math.isfinite(t) or t < 0:
                    raise ValueError(f"time {parts[0]!r} is not a non-negative duration")
                target = parts[1]
                if target.startswith("slot:"):
                    if not target[5:].isdigit():
                        raise ValueError(f"slot {target!r} must be slot:N with N a whole number")
                elif not target:
                    raise ValueError("empty target")
                mode = parts[2] if len(parts) == 3 else "notice"
                if mode not in ("notice", "kill"):
                    raise ValueError(f"third field {mode!r} must be 'notice' or 'kill'")
            except (ValueError, TypeError, KeyError) as e:
                raise ValueError(
                    f"Malformed line {lineno} in preemption trace {path!r}: {raw.strip()!r} ({e}). "
                    "Each line must read TIME,TARGET[,notice|kill], e.g. '90s,w-1' or '120,slot:0,kill'."
                ) from e
            entries.append(TraceEntry(float(t), target, mode == "notice"))
    return Trace(spec=f"trace:{path}", entries=tuple(sorted(entries, key=lambda e: e.time_s)))


def parse_preemption(spec: str | None) -> PreemptionModel:
    """Turn a preemption spec string into a model; a clear ``ValueError`` for bad specs.

    Examples
    --------
    >>> parse_preemption("exp:mean=60s").mean_s
    60.0
    >>> parse_preemption("paper:k80").spec
    'paper:k80'
    """
    forms = (
        "'none', 'paper', 'paper:k80|p100|v100|cpu', 'exp:mean=60s', 'trace:PATH' or "
        "'zones:ZONE=SPEC;*=SPEC'"
    )
    if spec is None or spec in ("none", ""):
        return NoPreemption()
    if spec == "paper":
        return PaperLifetimesByGpu()
    if not isinstance(spec, str):
        raise ValueError(f"Preemption spec {spec!r} must be a string: {forms}.")
    kind, _, arg = spec.partition(":")
    if kind == "zones":
        return _parse_zones(spec, arg)
    if kind == "paper":
        if arg not in PAPER_LIFETIME_CDF:
            raise ValueError(
                f"Unknown paper lifetime model {spec!r}: use one of "
                f"{', '.join('paper:' + k for k in PAPER_LIFETIME_CDF)}."
            )
        points = PAPER_LIFETIME_CDF[arg]
        return EmpiricalLifetimes(spec, tuple(p[0] for p in points), tuple(p[1] for p in points))
    if kind == "exp":
        key, _, value = arg.partition("=")
        try:
            if key != "mean":
                raise ValueError
            mean = parse_timedelta(value, default="seconds")
        except _BAD_DURATION:
            mean = None
        if mean is None or not mean > 0:
            raise ValueError(
                f"Bad exponential preemption spec {spec!r}: write 'exp:mean=DURATION' "
                "with a positive duration, e.g. 'exp:mean=60s'."
            )
        return Exponential(spec, float(mean))
    if kind == "trace":
        if not arg:
            raise ValueError(f"Preemption spec {spec!r} needs a file: 'trace:PATH'.")
        return parse_trace(arg)
    raise ValueError(f"Unknown preemption spec {spec!r}: use {forms}.")


def _parse_zones(spec: str, arg: str) -> LifetimesByZone:
    """``zones:ZONE=SPEC;...;*=SPEC``: each part checked, the bad one named."""
    example = "e.g. 'zones:us-central1-a=exp:mean=300s;*=paper'"
    zones: dict[str, PreemptionModel] = {}  # "*" among them until the end
    parts = [p.strip() for p in arg.split(";") if p.strip()]
    if not parts:
        raise ValueError(f"Preemption spec {spec!r} names no zone: {example}.")
    for part in parts:
        zone, eq, inner = (x.strip() for x in part.partition("="))
        if not eq or not zone or not inner:
            raise ValueError(f"Preemption spec {spec!r}: {part!r} is not ZONE=SPEC; {example}.")
        if inner.startswith(("zones:", "trace:")):
            raise ValueError(
                f"Preemption spec {spec!r}: zone {zone!r} has {inner!r}; a zone's model is "
                "'none', 'paper', 'paper:GPU' or 'exp:mean=DURATION' (a trace names workers, "
                "not zones)."
            )
        if zone in zones:
            raise ValueError(f"Preemption spec {spec!r} names zone {zone!r} twice.")
        try:
            model = parse_preemption(inner)
        except ValueError as e:
            raise ValueError(f"Preemption spec {spec!r}, zone {zone!r}: {e}") from None
        zones[zone] = model
    default = zones.pop("*", NoPreemption())
    return LifetimesByZone(spec, tuple(zones.items()), default)


def parse_delay(spec: str | float | None, *, spot: bool, rng: random.Random) -> float:
    """Draw a provisioning delay in simulated seconds: ``"paper"`` or a fixed duration."""
    if spec == "paper":
        lo, hi = PAPER_STARTUP_S["spot" if spot else "on_demand"]
        return rng.uniform(lo, hi)
    return float(validate_delay(spec))


def validate_delay(spec: str | float | None) -> float | str:
    """Check a provisioning-delay setting; returns ``"paper"`` or seconds."""
    if spec == "paper":
        return "paper"
    try:
        value = parse_timedelta(spec, default="seconds")
    except _BAD_DURATION:
        value = None
    if value is None or value < 0:
        raise ValueError(
            f"Bad provisioning delay {spec!r}: use 'paper' (the paper's measured "
            "start-up times) or a non-negative duration such as '0s' or '90s'."
        )
    return float(value)
