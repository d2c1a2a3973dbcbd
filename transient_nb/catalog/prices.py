"""Dated price catalogs: what a GPU and a VM cost per hour, on demand and as Spot, per region.

Two catalogs ship with the package: ``gce-2025`` (recent GCE list prices, the default) and
``paper-2019`` (the prices of Li et al., ICAC 2019, for like-for-like comparisons with the paper).
Users load their own with ``PriceCatalog.load("/path/to/catalog.yaml")``; the file has the shape of
``transient_nb/catalog/gce-2025.yaml``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import yaml

from transient_nb import config

#: The minimum billed seconds of a VM where a catalog does not say (Compute Engine's: per-second
#: billing, at least one minute). The one place this rule is written.
BILLING_MINIMUM_S = 60.0


@dataclass(frozen=True)
class Price:
    """Hourly price in USD, on demand and as Spot (preemptible)."""

    on_demand: float
    spot: float

    def __add__(self, other: Price) -> Price:
        return Price(self.on_demand + other.on_demand, self.spot + other.spot)

    def rate(self, spot: bool) -> float:
        """The price actually paid per hour."""
        return self.spot if spot else self.on_demand


@dataclass(frozen=True)
class Region:
    """Prices and zones of one cloud region."""

    name: str
    zones: tuple[str, ...]
    gpus: dict[str, Price] = field(default_factory=dict)
    machines: dict[str, Price] = field(default_factory=dict)


def shipped_catalogs() -> list[str]:
    """Names of the catalogs that ship inside the package."""
    folder = resources.files("transient_nb.catalog")
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


@dataclass(frozen=True)
class PriceCatalog:
    """A dated price list.

    Examples
    --------
    >>> catalog = PriceCatalog.load("paper-2019")
    >>> catalog.worker_price("k80", "n1-standard-8", "us-east1-c").spot
    0.256
    """

    name: str
    date: str
    source: str
    regions: dict[str, Region]
    minimum_s: float = BILLING_MINIMUM_S
    increment_s: float = 1.0
    #: GPU type -> published peak FP32 TFLOPS (the catalog's ``peaks:``; what estimates start from).
    peaks: dict[str, float] = field(default_factory=dict)

    @classmethod
    def load(cls, name_or_path: str | None = None) -> PriceCatalog:
        """Load a shipped catalog by name, or a YAML file by path.

        ``None`` reads ``transient.prices.catalog`` from the configuration.
        """
        name_or_path = config.get("prices.catalog", override_with=name_or_path)
        if os.path.exists(os.path.expanduser(name_or_path)):
            with open(os.path.expanduser(name_or_path)) as f:
                data = yaml.safe_load(f)
            return cls.from_dict(data, origin=name_or_path)
        if name_or_path not in shipped_catalogs():
            raise ValueError(
                f"Unknown price catalog {name_or_path!r}: give one of "
                f"{', '.join(shipped_catalogs())} or the path of a YAML catalog file."
            )
        text = (resources.files("transient_nb.catalog") / f"{name_or_path}.yaml").read_text()
        return cls.from_dict(yaml.safe_load(text), origin=name_or_path)

    @classmethod
    def from_dict(cls, data: dict[str, Any], origin: str = "<dict>") -> PriceCatalog:
        """Build a catalog from the mapping a catalog YAML file holds."""
        try:
            regions = {
                rname: Region(
                    name=rname,
                    zones=tuple(r["zones"]),
                    gpus={
                        k: Price(float(v["on_demand"]), float(v["spot"]))
                        for k, v in r.get("gpus", {}).items()
                    },
                    machines={
                        k: Price(float(v["on_demand"]), float(v["spot"]))
                        for k, v in r.get("machines", {}).items()
                    },
                )
                for rname, r in data["regions"].items()
            }
            billing = data.get("billing", {})
            peaks = {
                str(k): float(v["fp32_tflops"] if isinstance(v, dict) else v)
                for k, v in (data.get("peaks") or {}).items()
            }
            return cls(
                name=str(data.get("name", origin)),
                date=str(data.get("date", "undated")),
                source=str(data.get("source", origin)),
                regions=regions,
                minimum_s=float(billing.get("minimum", BILLING_MINIMUM_S)),
                increment_s=float(billing.get("increment", 1)),
                peaks=peaks,
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ValueError(
                f"Price catalog {origin!r} is malformed ({type(e).__name__}: {e}); it needs "
                "'regions: {REGION: {zones: [...], gpus: {GPU: {on_demand: X, spot: Y}}, "
                "machines: {...}}}' as in transient_nb/catalog/gce-2025.yaml."
            ) from e

    # -- lookups -----------------------------------------------------------------------------
    def zones(self) -> list[str]:
        """Every zone the catalog knows."""
        return [z for r in self.regions.values() for z in r.zones]

    def gpus(self) -> list[str]:
        """Every GPU type priced in at least one region."""
        return sorted({g for r in self.regions.values() for g in r.gpus})

    def region(self, zone: str) -> Region:
        """The region of ``zone``; a clear error for an unknown zone."""
        for r in self.regions.values():
            if zone in r.zones:
                return r
        raise ValueError(
            f"Unknown zone {zone!r} in price catalog {self.name!r}: use one of "
            f"{', '.join(self.zones())} (or load a catalog that prices it)."
        )

    def gpu_price(self, gpu: str, zone: str) -> Price:
        """Hourly price of one GPU of type ``gpu`` in ``zone``."""
        return self._price(self.region(zone).gpus, gpu, "GPU type", zone)

    def machine_price(self, machine: str, zone: str) -> Price:
        """Hourly price of the VM part (cores, memory) of machine type ``machine``."""
        return self._price(self.region(zone).machines, machine, "machine type", zone)

    def _price(self, table: dict[str, Price], key: str, what: str, zone: str) -> Price:
        if key not in table:
            known = ", ".join(sorted(table)) or "none"
            raise ValueError(
                f"Unknown {what} {key!r} in {zone} (catalog {self.name!r}): use one of {known}, "
                "or load a price catalog that lists it."
            )
        return table[key]

    def peak_tflops(self, gpu: str) -> float | None:
        """Published peak FP32 TFLOPS of one ``gpu`` (None when the catalog has no figure).

        Examples
        --------
        >>> PriceCatalog.load("gce-2025").peak_tflops("t4")
        8.1
        """
        return self.peaks.get(gpu.lower())

    def worker_price(self, gpu: str | None, machine: str, zone: str) -> Price:
        """Hourly price of a worker VM: its machine type plus its GPU (if any)."""
        price = self.machine_price(machine, zone)
        if gpu:
            price = price + self.gpu_price(gpu, zone)
        return price
