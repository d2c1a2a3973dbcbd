"""The cost meter: dollars spent, and what on-demand would have cost, from a run's event log.

Each VM is billed per second, with the catalog's minimum (one minute on GCE), from its ``running``
event until it is ``preempted`` or ``deleted`` (or until now, while it still runs). Durations are
multiplied by the run's ``time_scale`` so that a time-compressed simulation bills what the same run
would cost at cloud speed. The on-demand counterfactual bills the same VM, for the same time, at its
on-demand price.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd

from transient_nb.catalog.prices import BILLING_MINIMUM_S
from transient_nb.eventlog.vocabulary import BILLING_ENDS, ClusterStart

Event = Mapping[str, Any]


def bill(seconds: float, hourly: float, minimum_s: float = BILLING_MINIMUM_S) -> float:
    """Dollars for a VM that ran ``seconds``: per-second billing with a minimum charge.

    Examples
    --------
    >>> round(bill(30, 3.6), 4)   # the one-minute minimum
    0.06
    >>> round(bill(90, 3.6), 4)
    0.09
    """
    if seconds <= 0:
        return 0.0
    return max(minimum_s, seconds) * hourly / 3600.0


@dataclass(frozen=True)
class CostReport:
    """Money spent by a run so far, beside its on-demand counterfactual.

    Attributes
    ----------
    per_vm
        One row per VM: role, GPU, zone, spot, hourly prices, billed simulated ``seconds``,
        ``cost`` and ``cost_on_demand`` (USD).
    total, total_on_demand
        Sums over all VMs, PS host included.
    rate, rate_on_demand
        USD per (simulated) hour of the VMs running now.
    """

    per_vm: pd.DataFrame
    total: float
    total_on_demand: float
    rate: float
    rate_on_demand: float
    time_scale: float

    @property
    def saved(self) -> float:
        """Dollars saved against on-demand."""
        return self.total_on_demand - self.total

    @property
    def saved_fraction(self) -> float:
        """Fraction of the on-demand cost saved (0 when nothing was spent)."""
        return self.saved / self.total_on_demand if self.total_on_demand > 0 else 0.0

    @property
    def by_gpu(self) -> pd.DataFrame:
        """Cost per GPU type (the PS host as ``"ps"``): one row per type, summing to the totals.

        Columns: ``vms`` (VMs billed or running), ``seconds`` (billed, simulated), ``cost`` and
        ``cost_on_demand`` (USD), ``rate`` (USD per hour of the VMs of that type running now).
        A mixed cluster's question, "what did each type cost me", answered from the same rows
        as the totals.

        Examples
        --------
        >>> cluster.cost().by_gpu  # doctest: +SKIP
        """
        cols = ["vms", "seconds", "cost", "cost_on_demand"]
        if self.per_vm.empty:
            return pd.DataFrame(columns=cols).rename_axis("gpu")
        df = self.per_vm.copy()
        df["gpu"] = [
            "ps" if role == "ps" else str(gpu or "none")
            for role, gpu in zip(df["role"], df["gpu"], strict=True)
        ]
        df["vms"] = 1
        return df.groupby("gpu", sort=False)[cols].sum()

    def to_dict(self) -> dict[str, Any]:
        """Totals as plain numbers (JSON-friendly); per GPU type: :attr:`by_gpu`."""
        return {
            "cost": self.total,
            "cost_on_demand": self.total_on_demand,
            "saved": self.saved,
            "saved_fraction": self.saved_fraction,
            "rate_per_hour": self.rate,
            "rate_on_demand_per_hour": self.rate_on_demand,
        }

    def __repr__(self) -> str:
        return (
            f"<CostReport ${self.total:.4f} spent, ${self.total_on_demand:.4f} on demand, "
            f"saved {self.saved_fraction:.0%}; now ${self.rate:.3f}/h>"
        )

    def _repr_html_(self) -> str:
        # Dollar signs would be typeset as LaTeX by JupyterLab's MathJax: opt out.
        head = (
            '<div class="tex2jax_ignore mathjax_ignore">'
            f"<p><b>${self.total:.4f}</b> spent &middot; ${self.total_on_demand:.4f} on demand "
            f"&middot; saved <b>{self.saved_fraction:.0%}</b> &middot; now ${self.rate:.3f}/h "
            f"(on demand ${self.rate_on_demand:.3f}/h)</p>"
        )
        fmt = {"float_format": lambda x: f"{x:.4f}"}
        by_gpu = self.by_gpu
        per_type = (
            "<p>Per GPU type:</p>" + by_gpu.to_html(**fmt) if len(by_gpu) > 2 else ""
        )  # more than one GPU type beside the PS host: a mixed cluster
        return head + per_type + self.per_vm.to_html(**fmt) + "</div>"


def compute_costs(
    events: Iterable[Mapping[str, Any]],
    now: float | None = None,
    minimum_s: float = BILLING_MINIMUM_S,
    time_scale: float | None = None,
) -> CostReport:
    """Bill every VM of a run from its events (the whole log at once; :class:`Bill` folds it).

    Parameters
    ----------
    events
        The run's events, in order (``cluster.events()`` rows or a run record).
    now
        Wall-clock time at which VMs still running stop being billed; defaults to the time of
        the ``closed`` event if there is one, else the current time.
    minimum_s
        Minimum billed seconds per VM (GCE: 60).
    time_scale
        Simulated seconds per wall second; defaults to the value in the run's ``started`` event.
    """
    fold = Bill(minimum_s, time_scale=time_scale)
    for e in events:
        fold.feed(e)
    return fold.report(now)


@dataclass
class _BilledVM:
    role: str
    gpu: Any
    zone: Any
    spot: bool
    price: float
    price_on_demand: float
    start: float | None = None
    end: float | None = None


class Bill:
    """The bill of a run, kept up to date event by event.

    The one bill of the package (:func:`compute_costs` folds a whole log with it): per-second
    billing with a minimum, from
    ``running`` to ``preempted``/``deleted``, in simulated time. A VM's cost is fixed once it
    stops, so a query only walks the VMs that still run.

    Parameters
    ----------
    minimum_s
        Minimum billed seconds per VM (the price catalog's).

    Examples
    --------
    >>> b = Bill(minimum_s=60)
    >>> b.feed({"kind": "requested", "time": 0.0, "worker": "w-0", "price": 3.6})
    >>> b.feed({"kind": "running", "time": 0.0, "worker": "w-0"})
    >>> round(b.totals(now=90.0)[0], 4)
    0.09
    """

    def __init__(self, minimum_s: float = BILLING_MINIMUM_S, time_scale: float | None = None):
        self.minimum_s = minimum_s
        self.time_scale = 1.0 if time_scale is None else float(time_scale)
        #: A given time scale wins over the ``started`` event's.
        self._scale_known = time_scale is not None
        #: Wall time of the last ``closed`` event: VMs still running are billed up to it.
        self.closed_at: float | None = None
        self._vms: dict[str, _BilledVM] = {}
        self._running: dict[str, _BilledVM] = {}
        self._fixed = 0.0
        self._fixed_od = 0.0

    def _stopped_cost(self, vm: _BilledVM) -> tuple[float, float]:
        assert vm.start is not None and vm.end is not None
        seconds = max(0.0, vm.end - vm.start) * self.time_scale
        return bill(seconds, vm.price, self.minimum_s), bill(
            seconds, vm.price_on_demand, self.minimum_s
        )

    def feed(self, e: Event) -> None:
        """Take one event into account (any kind; the irrelevant ones cost a lookup)."""
        kind = e.get("kind")
        if kind == "started" and not self._scale_known:
            self._scale_known = True
            self.time_scale = ClusterStart(e).time_scale
            if self.time_scale != 1.0 and self._fixed:
                # Only when "started" comes after VMs stopped (never in a real log): re-bill them.
                self._fixed = self._fixed_od = 0.0
                for vm in self._vms.values():
                    if vm.end is not None and vm.start is not None:
                        c, od = self._stopped_cost(vm)
                        self._fixed += c
                        self._fixed_od += od
            return
        if kind == "closed":
            self.closed_at = float(e["time"])
            return
        name = e.get("worker")
        if not name:
            return
        if kind == "requested":
            old = self._vms.get(name)
            if old is not None:  # the same name again: the new VM replaces the old one's bill
                self._running.pop(name, None)
                if old.end is not None and old.start is not None:
                    c, od = self._stopped_cost(old)
                    self._fixed -= c
                    self._fixed_od -= od
            self._vms[name] = _BilledVM(
                role=e.get("role", "worker"),
                gpu=e.get("gpu"),
                zone=e.get("zone"),
                spot=bool(e.get("spot", False)),
                price=float(e.get("price", 0.0)),
                price_on_demand=float(e.get("price_on_demand", 0.0)),
            )
            return
        billed = self._vms.get(name)
        if billed is None:
            return
        vm = billed
        if kind == "running" and vm.start is None:
            vm.start = float(e["time"])
            self._running[name] = vm
        elif kind in BILLING_ENDS and vm.end is None and vm.start is not None:
            vm.end = float(e["time"])
            self._running.pop(name, None)
            c, od = self._stopped_cost(vm)
            self._fixed += c
            self._fixed_od += od

    def _now(self, now: float | None) -> float:
        if now is not None:
            return now
        return self.closed_at if self.closed_at is not None else time.time()

    def _running_seconds(self, vm: _BilledVM, now: float) -> float:
        assert vm.start is not None
        return max(0.0, now - vm.start) * self.time_scale

    def totals(self, now: float | None = None) -> tuple[float, float, float, float]:
        """``(total, total_on_demand, rate, rate_on_demand)`` at ``now``.

        ``now`` defaults to the ``closed`` event's time, else the current time.
        """
        now = self._now(now)
        total, total_od, rate, rate_od = self._fixed, self._fixed_od, 0.0, 0.0
        for vm in self._running.values():
            seconds = self._running_seconds(vm, now)
            total += bill(seconds, vm.price, self.minimum_s)
            total_od += bill(seconds, vm.price_on_demand, self.minimum_s)
            rate += vm.price
            rate_od += vm.price_on_demand
        return total, total_od, rate, rate_od

    def vm_cost(self, name: str, now: float | None = None) -> float:
        """Dollars billed for VM ``name`` so far (0 for an unknown one)."""
        vm = self._vms.get(name)
        if vm is None or vm.start is None:
            return 0.0
        if vm.end is not None:
            return self._stopped_cost(vm)[0]
        return bill(self._running_seconds(vm, self._now(now)), vm.price, self.minimum_s)

    def is_running(self, name: str) -> bool:
        """True while VM ``name`` is billed (running, not yet stopped)."""
        return name in self._running

    def price(self, name: str) -> float:
        """Hourly price of VM ``name`` (0 for an unknown one)."""
        vm = self._vms.get(name)
        return vm.price if vm is not None else 0.0

    def report(self, now: float | None = None) -> CostReport:
        """The whole bill as a :class:`~transient_nb.eventlog.bill.CostReport` (one row per VM)."""
        now = self._now(now)
        rows = []
        for name, vm in self._vms.items():
            if vm.start is None:
                seconds = 0.0
            else:
                end = vm.end if vm.end is not None else now
                seconds = max(0.0, end - vm.start) * self.time_scale
            rows.append(
                {
                    "name": name,
                    "role": vm.role,
                    "gpu": vm.gpu,
                    "zone": vm.zone,
                    "spot": vm.spot,
                    "price": vm.price,
                    "price_on_demand": vm.price_on_demand,
                    "start": vm.start,
                    "end": vm.end,
                    "seconds": seconds,
                    "cost": bill(seconds, vm.price, self.minimum_s),
                    "cost_on_demand": bill(seconds, vm.price_on_demand, self.minimum_s),
                }
            )
        columns = ["name", "role", "gpu", "zone", "spot", "price", "price_on_demand", "start"]
        columns += ["end", "seconds", "cost", "cost_on_demand"]
        per_vm = pd.DataFrame(rows, columns=columns).set_index("name")
        total, total_od, rate, rate_od = self.totals(now)
        return CostReport(
            per_vm=per_vm,
            total=total,
            total_on_demand=total_od,
            rate=rate,
            rate_on_demand=rate_od,
            time_scale=self.time_scale,
        )
