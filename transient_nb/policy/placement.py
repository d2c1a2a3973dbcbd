"""Where a new or replacement worker goes: the preferred zone and GPU, then the fallbacks.

The policy remembers zones that ran out of a GPU type (a *stock-out*) for a while and skips them,
as the paper asks of a transient-aware framework (§7: "ask for servers of other types and regions
when one is unavailable"). It also counts the provider's preemptions per (GPU, zone): a zone that
preempted ``preemption_limit`` Spot workers within ``preemption_window_s`` is tried last, after
every other allowed placement (not dropped: a cluster with one zone still gets replacements).
Fallback zones in the PS's region come before those in other regions (the paper: workers in
another region than the PS trained up to 48% slower), so leaving a stormy zone does not move
workers away from the PS while a zone near it is allowed. This is policy, so it lives here for
every backend, not inside one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from transient_nb.training.emulation import cross_region


@dataclass(frozen=True)
class Placement:
    """Where to ask for one worker VM."""

    gpu: str
    zone: str
    spot: bool


@dataclass
class ReplacementPolicy:
    """Ordered placements to try, with a memory of stock-outs.

    Parameters
    ----------
    gpu, zone, spot
        The preferred placement.
    fallback_zones, fallback_gpus
        Tried in order after the preferred zone and GPU type.
    stockout_memory_s
        How long (wall-clock seconds) a stocked-out (zone, GPU) pair is skipped.
    on_demand_fallback
        Finally try on-demand VMs (in the same order) when no Spot capacity is left.
    preemption_limit, preemption_window_s
        Provider preemptions of a GPU type in a zone within the window (seconds of ``clock``)
        after which that Spot placement is tried last; 0 never reorders.
    clock
        Injected for tests.
    not_offered
        (GPU type, zone) pairs the provider does not offer: skipped.
    preferred_zones
        GPU type -> the zone tried first for it, before ``zone`` (set by the transient-aware
        policy through :meth:`prefer_zone`, where it expects that type to live longest per
        dollar).
    ps_zone
        Where the PS runs (its first host; default ``zone``): fallback zones in its region are
        tried before the others, in their given order otherwise.

    Examples
    --------
    >>> p = ReplacementPolicy("t4", "us-central1-a", True, fallback_zones=["us-east1-c"])
    >>> p.remember_stockout(Placement("t4", "us-central1-a", True))
    >>> next(p.candidates())
    Placement(gpu='t4', zone='us-east1-c', spot=True)
    """

    gpu: str
    zone: str
    spot: bool
    fallback_zones: Sequence[str] = ()
    fallback_gpus: Sequence[str] = ()
    stockout_memory_s: float = 600.0
    on_demand_fallback: bool = False
    preemption_limit: int = 0
    preemption_window_s: float = 3600.0
    clock: Callable[[], float] = time.monotonic
    #: (GPU type, zone) pairs the provider does not offer (the backend describes them when it
    #: prepares): never picked, never priced.
    not_offered: set[tuple[str, str]] = field(default_factory=set)
    preferred_zones: dict[str, str] = field(default_factory=dict)
    ps_zone: str | None = None
    _stockouts: dict[tuple[str, str, bool], float] = field(default_factory=dict)
    _preemptions: dict[tuple[str, str], list[float]] = field(default_factory=dict)

    def placements(
        self, gpu: str | None = None, on_demand_first: bool = False
    ) -> Iterator[Placement]:
        """Every placement the policy may pick, stocked out or not, in its order of preference.

        ``gpu``: the type asked for (a mixed cluster asks for several); default the policy's.
        Its fallbacks are the same for every type. ``on_demand_first``: the worker is one the
        cluster keeps on demand (:meth:`TransientCluster.scale`'s ``on_demand``): every
        on-demand placement first, then the Spot ones (better a Spot worker than none).
        """
        first = gpu or self.gpu
        near = self.ps_zone or self.zone
        # Stable: the fallbacks near the PS first, each group in the order given.
        fallbacks = sorted(self.zones(), key=lambda z: cross_region(z, near))
        zones = list(dict.fromkeys([self.preferred_zones.get(first, self.zone), *fallbacks]))
        gpus = [first, *[g for g in self.fallback_gpus if g != first]]
        modes = [self.spot] + ([False] if self.spot and self.on_demand_fallback else [])
        if on_demand_first and self.spot:
            modes = [False, True]
        for spot in modes:
            for gpu in gpus:
                for zone in zones:
                    if (gpu, zone) not in self.not_offered:
                        yield Placement(gpu, zone, spot)

    def zones(self) -> list[str]:
        """The zones it may place workers in: the preferred one, then the fallbacks."""
        return [self.zone, *[z for z in self.fallback_zones if z != self.zone]]

    def prefer_zone(self, gpu: str, zone: str) -> None:
        """Try ``zone`` first for new ``gpu`` workers (one of :meth:`zones`).

        Examples
        --------
        >>> p = ReplacementPolicy("t4", "us-central1-a", True, fallback_zones=["us-east1-c"])
        >>> p.prefer_zone("t4", "us-east1-c")
        >>> [c.zone for c in p.placements("t4")]
        ['us-east1-c', 'us-central1-a']
        >>> p.prefer_zone("t4", "mars-1a")
        Traceback (most recent call last):
        ...
        ValueError: Zone 'mars-1a' is not one this cluster may use: us-central1-a, us-east1-c.
        """
        if zone not in self.zones():
            raise ValueError(
                f"Zone {zone!r} is not one this cluster may use: {', '.join(self.zones())}."
            )
        if zone == self.zone:
            self.preferred_zones.pop(gpu, None)
        else:
            self.preferred_zones[gpu] = zone

    def candidates(
        self, gpu: str | None = None, on_demand_first: bool = False
    ) -> Iterator[Placement]:
        """Placements to try for a ``gpu`` worker, in order, skipping remembered stock-outs.

        Spot placements in a zone that keeps preempting come after all the others.
        ``on_demand_first``: as :meth:`placements`.

        Examples
        --------
        >>> p = ReplacementPolicy("t4", "us-central1-a", True)
        >>> [c.spot for c in p.candidates("t4", on_demand_first=True)]
        [False, True]
        """
        now = self.clock()
        later: list[Placement] = []
        for p in self.placements(gpu, on_demand_first):
            until = self._stockouts.get((p.gpu, p.zone, p.spot))
            if until is not None and until > now:
                continue
            if p.spot and self.preempting(p.gpu, p.zone):
                later.append(p)
                continue
            yield p
        yield from later

    def record_preemption(self, gpu: str | None, zone: str) -> None:
        """Count one preemption by the provider of a ``gpu`` worker in ``zone``."""
        if gpu:
            self._preemptions.setdefault((gpu, zone), []).append(self.clock())

    def preempting(self, gpu: str, zone: str) -> bool:
        """Whether ``zone`` preempted ``preemption_limit`` ``gpu`` workers within the window."""
        if self.preemption_limit <= 0:
            return False
        now = self.clock()
        recent = [
            t for t in self._preemptions.get((gpu, zone), []) if now - t < self.preemption_window_s
        ]
        self._preemptions[(gpu, zone)] = recent
        return len(recent) >= self.preemption_limit

    def remember_stockout(self, placement: Placement) -> None:
        """Skip ``placement`` for ``stockout_memory_s`` seconds."""
        key = (placement.gpu, placement.zone, placement.spot)
        self._stockouts[key] = self.clock() + self.stockout_memory_s

    def stocked_out(self) -> list[Placement]:
        """Placements currently skipped."""
        now = self.clock()
        return [Placement(*k) for k, until in self._stockouts.items() if until > now]


@dataclass(frozen=True)
class Held:
    """A worker VM the cluster could give back on scale-down."""

    name: str
    working: bool  # its worker joined (a VM still booting or starting has done no work yet)
    p_revoked_1h: float  # its probability of being revoked within the hour, at its age
    index: int  # its number (w-INDEX): higher is newer


def give_back_order(held: Sequence[Held]) -> list[Held]:
    """Which VMs to give back first on scale-down (the paper's *selective revocation*).

    First the VMs that do no work yet; then the working ones most likely to be revoked within
    the hour (what the provider would probably take anyway, e.g. a Spot VM near GCE's 24 h limit,
    or a K80 in its first, riskiest hour); at equal odds the newest (the least warmed up).

    Examples
    --------
    >>> order = give_back_order(
    ...     [Held("w-0", True, 0.50, 0), Held("w-1", True, 0.05, 1), Held("w-2", False, 0.0, 2)]
    ... )
    >>> [h.name for h in order]
    ['w-2', 'w-0', 'w-1']
    """
    return sorted(held, key=lambda h: (h.working, -round(h.p_revoked_1h, 9), -h.index))
