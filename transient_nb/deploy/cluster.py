"""TransientCluster: a Dask cluster of preemptible GPU workers that replaces what it loses.

One cluster class, two backends (decision 2 of the architecture): ``TransientCluster`` is a
:class:`distributed.SpecCluster` whose VMs come from a backend (local processes, or GCE VMs);
preemption, replacement and cost logic is written once, here, above the backends.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import random
import uuid
from typing import Any

import dask.config
from dask.utils import parse_timedelta
from distributed import Scheduler
from distributed.core import Status

from transient_nb import config
from transient_nb.backends.base import dask_settings
from transient_nb.backends.simulator import PreemptionSimulator
from transient_nb.catalog.mix import Mix, format_mix
from transient_nb.deploy import registry
from transient_nb.deploy.control import Control
from transient_nb.deploy.guard import RoleGuard
from transient_nb.deploy.monitor import TransientMonitor
from transient_nb.deploy.settings import (
    ClusterSettings,
    is_detached,
)

logger = logging.getLogger(__name__)


def _scheduler(**options: Any) -> Scheduler:
    """The cluster's scheduler, built under ``transient.cluster-dask`` (a server reads its
    event-loop check and system monitor intervals when it is built); the settings of the rest of
    this process (the user's kernel) stay as they are."""
    with dask.config.set(dask_settings()):
        return Scheduler(**options)


async def _dismiss_clients(scheduler: Scheduler, timeout: float = 5.0) -> None:
    """Tell every client of ``scheduler`` that the cluster is closing, before it closes.

    A closing scheduler aborts its clients' streams, and each client then tries to reconnect.
    One that dials while the listener goes can fail with an error distributed does not retry
    (tornado's "IOStream is not idle; cannot convert to SSL", a ``ValueError``): the client's
    ``close()`` raised it, and ``transient-nb down`` failed in CI. A ``close`` message ends a
    client's report stream the way the scheduler ends it for a client that leaves: no reconnect.
    """
    comms = [c for c in list(scheduler.client_comms.values()) if not c.closed()]
    for comm in comms:
        comm.send({"op": "close", "reason": "cluster-closed"})
    try:
        # Flushed, then closed; a client that does not read in time is aborted by the close.
        await asyncio.wait_for(
            asyncio.gather(*(c.close() for c in comms), return_exceptions=True), timeout
        )
    except asyncio.TimeoutError:
        logger.debug("%d client(s) did not take the cluster's goodbye in %g s", len(comms), timeout)


class TransientCluster(Control):
    """A Dask cluster of preemptible (Spot) GPU workers plus a never-preemptible PS host.

    Workers are preempted (by the provider, by the local simulator, or by hand), replaced after a
    provisioning delay, and billed per second; every step is an event in the run's event log.

    Parameters
    ----------
    workers
        Number of preemptible GPU workers of type ``gpu`` (the PS host comes on top), or a mix
        of GPU types: ``{"k80": 2, "p100": 1, "v100": 1}`` (or the text ``"k80=2,p100=1,v100=1"``).
        Every type must have a price in ``prices``; a replacement keeps the type of the worker
        it replaces (with the same fallbacks as any other).
    gpu, spot, zone
        GPU type, Spot or on-demand, and zone of new workers. With a mix, ``gpu`` may be left
        out (the mix's first type is the cluster's main type) or must be one of the mix.
    preemption
        Preemption source of the local backend: ``"none"``, ``"paper:k80"`` (and ``p100``,
        ``v100``, ``cpu``), ``"paper"`` (each worker its own type's curve, K80's for types
        the paper did not measure), ``"exp:mean=60s"``, ``"trace:PATH"``.
    time_scale
        Simulated seconds per wall-clock second (120: an hour of the paper in 30 s). Lifetimes,
        notices and provisioning delays are simulated times; costs are billed in simulated time.
    backend
        ``"local"`` (default) or ``"gce"``.
    name
        Cluster name (lowercase letters, digits, dashes); a fresh one if not given.
    machine_type, ps_machine_type
        Machine types billed for workers (beside the GPU) and for the PS/scheduler host.
    ps_hosts
        Number of never-preemptible PS hosts (default 1). ``train(shards=N)`` places shard ``i``
        on host ``i % ps_hosts``: with as many hosts as shards, every shard has a process (and
        the host's cores) of its own, as in the paper's two-PS configuration.
    prices
        Price catalog name (``"gce-2025"``, ``"paper-2019"``), YAML path, or a ``PriceCatalog``.
    notice
        Preemption notice in simulated time (GCE: 30 s).
    provisioning_delay
        ``"paper"`` (81-98 s for Spot GPU VMs) or a duration, in simulated time.
    fallback_zones, fallback_gpus
        Where replacements go when the preferred zone or GPU type has no capacity.
    replace
        Replace preempted workers (default True).
    replace_at
        ``"preempted"`` or ``"notice"``: when a replacement is asked for; ``"ahead"``: as
        ``"preempted"``, and a spare is asked for ahead of a revocation the lifetime model
        predicts (:mod:`transient_nb.policy.spares`).
    max_workers, max_hourly_cost
        Refuse more workers than this, or workers that could cost more per hour (with the PS
        host, at the dearest placement allowed); checked before anything starts and on scale.
    budget, deadline
        Stop the cluster once it has spent this many dollars / after this long.
    join_timeout
        Delete and replace a VM whose worker has not joined this long after the VM runs.
    seed
        Seed of the simulator's draws.
    run_dir
        Folder under which this run's record goes.
    **backend_options
        Passed to the backend (local: ``stockouts``, ``nthreads``, ``cuda``, ``death_timeout``).

    Notes
    -----
    Why not SpecCluster's own reconciliation (``worker_spec`` -> ``_correct_state``)? It treats
    a worker spec as a process to (re)start under the same name as soon as it is missing, and
    ``scale(n)`` as "n specs". A transient cluster needs other semantics: a preempted VM is gone
    for good (its name is never reused, its bill ends, a replacement may go to another zone or GPU
    type), replacements wait out provisioning delays, stock-outs and backoffs, and the PS host is
    not a worker to count. So ``_mix`` (GPU type -> workers asked for; ``_target`` is their sum),
    ``_slots`` (slot -> the VM holding it, reserved while a request is in flight) and
    ``_slot_gpu`` (slot -> the type asked for in it) are the desired state, and
    ``_provision``/``_maybe_replace`` are the reconciliation: on every ``scale``, ``left`` and
    ``preempted`` event they ask the backend for the VMs that are missing, one slot at a time.
    ``worker_spec`` is still kept true (a spec per live VM), so that SpecCluster's ``close``,
    ``workers`` and repr see what really runs; ``_correct_state`` never has to start anything.

    Examples
    --------
    >>> from transient_nb import TransientCluster
    >>> cluster = TransientCluster(workers=2, preemption="exp:mean=60s")  # doctest: +SKIP
    >>> client = cluster.get_client()  # doctest: +SKIP
    >>> cluster.preempt(1)  # doctest: +SKIP
    >>> cluster.cost()  # doctest: +SKIP
    >>> cluster.close()  # doctest: +SKIP

    A mix of GPU types, scaled by type:

    >>> mixed = TransientCluster(
    ...     workers={"k80": 2, "p100": 1, "v100": 1}, prices="paper-2019"
    ... )  # doctest: +SKIP
    >>> mixed.scale(2, gpu="v100")  # doctest: +SKIP
    >>> mixed.cost().by_gpu  # doctest: +SKIP
    """

    def __new__(cls, *args: Any, detached: bool | None = None, **kwargs: Any) -> Any:
        # A detached cluster lives in a head of its own (a process, or GCE's head VM); what the
        # caller gets back is a RemoteCluster handle on it, so no TransientCluster is built here.
        if not is_detached(detached, kwargs.get("backend")):
            return super().__new__(cls)
        from transient_nb.deploy.detached import start_detached

        if kwargs.pop("asynchronous", False) or kwargs.pop("loop", None) is not None:
            raise ValueError(
                "detached=True gives a synchronous handle on a head process: drop "
                "asynchronous/loop, or use detached=False."
            )
        positional = ("workers", "gpu", "spot", "zone")
        if len(args) > len(positional):
            raise TypeError(
                f"TransientCluster takes at most {len(positional)} positional arguments"
            )
        kwargs.update(zip(positional, args, strict=False))
        name = kwargs.pop("name", None)
        return start_detached(kwargs, name=name)

    @staticmethod
    def check_settings(**kwargs: Any) -> ClusterSettings:
        """Check a cluster's arguments as ``__init__`` and the backend's ``prepare`` do.

        Nothing is started or created (the backend only looks settings up in its API). Returns
        the checked :class:`~transient_nb.deploy.settings.ClusterSettings`.
        """
        kwargs.pop("detached", None)
        settings = ClusterSettings.from_arguments(**kwargs)
        settings.check()
        return settings

    def __init__(
        self,
        *args: Any,
        asynchronous: bool = False,
        loop: Any = None,
        detached: bool | None = None,
        _head_info: dict[str, Any] | None = None,
        **kwargs: Any,
    ):
        # Everything is checked before anything starts: a mistake costs nothing. The arguments
        # are ClusterSettings.from_arguments's (and the backend's options).
        cluster_id = (_head_info or {}).get("cluster_id")
        s = ClusterSettings.from_arguments(*args, cluster_id=cluster_id, **kwargs)
        self.settings = s
        s.share_with(self)
        #: GPU type -> workers of that type asked for (the desired state; see Notes).
        self._mix: Mix = dict(s.mix)
        #: GPU type -> how many of its workers run on demand (the rest Spot), set by ``scale``.
        self._on_demand: dict[str, int] = {}
        self.placement = s.replacement_policy()
        s.check_hourly_cost(self.placement, self._mix, self._on_demand)
        self._backoff_s = float(
            parse_timedelta(config.get("replacement.crash-backoff"), default="seconds") or 0
        )
        self._backoff_max_s = float(
            parse_timedelta(config.get("replacement.crash-backoff-max"), default="seconds") or 0
        )
        self._rng = random.Random(s.seed)
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        self.run_path = os.path.join(s.run_dir, f"{s.name}-{stamp}-{uuid.uuid4().hex[:4]}")
        self.run_record = os.path.join(self.run_path, "events.jsonl")
        self.backend = s.make_backend(log_dir=os.path.join(self.run_path, "logs"))
        #: Registry fields of a cluster that a head process owns (``detached``).
        self._head_info = dict(_head_info or {})
        self._init_state()
        super().__init__(
            workers={},
            scheduler=self._scheduler_spec(),
            asynchronous=asynchronous,
            loop=loop,
            name=s.name,
            security=self.backend.security,
        )

    def _init_state(self) -> None:
        """The runtime state: slots, VMs asked for, spares, PS moves, failures."""
        #: The slots being asked for on demand now.
        self._on_demand_slots: set[int] = set()
        #: The zone the PS is being moved to (move_ps), until its old hosts are gone; else None.
        self.ps_move_zone: str | None = None
        #: The new PS hosts of a move under way, until the run has moved onto them; and those
        #: of them lost meanwhile (not replaced: the move fails, the PS stays where it is).
        self._ps_move_hosts: set[str] = set()
        self._ps_move_lost: list[str] = []
        #: Control actions beyond scale/preempt/stop: action -> callable(msg) run in a thread,
        #: whose dict goes into the answer (the head adds ``train`` and ``run-stop``).
        self.control_handlers: dict[str, Any] = {}
        #: Callables run (in a thread) first thing when the cluster closes, e.g. stopping runs.
        self.close_hooks: list[Any] = []
        self.monitor = TransientMonitor(self.run_record)
        self.monitor.on_control = self._on_control
        self.simulator = PreemptionSimulator(
            self.preemption, self.time_scale, self._preempt_one, self._slot_holder, self._rng
        )
        self.monitor.on_membership = self._membership
        self._counter = {"worker": 0, "ps": 0}
        self._slots: dict[int, str] = {}
        #: Slot -> the GPU type asked for in it: a replacement asks for the same type (it may
        #: land on a fallback type, but it still fills its slot's type in the mix).
        self._slot_gpu: dict[int, str] = {}
        self._tasks: set[asyncio.Future[Any]] = set()
        self._closing = False
        #: VMs whose worker joined at least once (a VM lost before that failed to start).
        self._joined: set[str] = set()
        # Spares (replace_at="ahead"): the workers that have one, the slots of those still being
        # asked for, and how long new workers took from being asked for to joining (wall s).
        self._spared: set[str] = set()
        self._spare_slots: set[int] = set()
        self._asked_at: dict[str, float] = {}
        #: VMs being asked for now (their insert under way): the limits count them.
        self._asking: dict[str, Any] = {}
        self._join_waits: list[float] = []
        self._last_failure = ""
        #: The first PS host was placed: from then on, a PS host that cannot be placed is asked
        #: for again later (at start, the cluster refuses to start instead).
        self._started_once = False
        #: Start failures in a row (crash on start, no join, failed request): the backoff's power.
        self._failures = 0

    def _scheduler_spec(self) -> dict[str, Any]:
        return {
            "cls": _scheduler,
            "options": {
                "host": "127.0.0.1",
                "port": 0,
                "dashboard_address": "127.0.0.1:0",
                # The guard last: it guards the handlers the monitor added too.
                "plugins": [self.monitor, RoleGuard(getattr(self.backend, "ca", None))],
                # Cloud backends: TLS, and an interface the VMs can reach.
                **self.backend.scheduler_options(),
            },
        }

    # -- start and close ---------------------------------------------------------------------------
    async def _start(self) -> None:
        if self.status in (Status.running, Status.starting):
            return await super()._start()
        # Before the scheduler or any VM exists, in a thread: a bad setting raises here with
        # nothing to clean up, and an asynchronous cluster's event loop is never blocked.
        await asyncio.to_thread(self.settings.check, self.backend)
        self.placement.not_offered |= self.backend.not_offered()  # where to go is the policy's call
        await super()._start()
        self._log(self.backend.describe())
        await self._post(
            "started",
            cluster=self.name,
            backend=self.backend.name,
            time_scale=self.time_scale,
            catalog=self.catalog.name,
            catalog_date=self.catalog.date,
            preemption=self.preemption.spec,
            gpu=self.gpu,
            zone=self.zone,
            zones=self._zones(),  # where it may go: the panel offers them for a PS move
            spot=self.spot,
            workers=self._target,
            mix=dict(self._mix),
            notice_s=self.notice_s,
            run_record=self.run_record,
            scheduler_address=self.scheduler_address,
        )
        registry.register(
            self.name,
            {
                "backend": self.backend.name,
                "scheduler_address": self.scheduler_address,
                "dashboard_link": self.dashboard_link,
                "run_record": self.run_record,
                "cluster_id": self.cluster_id,
                # Paths (0600 files) of a client certificate for this user's other processes:
                # connect() and the JupyterLab panel. None without TLS.
                "tls": self.backend.client_tls_files(registry.tls_folder(self.name)),
                "gpu": self.gpu,
                "mix": format_mix(self._mix),
                "zone": self.zone,
                "spot": self.spot,
                "ps_hosts": self.ps_hosts,
                "run_path": self.run_path,
                "detached": False,
                **self._head_info,
            },
        )
        try:
            await self.backend.start(self.scheduler_address)  # e.g. GCE's firewall rule
        except BaseException:
            # Refused (another's firewall rule of this name): the scheduler and the registry
            # entry go too, as for a PS host that cannot be placed below.
            await self._close()
            raise
        self._spawn(self._guard_limits())
        placed = await asyncio.gather(*(self._provision("ps") for _ in range(self.ps_hosts)))
        if any(p is None for p in placed):
            # Without its PS hosts no training can run: refuse to start, leave nothing behind.
            why = self._last_failure or "no capacity in any allowed zone"
            await self._close()
            raise RuntimeError(
                f"Cluster {self.name} cannot start: no zone could place its PS host "
                f"({self.ps_machine_type} in {', '.join(self._zones())}): {why}. Nothing was "
                "left running. Add fallback_zones, pick another ps_machine_type, or try later."
            )
        self._started_once = True
        self.simulator.start()
        if self.replace_at == "ahead" and self.replace:
            self._spawn(self._spare_ahead())
        await asyncio.gather(
            *(self._provision("worker", gpu=g) for g, n in self._mix.items() for _ in range(n))
        )

    async def _close(self) -> None:
        if self.status not in (Status.running, Status.failed) or self._closing:
            # A close racing another one (e.g. a budget stop) waits for the backend's cleanup.
            await self.backend.close()
            return await super()._close()
        self._closing = True
        for hook in self.close_hooks:
            try:
                await asyncio.to_thread(hook)
            except Exception:
                logger.exception("A close hook of %s failed", self.name)
        self.simulator.stop()
        for t in list(self._tasks):
            if t is not asyncio.current_task():  # a "stop" control request closes from a task
                t.cancel()
        self.worker_spec.clear()
        try:
            if self.scheduler is not None and self.scheduler.status == Status.running:
                await self._correct_state()
                await self._post("closed", cluster=self.name)
                await _dismiss_clients(self.scheduler)
        finally:
            registry.unregister(self.name)
            try:
                # VMs still being created, then cluster-wide resources (GCE's firewall rule).
                await self.backend.close()
            finally:
                await super()._close()
