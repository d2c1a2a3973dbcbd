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

from transient_nb.eventlog.vocabulary import BILLING_ENDS

_COLUMNS = [
    "role",
    "gpu",
    "zone",
    "spot",
    "price",
    "price_on_demand",
    "start",
    "end",
    "seconds",
    "cost",
    "cost_on_demand",
]


def bill(seconds: float, hourly: float, minimum_s: float = 60.0) -> float:
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
    minimum_s: float = 60.0,
    time_scale: float | None = None,
) -> CostReport:
    """Bill every VM of a run from its events.

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
    events = list(events)
    if time_scale is None:
        time_scale = next(
            (float(e["time_scale"]) for e in events if e.get("kind") == "started"), 1.0
        )
    if now is None:
        closed = [e["time"] for e in events if e.get("kind") == "closed"]
        now = closed[-1] if closed else time.time()
    vms: dict[str, dict[str, Any]] = {}
    for e in events:
        name = e.get("worker")
        if not name:
            continue
        kind = e.get("kind")
        if kind == "requested":
            vms[name] = {
                "role": e.get("role", "worker"),
                "gpu": e.get("gpu"),
                "zone": e.get("zone"),
                "spot": bool(e.get("spot", False)),
                "price": float(e.get("price", 0.0)),
                "price_on_demand": float(e.get("price_on_demand", 0.0)),
                "start": None,
                "end": None,
            }
        elif name in vms:
            vm = vms[name]
            if kind == "running" and vm["start"] is None:
                vm["start"] = e["time"]
            elif kind in BILLING_ENDS and vm["end"] is None and vm["start"] is not None:
                vm["end"] = e["time"]
    rows = []
    rate = rate_od = 0.0
    for name, vm in vms.items():
        if vm["start"] is None:
            seconds = 0.0
        else:
            end = vm["end"] if vm["end"] is not None else now
            seconds = max(0.0, end - vm["start"]) * time_scale
            if vm["end"] is None:
                rate += vm["price"]
                rate_od += vm["price_on_demand"]
        rows.append(
            {
                "name": name,
                **vm,
                "seconds": seconds,
                "cost": bill(seconds, vm["price"], minimum_s),
                "cost_on_demand": bill(seconds, vm["price_on_demand"], minimum_s),
            }
        )
    per_vm = pd.DataFrame(rows, columns=["name", *_COLUMNS]).set_index("name")
    return CostReport(
        per_vm=per_vm,
        total=float(per_vm["cost"].sum()),
        total_on_demand=float(per_vm["cost_on_demand"].sum()),
        rate=rate,
        rate_on_demand=rate_od,
        time_scale=time_scale,
    )
