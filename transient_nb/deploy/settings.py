"""A cluster's settings, checked without a cluster: every mistake is refused before anything starts.

:class:`ClusterSettings` reads a :class:`~transient_nb.TransientCluster`'s arguments (explicit
argument, else the ``transient`` Dask config, else its default) and refuses any that cannot work
with a ``ValueError`` that names the value and says what to type instead. The cluster builds
itself from it; a detached cluster's launcher (the local head process, GCE's head VM) checks the
same settings, and the backend's look-ups in its API (:meth:`ClusterSettings.check`), before it
creates anything.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from dask.utils import parse_timedelta

from transient_nb import config
from transient_nb.backends import Backend, get_backend
from transient_nb.backends.base import Preparation
from transient_nb.catalog.lifetimes import PreemptionModel, parse_preemption, validate_delay
from transient_nb.catalog.mix import Mix, format_mix, parse_mix
from transient_nb.catalog.prices import PriceCatalog
from transient_nb.deploy import registry
from transient_nb.deploy.registry import check_name as check_name  # one rule, with the registry
from transient_nb.limits import Limits
from transient_nb.policy.placement import ReplacementPolicy

#: When a replacement is asked for: once the worker is gone, at its notice, or (``ahead``) once
#: gone and, where the lifetime model predicts a revocation, as a spare before it.
REPLACE_AT = ("preempted", "notice", "ahead")


def positive_int(value: Any, what: str) -> int:
    """``value`` if it is a whole number of at least 1; a ``ValueError`` naming ``what``.

    Examples
    --------
    >>> positive_int(3, "workers")
    3
    >>> positive_int(True, "workers")
    Traceback (most recent call last):
    ...
    ValueError: workers=True must be a whole number of at least 1.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what}={value!r} must be a whole number of at least 1.")
    return value


def is_detached(detached: bool | None, backend: str | None) -> bool:
    """Whether a new cluster is detached: the argument, else ``transient.detached``, else auto.

    Auto (``null``): detached on GCE (a run must not depend on the notebook, which need not be
    in the VPC), attached on the local backend (the Dask convention).

    Examples
    --------
    >>> is_detached(None, "gce"), is_detached(None, "local"), is_detached(False, "gce")
    (True, False, False)
    """
    value = config.get("detached", override_with=detached)
    if value is None:
        return bool(config.get("backend", override_with=backend) == "gce")
    return bool(value)


def _seconds(key: str) -> float:
    return float(parse_timedelta(config.get(key), default="seconds") or 0)


# Only the fields: no __init__, __repr__ or __eq__, which a cluster (a SpecCluster) has its own of.
@dataclass(init=False, repr=False, eq=False)
class SharedSettings:
    """The settings that every part of a running cluster reads, declared once: a
    :class:`ClusterSettings` holds them checked, and the cluster
    (:class:`~transient_nb.deploy.core.ClusterCore`) gets them with :meth:`share_with`. The
    cluster may change its own copy (``ps_hosts`` when it scales its PS hosts)."""

    gpu: str
    limits: Limits
    spot: bool
    zone: str
    machine_type: str
    ps_machine_type: str
    ps_hosts: int
    catalog: PriceCatalog
    preemption: PreemptionModel
    time_scale: float
    notice_s: float
    provisioning_delay: Any
    replace: bool
    replace_at: str
    cluster_id: str

    def share_with(self, other: SharedSettings) -> None:
        """Set these settings on ``other`` (a cluster)."""
        for f in fields(SharedSettings):
            setattr(other, f.name, getattr(self, f.name))


@dataclass
class ClusterSettings(SharedSettings):
    """Every setting of a cluster, checked (see :meth:`from_arguments`)."""

    name: str
    mix: Mix
    fallback_zones: list[str]
    fallback_gpus: list[str]
    backend_name: str
    on_demand_fallback: bool
    seed: Any
    run_dir: str
    backend_options: dict[str, Any] = field(default_factory=dict)
    #: The machine type of a head VM that hosts the first PS host (a detached GCE cluster): that
    #: host is billed as the head VM. None: no head VM (an attached cluster, the local backend).
    head_machine_type: str | None = None

    @classmethod
    def from_arguments(
        cls,
        workers: int | str | Mapping[str, int] | None = None,
        gpu: str | None = None,
        spot: bool | None = None,
        zone: str | None = None,
        *,
        preemption: str | None = None,
        time_scale: float | None = None,
        backend: str | None = None,
        name: str | None = None,
        machine_type: str | None = None,
        ps_machine_type: str | None = None,
        ps_hosts: int | None = None,
        prices: str | PriceCatalog | None = None,
        notice: str | float | None = None,
        provisioning_delay: str | float | None = None,
        fallback_zones: Sequence[str] | None = None,
        fallback_gpus: Sequence[str] | None = None,
        replace: bool | None = None,
        replace_at: str | None = None,
        on_demand_fallback: bool | None = None,
        max_workers: int | None = None,
        max_hourly_cost: float | None = None,
        budget: float | None = None,
        deadline: str | float | None = None,
        join_timeout: str | float | None = None,
        seed: int | None = None,
        run_dir: str | None = None,
        cluster_id: str | None = None,
        **backend_options: Any,
    ) -> ClusterSettings:
        """Check a cluster's arguments (those of :class:`~transient_nb.TransientCluster`).

        Nothing is started, created or asked of a provider; the name must be free in the
        registry. Raises a ``ValueError`` naming the first bad value.

        Examples
        --------
        >>> s = ClusterSettings.from_arguments(workers="k80=2,v100=1", prices="paper-2019")
        >>> s.mix, s.gpu, s.zones
        ({'k80': 2, 'v100': 1}, 'k80', ['us-central1-a'])
        """
        mix, main = _mix_of(workers, gpu)
        limits = Limits.from_config(
            max_workers=max_workers,
            max_hourly_cost=max_hourly_cost,
            budget=budget,
            deadline=deadline,
            join_timeout=join_timeout,
        )
        limits.check_workers(sum(mix.values()))
        zone = str(config.get("zone", override_with=zone))
        machine = str(config.get("machine-type", override_with=machine_type))
        ps_machine = str(config.get("ps-machine-type", override_with=ps_machine_type))
        catalog = prices if isinstance(prices, PriceCatalog) else PriceCatalog.load(prices)
        zones_ = list(config.get("replacement.fallback-zones", override_with=fallback_zones))
        gpus_ = list(config.get("replacement.fallback-gpus", override_with=fallback_gpus))
        _check_prices(catalog, mix, machine, ps_machine, zone, zones_, gpus_)
        head_machine = None
        if backend_options.get("head"):
            # On the head VM (gce): the first PS host is the head VM, billed as its machine type.
            head_machine = head_machine_type(backend_options.get("head_machine_type"), ps_machine)
            catalog.machine_price(head_machine, zone)
        model = _preemption(preemption, [zone, *zones_])
        scale = float(config.get("time-scale", override_with=time_scale))
        backend_name = str(config.get("backend", override_with=backend))
        _check_clock(scale, time_scale, backend_name)
        at = config.get("replacement.at", override_with=replace_at)
        if replace_at is None and backend_name == "gce":
            # GCE gives 30 s of notice and a new VM takes 80-100 s to boot: ask at the notice.
            at = config.get("gce.replace-at")
        if at not in REPLACE_AT:
            what = (
                "replace_at"
                if replace_at is not None or backend_name != "gce"
                else "gce.replace-at"
            )
            raise ValueError(f"{what}={at!r}: use 'preempted', 'notice' or 'ahead'.")
        name = check_name(name or f"transient-{uuid.uuid4().hex[:6]}")
        registry.check_free(name)
        return cls(
            name=name,
            mix=mix,
            gpu=main,
            limits=limits,
            spot=bool(config.get("spot", override_with=spot)),
            zone=zone,
            machine_type=machine,
            ps_machine_type=ps_machine,
            ps_hosts=positive_int(config.get("ps-hosts", override_with=ps_hosts), "ps_hosts"),
            catalog=catalog,
            fallback_zones=zones_,
            fallback_gpus=gpus_,
            preemption=model,
            time_scale=scale,
            backend_name=backend_name,
            notice_s=_notice_s(config.get("notice", override_with=notice)),
            provisioning_delay=validate_delay(
                config.get("provisioning-delay", override_with=provisioning_delay)
            ),
            replace=bool(config.get("replacement.enabled", override_with=replace)),
            replace_at=str(at),
            on_demand_fallback=bool(
                config.get("replacement.on-demand-fallback", override_with=on_demand_fallback)
            ),
            seed=config.get("seed", override_with=seed),
            run_dir=os.path.expanduser(config.get("run-dir", override_with=run_dir)),
            # Every cloud resource the cluster creates carries it (a label); close() and sweep
            # delete only what carries it. A head VM's comes from the client that made it.
            cluster_id=str(cluster_id or uuid.uuid4().hex[:12]),
            backend_options=dict(backend_options),
            head_machine_type=head_machine,
        )

    # -- what the cluster is made of ---------------------------------------------------------------
    @property
    def zones(self) -> list[str]:
        """The zone, then the fallback zones."""
        return [self.zone, *self.fallback_zones]

    def replacement_policy(self) -> ReplacementPolicy:
        """Where new and replacement workers go (its clock is simulated: ``time_scale``)."""
        return ReplacementPolicy(
            self.gpu,
            self.zone,
            self.spot,
            fallback_zones=self.fallback_zones,
            fallback_gpus=self.fallback_gpus,
            stockout_memory_s=_seconds("replacement.stockout-memory"),
            on_demand_fallback=self.on_demand_fallback,
            preemption_limit=int(config.get("replacement.preemption-limit")),
            preemption_window_s=_seconds("replacement.preemption-window") / self.time_scale,
        )

    @property
    def tls_lifetime_s(self) -> float | None:
        """How long the cluster's certificates live: its deadline and an hour (no certificate
        outlives the cluster); None without a deadline (``transient.tls-lifetime``)."""
        if self.limits.deadline_s is None:
            return None
        return self.limits.deadline_s + 3600.0

    def make_backend(self, log_dir: str | None = None) -> Backend:
        """The backend object (nothing is asked of its provider yet)."""
        options = {"tls_lifetime": self.tls_lifetime_s, **self.backend_options}
        return get_backend(self.backend_name, log_dir=log_dir, **options)

    def preparation(self) -> Preparation:
        """What the backend's ``prepare`` checks against its provider."""
        return Preparation(
            gpus=[*self.mix, *[g for g in self.fallback_gpus if g not in self.mix]],
            zones=self.zones,
            machine_type=self.machine_type,
            ps_machine_type=self.ps_machine_type,
            notice_s=self.notice_s / self.time_scale,
            cluster_id=self.cluster_id,
            asked_gpus=len(self.mix),
        )

    def check(self, backend: Backend | None = None) -> Backend:
        """The backend's own checks against its provider (GCE: project, zones, machine and GPU
        types, image); blocking. Returns the backend, ready to start the cluster."""
        backend = backend or self.make_backend()
        backend.prepare(self.name, self.preparation())
        return backend

    # -- money ----------------------------------------------------------------------------------------
    def check_hourly_cost(
        self,
        policy: ReplacementPolicy,
        mix: Mix,
        on_demand: Mapping[str, int],
        ps_hosts: int | None = None,
        limits: Limits | None = None,
    ) -> None:
        """Refuse a mix (with its on-demand share and the PS hosts) that could cost more per
        hour than ``max_hourly_cost``, at the dearest placement ``policy`` may pick for each
        worker (a fallback GPU, zone, or on demand), with the PS hosts (the first one priced as
        the head VM where it runs on one, :attr:`head_machine_type`). ``limits``: the
        cluster's now, if not these settings' own."""
        limits = self.limits if limits is None else limits
        if limits.max_hourly_cost is None:
            return
        n = sum(mix.values())
        hourly = 0.0
        for gpu, count in mix.items():
            dear = min(count, on_demand.get(gpu, 0))
            for share, first in ((count - dear, False), (dear, True)):
                if not share:
                    continue
                rates = []
                for p in policy.placements(gpu, on_demand_first=first):
                    try:
                        price = self.catalog.worker_price(p.gpu, self.machine_type, p.zone)
                    except ValueError:  # a pair the catalog does not price cannot be bought
                        continue
                    rates.append(price.rate(p.spot))
                hourly += share * max(rates)
        hosts = self.ps_hosts if ps_hosts is None else ps_hosts
        ps, what = self._hosts_hourly(policy, hosts)
        if n == 0:
            limits.check_hourly_cost(0, 0.0, ps, what)
            return
        # The mean over the mix: n times it is the mix's dearest hourly cost.
        limits.check_hourly_cost(n, hourly / n, ps, what)

    def _hosts_hourly(self, policy: ReplacementPolicy, hosts: int) -> tuple[float, str]:
        """What ``hosts`` PS hosts cost per hour at their dearest zone, the first one priced as
        the head VM where it runs on one, and how to name them."""
        ps = max(
            self.catalog.machine_price(self.ps_machine_type, z).rate(False) for z in policy.zones()
        )
        if self.head_machine_type is None or hosts < 1:
            return ps * hosts, "the PS hosts"
        head = self.catalog.machine_price(self.head_machine_type, self.zone).rate(False)
        what = "the head VM" if hosts == 1 else "the head VM and the other PS hosts"
        return head + ps * (hosts - 1), what


def head_machine_type(given: str | None, ps_machine_type: str) -> str:
    """The machine type of a detached GCE cluster's head VM: ``given``, else
    ``gce.head-machine-type``, else the PS machine type (the paper's PS/scheduler host).

    Examples
    --------
    >>> head_machine_type(None, "n1-standard-4"), head_machine_type("e2-small", "n1-standard-4")
    ('n1-standard-4', 'e2-small')
    """
    return str(config.get("gce.head-machine-type", override_with=given) or ps_machine_type)


def _mix_of(workers: Any, gpu: str | None) -> tuple[Mix, str]:
    """The mix of GPU types asked for, and the cluster's main type."""
    asked = config.get("workers", override_with=workers)
    main = str(config.get("gpu", override_with=gpu))
    if isinstance(asked, int) and not isinstance(asked, bool):
        positive_int(asked, "workers")
        return {main: asked}, main  # the type exactly as given, as before mixes
    mix = parse_mix(asked, main)
    if gpu is not None and gpu.lower() not in mix:
        raise ValueError(
            f"gpu={gpu!r} is not in workers={format_mix(mix)!r}: drop gpu, or add it to the mix."
        )
    return mix, gpu.lower() if gpu is not None else next(iter(mix))


def _check_prices(
    catalog: PriceCatalog,
    mix: Mix,
    machine: str,
    ps_machine: str,
    zone: str,
    fallback_zones: Sequence[str],
    fallback_gpus: Sequence[str],
) -> None:
    """A type or machine the catalog cannot price cannot be billed either: refuse it now."""
    for z in (zone, *fallback_zones):
        for g in mix:
            catalog.worker_price(g, machine, z)
    catalog.machine_price(ps_machine, zone)
    for g in fallback_gpus:
        catalog.gpu_price(g, zone)


def _preemption(spec: Any, zones: Sequence[str]) -> PreemptionModel:
    model = parse_preemption(config.get("preemption", override_with=spec))
    named = [z for z, _ in getattr(model, "zones", ())]
    unknown = [z for z in named if z not in zones]
    if unknown:
        # A zone the cluster never places a worker in would make its model silently moot.
        raise ValueError(
            f"preemption={model.spec!r} names zone {unknown[0]!r}, where this cluster places no "
            f"worker: its zones are {', '.join(zones)} (add it to fallback_zones, or correct the "
            "name)."
        )
    return model


def _check_clock(scale: float, given: Any, backend_name: str) -> None:
    if not scale > 0:
        raise ValueError(f"time_scale={given!r} must be positive (simulated seconds per second).")
    if backend_name != "local" and scale != 1:
        # Real VMs bill real seconds: a scaled clock would multiply the bill and shrink the
        # notice handed to the VMs.
        raise ValueError(
            f"time_scale={scale:g} is only for the local backend's simulations: "
            f"backend={backend_name!r} runs in real time; drop time_scale (or set it to 1)."
        )


def _notice_s(notice: Any) -> float:
    try:
        seconds = parse_timedelta(notice, default="seconds")
    except (ValueError, TypeError, KeyError):  # e.g. "-5s": dask's own message names nothing
        seconds = None
    if seconds is None or seconds < 0:
        raise ValueError(f"notice={notice!r} must be a non-negative duration such as '30s'.")
    return float(seconds)
