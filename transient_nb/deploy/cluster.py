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
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, cast

import pandas as pd
from dask.utils import parse_timedelta
from distributed import Scheduler
from distributed.core import Status
from distributed.deploy.spec import SpecCluster
from distributed.utils import NoOpAwaitable

from transient_nb import config
from transient_nb.backends import CapacityError, QuotaError, TransientVM, VMSpec
from transient_nb.backends.simulator import PreemptionSimulator
from transient_nb.catalog.lifetimes import (
    PAPER_STARTUP_S,
    parse_delay,
)
from transient_nb.catalog.mix import Mix, format_mix, parse_mix
from transient_nb.deploy import registry
from transient_nb.deploy.monitor import TransientMonitor
from transient_nb.deploy.settings import (
    ClusterSettings,
    is_detached,
    positive_int,
)
from transient_nb.eventlog.bill import CostReport, compute_costs
from transient_nb.eventlog.folds import vm_states
from transient_nb.eventlog.records import events_frame
from transient_nb.eventlog.vocabulary import TOPIC, make_event
from transient_nb.policy.placement import Placement
from transient_nb.policy.spares import JOIN_S, due_for_spare

logger = logging.getLogger(__name__)

#: Most PS hosts a cluster may grow to (scale_ps): past two, the paper's PS gains little.
MAX_PS_HOSTS = 4


class TransientCluster(SpecCluster):
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
        self.gpu, self.limits, self.spot, self.zone = s.gpu, s.limits, s.spot, s.zone
        self.machine_type, self.ps_machine_type = s.machine_type, s.ps_machine_type
        self.ps_hosts, self.catalog, self.preemption = s.ps_hosts, s.catalog, s.preemption
        self.time_scale, self.notice_s = s.time_scale, s.notice_s
        self.provisioning_delay, self.replace, self.replace_at = (
            s.provisioning_delay,
            s.replace,
            s.replace_at,
        )
        self.cluster_id = s.cluster_id
        #: GPU type -> workers of that type asked for (the desired state; see Notes).
        self._mix: Mix = dict(s.mix)
        #: GPU type -> how many of its workers run on demand (the rest Spot), set by ``scale``.
        self._on_demand: dict[str, int] = {}
        self.policy = s.replacement_policy()
        s.check_hourly_cost(self.policy, self._mix, self._on_demand)
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
        self._join_waits: list[float] = []
        self._last_failure = ""
        #: The first PS host was placed: from then on, a PS host that cannot be placed is asked
        #: for again later (at start, the cluster refuses to start instead).
        self._started_once = False
        #: Start failures in a row (crash on start, no join, failed request): the backoff's power.
        self._failures = 0

    def _scheduler_spec(self) -> dict[str, Any]:
        return {
            "cls": Scheduler,
            "options": {
                "host": "127.0.0.1",
                "port": 0,
                "dashboard_address": "127.0.0.1:0",
                "plugins": [self.monitor],
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
        self.policy.not_offered |= self.backend.not_offered()  # where to go is the policy's call
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
                "tls": self.backend.client_tls_files(),
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
        await self.backend.start(self.scheduler_address)  # e.g. GCE's firewall rule
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
        finally:
            registry.unregister(self.name)
            try:
                # VMs still being created, then cluster-wide resources (GCE's firewall rule).
                await self.backend.close()
            finally:
                await super()._close()

    # -- control requests from other views (the JupyterLab panel) -------------------------------
    def _on_control(self, msg: dict[str, Any]) -> None:
        """Act on a control request posted on the scheduler (topic ``transient-control``)."""
        self._spawn(self._control(msg))

    async def _control(self, msg: dict[str, Any]) -> None:
        action = msg.get("action")
        if action == "provider-notice":
            # Only the monitor's check (the worker of the VM named, over its own connection)
            # lets this one through; see TransientMonitor.provider_notice.
            # A VM's own preemption notice (GCE: its metadata server), sent by its worker: the
            # same path as a simulated preemption, with no notice left to deliver.
            vm = self.workers.get(str(msg.get("vm")))
            if isinstance(vm, TransientVM) and not vm.stopped and not self._closing:
                vm.provider_notice = True
                await self._preempt_one(vm.name, True, str(msg.get("source", "provider")))
            return
        handler = self.control_handlers.get(str(action))
        if handler is not None:
            try:
                answer = await asyncio.to_thread(handler, msg)
            except Exception as e:
                await self._post(
                    "control", action=action, ok=False, error=str(e), request=msg.get("id")
                )
                return
            await self._post(
                "control", action=action, ok=True, request=msg.get("id"), **(answer or {})
            )
            return
        try:
            if action == "scale":
                workers = msg["workers"]
                if isinstance(workers, float):
                    workers = int(workers)
                # The on-demand share: a number (of the type a number counts, or the one type)
                # or GPU type -> number; scale checks it (and names a bad value).
                on_demand = msg.get("on_demand")
                if isinstance(on_demand, float) and on_demand.is_integer():
                    on_demand = int(on_demand)
                # A number, a mix ({"k80": 2} or "k80=2,v100=1"), and the type a number counts.
                self.scale(workers, gpu=msg.get("gpu") or None, on_demand=on_demand)
            elif action == "scale-ps":
                self.scale_ps(cast(int, msg.get("hosts")))  # scale_ps names a bad value
            elif action == "move-ps":
                # move_ps names a zone the cluster may not use, or a move already under way.
                self.move_ps(cast(str, msg.get("zone")), reason=str(msg.get("reason") or ""))
            elif action == "preempt":
                target = msg.get("worker") or int(msg.get("count", 1))
                await self._preempt(target, notice=bool(msg.get("notice", True)))
            elif action == "adapt":
                goal = msg.get("goal")
                self.adapt(None if goal is None else str(goal), **dict(msg.get("args") or {}))
            elif action == "stop":
                await self._post("control", action="stop", ok=True, request=msg.get("id"))
                self._spawn(self._close())
                return
            else:
                raise ValueError(f"unknown action {action!r}")
            await self._post("control", action=action, ok=True, request=msg.get("id"))
        except Exception as e:
            await self._post(
                "control", action=action, ok=False, error=str(e), request=msg.get("id")
            )

    # -- money and time limits (transient_nb.limits: one place for every backend) ----------------
    def _check_hourly_cost(self, mix: Mix, on_demand: Mix | None = None) -> None:
        self.settings.check_hourly_cost(
            self.policy,
            mix,
            self._on_demand if on_demand is None else on_demand,
            self.ps_hosts,
            self.limits,
        )

    async def _guard_limits(self) -> None:
        budget, deadline_s = self.limits.budget, self.limits.deadline_s
        if budget is None and deadline_s is None:
            return
        t0 = time.monotonic()
        while not self._closing:
            spent = self.cost().total
            reason = None
            reached = self.limits.reached(spent, time.monotonic() - t0)
            if reached == "budget":
                reason = f"budget of ${budget:.2f} spent (${spent:.4f})"
            elif reached == "deadline":
                reason = f"deadline of {deadline_s:g} s reached"
            if reason is not None:
                await self._post(
                    "limit-reached", reason=reason, cost=spent, budget=budget, deadline_s=deadline_s
                )
                self._log(f"Stopping cluster {self.name}: {reason}")
                self._spawn(self._close())
                return
            await asyncio.sleep(1.0)

    # -- events ----------------------------------------------------------------------------------------
    async def _post(self, kind: str, **fields: Any) -> None:
        msg = make_event(kind, **fields)
        if isinstance(self.scheduler, Scheduler):
            # In-process scheduler: a direct call keeps events in exactly the order they happen.
            self.scheduler.log_event(TOPIC, msg)
        else:  # pragma: no cover - remote schedulers (cloud backends)
            assert self.scheduler_comm is not None
            await self.scheduler_comm.log_event(topic=TOPIC, msg=msg)

    async def _events(self) -> list[dict[str, Any]]:
        assert self.scheduler_comm is not None, "the cluster has not started"
        return list(await self.scheduler_comm.transient_events())

    def events(self) -> pd.DataFrame:
        """Every event of this run so far, in order, as a DataFrame."""
        if self.asynchronous:
            return self._events_async()
        return events_frame(self.sync(self._events))

    async def _events_async(self) -> pd.DataFrame:
        return events_frame(await self._events())

    def cost(self) -> CostReport:
        """Money spent so far, per VM and in total, beside the on-demand counterfactual."""
        events = self.monitor.events if self.scheduler is not None else []
        return compute_costs(
            list(events), minimum_s=self.catalog.minimum_s, time_scale=self.time_scale
        )

    def vms(self) -> pd.DataFrame:
        """Every VM of the run with its lifecycle state and time in state."""
        return vm_states(list(self.monitor.events))

    # -- provisioning and replacement ---------------------------------------------------------------
    def _next_name(self, role: str) -> str:
        i = self._counter[role]
        self._counter[role] += 1
        return f"w-{i}" if role == "worker" else f"ps-{i}"

    @property
    def _target(self) -> int:
        """Workers asked for, of all types."""
        return sum(self._mix.values())

    @property
    def mix(self) -> Mix:
        """GPU type -> number of workers of that type the cluster keeps (a copy)."""
        return dict(self._mix)

    @property
    def on_demand(self) -> Mix:
        """GPU type -> how many of the mix's workers of that type run on demand (a copy; types
        with none left out). The rest are Spot, on a Spot cluster."""
        return {g: n for g, n in self._on_demand.items() if n > 0}

    def _on_demand_held(self, gpu: str) -> int:
        """On-demand workers of ``gpu`` live or being asked for."""
        live = sum(1 for w in self._worker_vms_of(gpu) if not w.spec.spot)
        asking = sum(
            1
            for s in self._on_demand_slots
            if self._slots.get(s) == "" and self._slot_gpu.get(s) == gpu
        )
        return live + asking

    def _asked_gpu(self, vm: TransientVM) -> str:
        """The type ``vm`` was asked for (its slot's), which a fallback may differ from."""
        slot = vm.spec.slot
        if slot is not None and slot in self._slot_gpu:
            return self._slot_gpu[slot]
        return vm.spec.gpu or self.gpu

    def _worker_vms_of(self, gpu: str, exclude: TransientVM | None = None) -> list[TransientVM]:
        """Live worker VMs asked for as ``gpu`` (``exclude``, one at its notice, left out)."""
        return [
            w
            for w in self.workers.values()
            if w.spec.role == "worker"
            and w is not exclude
            and not w.stopped
            and self._asked_gpu(w) == gpu
        ]

    def _live_workers(self, gpu: str, exclude: TransientVM | None = None) -> int:
        """How many live worker VMs are asked for as ``gpu`` (``exclude`` not counted)."""
        return len(self._worker_vms_of(gpu, exclude))

    def _free_slot(self) -> int:
        used = set(self._slots)
        return next(i for i in range(len(used) + 1) if i not in used)

    def _slot_holder(self, slot: int) -> str | None:
        return self._slots.get(slot)

    def _delay(self, spot: bool) -> float:
        return parse_delay(self.provisioning_delay, spot=spot, rng=self._rng) / self.time_scale

    def _make_vm(self, spec: VMSpec) -> TransientVM:
        assert self.scheduler is not None
        return self.backend.make_vm(
            spec,
            scheduler_address=self.scheduler.address,
            post=self._post,
            on_running=self._vm_running,
            on_exit=self._vm_exited,
            delay_s=self._delay(spec.spot),
            connection_args=self.security.get_connection_args("client"),
        )

    def _zones(self) -> list[str]:
        return self.policy.zones()

    def _spec(self, role: str, name: str, p: Placement, slot: int | None) -> VMSpec:
        if role == "ps":
            price = self.catalog.machine_price(self.ps_machine_type, p.zone)
            return VMSpec(
                name, "ps", None, p.zone, False, self.ps_machine_type, price, None, {"ps": 1}
            )
        price = self.catalog.worker_price(p.gpu, self.machine_type, p.zone)
        return VMSpec(
            name, "worker", p.gpu, p.zone, p.spot, self.machine_type, price, slot, {"gpu": 1}
        )

    async def _provision(
        self, role: str, slot: int | None = None, gpu: str | None = None, zone: str | None = None
    ) -> str | None:
        """Ask the backend for one VM, trying the policy's placements in order.

        The PS host tries the preferred zone and then the fallback zones too. Whatever goes
        wrong, the worker's slot is released (so that ``scale`` and replacements can fill it
        again), and a failure that is not a stock-out is retried after a growing pause.
        """
        if role == "ps":
            # In ``zone`` only (a move: elsewhere would be no move), else where the PS runs
            # first (its first host's zone, or where it was moved), then the other zones.
            home = self.policy.ps_zone or self.zone
            zones = [zone] if zone else list(dict.fromkeys([home, *self._zones()]))
            placements = [Placement("", z, False) for z in zones]
        else:
            slot = self._free_slot() if slot is None else slot
            gpu = gpu or self._slot_gpu.get(slot) or self.gpu
            self._slot_gpu[slot] = gpu
            # On demand while the type has fewer on-demand workers than asked for (a Spot
            # cluster's on-demand share, from scale(on_demand=...)).
            on_demand = self.spot and self._on_demand_held(gpu) < self._on_demand.get(gpu, 0)
            placements = list(self.policy.candidates(gpu, on_demand_first=on_demand))
            self._slots[slot] = ""  # reserved while we ask
            if on_demand:
                self._on_demand_slots.add(slot)
        self._last_failure = ""
        skip_regions: set[str] = set()
        failed = False
        try:
            for p in placements:
                if self._closing:
                    break
                region = p.zone.rsplit("-", 1)[0]
                if region in skip_regions or "global" in skip_regions:
                    continue
                name = self._next_name(role)
                asked_at = time.time()
                spec = self._spec(role, name, p, slot)
                vm = self._make_vm(spec)
                try:
                    await vm.start()
                except QuotaError as e:
                    # A quota is not a stock-out: waiting does not help, and the other zones of
                    # its region (every region, for GPUS_ALL_REGIONS) share it.
                    skip_regions.add(e.region)
                    self._last_failure = str(e)
                    await self._post(
                        "quota-exceeded",
                        worker=name,
                        role=role,
                        gpu=p.gpu or None,
                        zone=p.zone,
                        quota=e.quota,
                        region=e.region,
                        limit=e.limit,
                        message=str(e),
                    )
                    self._log(str(e))
                    continue
                except CapacityError as e:
                    if role == "worker":
                        self.policy.remember_stockout(p)
                    self._last_failure = f"{p.zone}: {e.reason}"
                    await self._post(
                        "stockout", worker=name, gpu=p.gpu or None, zone=p.zone, reason=e.reason
                    )
                    what = f"{p.gpu} capacity" if p.gpu else f"{self.ps_machine_type} capacity"
                    self._log(f"{p.zone} has no {what}; trying the next placement")
                    continue
                except asyncio.CancelledError:
                    raise
                except Exception as e:
                    # Not the zone's fault (a request that failed after its retries, a name
                    # someone else holds): the next placement would likely fail the same way.
                    failed = True
                    self._last_failure = str(e)
                    await self._post(
                        "provision-failed", worker=name, role=role, zone=p.zone, error=str(e)
                    )
                    self._log(f"Could not create {role} VM {name}: {e}")
                    break
                if role == "ps" and not any(
                    w.spec.role == "ps" and not w.stopped for w in self.workers.values()
                ):
                    # The PS's first host: replacements go near it first (its region).
                    self.policy.ps_zone = p.zone
                self.worker_spec[name] = {"cls": type(vm), "options": {"spec": spec}}
                self.workers[name] = vm
                self._asked_at[name] = asked_at
                if slot is not None:
                    self._slots[slot] = name
                return name
        finally:
            # Whatever happened (an exception included), an unfilled reservation goes.
            if slot is not None:
                self._on_demand_slots.discard(slot)
                if self._slots.get(slot) == "":
                    del self._slots[slot]
        if self._closing:
            return None
        if failed:
            if role == "worker":
                self._spawn(self._retry_later(role, slot, "its request failed"))
            return None
        await self._post(
            "capacity-exhausted",
            role=role,
            gpu=gpu if role == "worker" else None,
            zone=self.zone,
            reason=self._last_failure,
        )
        if role == "ps" and self._started_once and zone is None:
            # A run cannot go on without its PS host: keep asking, with a growing pause.
            self._spawn(self._retry_later(role, None, "no zone could place the PS host"))
        if skip_regions:
            self._log(f"No {role} VM could be created: a quota is used up ({self._last_failure})")
        else:
            self._log(
                f"No capacity left for a {role} in any allowed zone or GPU type; the cluster "
                "runs with fewer workers. Add fallback_zones/fallback_gpus, or allow on-demand."
            )
        return None

    def _backoff(self) -> float:
        """Pause before the next attempt after ``self._failures`` start failures in a row."""
        if self._failures <= 0:
            return 0.0
        return float(min(self._backoff_max_s, self._backoff_s * 2 ** (self._failures - 1)))

    async def _retry_later(self, role: str, slot: int | None, why: str) -> None:
        """Ask again for a VM after a start failure, backing off while the failures go on."""
        self._failures += 1
        delay = self._backoff()
        if self._failures >= 2:
            await self._post(
                "crash-loop", role=role, failures=self._failures, delay_s=delay, reason=why
            )
            self._log(
                f"{self._failures} {role} VMs in a row failed ({why}); the next attempt is in "
                f"{delay:g} s. See the VM logs (the run folder; on GCE, the serial console)."
            )
        if slot is not None:
            self._slots[slot] = ""  # still reserved: scale() must not ask twice meanwhile
        try:
            await asyncio.sleep(delay)
        finally:
            if slot is not None and self._slots.get(slot) == "":
                del self._slots[slot]
        if self._closing:
            return
        gpu = self._slot_gpu.get(slot, self.gpu) if slot is not None else self.gpu
        if role == "worker" and self._live_workers(gpu) >= self._mix.get(gpu, 0):
            return
        await self._provision(role, slot=slot, gpu=gpu if role == "worker" else None)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Future[Any]) -> None:
        self._tasks.discard(task)
        # A background task's error is logged, never "Task exception was never retrieved".
        if not task.cancelled() and task.exception() is not None:
            logger.error(
                "Background task of cluster %s failed", self.name, exc_info=task.exception()
            )

    def _vm_running(self, vm: TransientVM) -> None:
        # Only a Spot VM has a lifetime to draw: the provider never revokes an on-demand one
        # (an on-demand fallback, or a share asked for with scale(on_demand=...)).
        if vm.spec.role == "worker" and vm.spec.spot:
            self.simulator.vm_running(vm.name, vm.spec.gpu, vm.spec.zone)
        self._spawn(self._join_watchdog(vm))

    def _membership(self, kind: str, name: str) -> None:
        """A worker joined or left the scheduler (called by the monitor)."""
        if kind == "joined":
            vm = self.workers.get(name)
            if isinstance(vm, TransientVM):
                vm.worker_left = False
                if vm.notice_deadline is not None:
                    self._spawn(vm.joined_during_notice())
            self._joined.add(name)
            self._failures = 0  # a VM that works ends a run of failures
            asked = self._asked_at.pop(name, None)
            if asked is not None:
                self._join_waits = [*self._join_waits[-4:], time.time() - asked]
        elif kind == "left":
            vm = self.workers.get(name)
            if isinstance(vm, TransientVM):
                vm.mark_left()

    async def _join_watchdog(self, vm: TransientVM) -> None:
        """Delete and replace a VM that runs but whose worker never joins (it would bill on)."""
        timeout = self.limits.join_timeout_s
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if vm.name in self._joined or vm.stopped or self._closing:
                return
            await asyncio.sleep(min(1.0, timeout / 20))
        if vm.name in self._joined or vm.stopped or self._closing or vm.name not in self.workers:
            return
        waited = time.monotonic() - t0
        # Billed from "running", with the provider's minimum: what the user paid for nothing.
        billed_s = max(waited * self.time_scale, self.catalog.minimum_s)
        cost = vm.spec.price.rate(vm.spec.spot) * billed_s / 3600
        await vm.post("join-timeout", waited_s=waited, cost=cost)
        self._log(
            f"VM {vm.name} ran {waited:.0f} s without its worker joining (about ${cost:.4f} "
            "spent on it); deleting it and asking for another. Check the image, the startup "
            "log and the firewall."
        )
        self._forget(vm)
        await vm.close()
        if self._lost_in_move(vm):
            return
        if vm.spec.role == "ps" or self.replace:
            await self._retry_later(vm.spec.role, vm.spec.slot, "its worker never joined")

    def _vm_exited(self, vm: TransientVM) -> None:
        # A VM that stopped without us asking: a crash, or a kill from outside.
        if not self._closing:
            self._spawn(self._lost(vm))

    async def _lost(self, vm: TransientVM) -> None:
        if vm.name not in self.workers or vm.stopped:
            return
        vm.stopped = True
        await self._post("preempted", **vm.spec.event_fields(), notice=False, source="lost")
        self._forget(vm)
        if vm.spec.spot and self.backend.name != "local":
            # A cloud Spot VM that stopped by itself was most likely preempted without notice.
            self.policy.record_preemption(vm.spec.gpu, vm.spec.zone)
        if self._lost_in_move(vm):
            return
        if vm.name not in self._joined:
            # It died before its worker ever joined: a crash on start. Replacing it at once
            # would crash again and again (and bill each boot): back off instead.
            if self.replace or vm.spec.role == "ps":
                await self._post(
                    "replacement-requested", worker=vm.name, role=vm.spec.role, slot=vm.spec.slot
                )
                await self._retry_later(vm.spec.role, vm.spec.slot, "worker crashed on start")
            return
        await self._maybe_replace(vm)

    def _forget(self, vm: TransientVM) -> None:
        self.worker_spec.pop(vm.name, None)
        self.workers.pop(vm.name, None)
        self.simulator.vm_gone(vm.name)
        if vm.spec.slot is not None and self._slots.get(vm.spec.slot) == vm.name:
            del self._slots[vm.spec.slot]

    def _lost_in_move(self, vm: TransientVM) -> bool:
        """Whether ``vm`` is a new PS host of a move the run has not made yet (it is not
        replaced: its successor would start in the old zone, and the move would wait for a
        host that never comes; the move fails instead, see :meth:`_move_ps`)."""
        if vm.name not in self._ps_move_hosts:
            return False
        self._ps_move_lost.append(vm.name)
        return True

    async def _maybe_replace(self, vm: TransientVM) -> None:
        if self._closing or not (self.replace or vm.spec.role == "ps"):
            return
        if self._lost_in_move(vm):
            return
        gpu = None
        if vm.spec.role == "worker":
            # The type asked for, not the one it landed on: a fallback's replacement tries the
            # preferred type again. The VM being replaced does not count: at its notice it is
            # still in self.workers.
            gpu = self._asked_gpu(vm)
            live = self._live_workers(gpu, exclude=vm) + self._spares_coming(gpu)
            if live >= self._mix.get(gpu, 0):
                return  # a spare asked for ahead of this revocation takes its place
        await self._post(
            "replacement-requested",
            worker=vm.name,
            role=vm.spec.role,
            slot=vm.spec.slot,
            **({"gpu": gpu} if gpu else {}),
        )
        await self._provision(vm.spec.role, slot=vm.spec.slot, gpu=gpu)

    def _lifetime_model(self) -> Any:
        """The model of worker lifetimes that odds of revocation are read from: the simulator's,
        or, where it has none (a cloud), the paper's curves."""
        from transient_nb.catalog.lifetimes import NoPreemption, PaperLifetimesByGpu

        model = self.simulator.model
        return PaperLifetimesByGpu() if isinstance(model, NoPreemption) else model

    # -- spares ahead of predicted revocations (replace_at="ahead") ----------------------------------
    def _spares_coming(self, gpu: str) -> int:
        """Spares of type ``gpu`` asked for and not placed yet (their slots still reserved)."""
        self._spare_slots = {s for s in self._spare_slots if self._slots.get(s) == ""}
        return sum(1 for s in self._spare_slots if self._slot_gpu.get(s) == gpu)

    def _lead_s(self) -> float:
        """Wall seconds a new worker takes from being asked for to joining: measured (the mean
        of the last five), else the provisioning delay plus ``spares.JOIN_S``."""
        if self._join_waits:
            return sum(self._join_waits) / len(self._join_waits)
        lo, hi = PAPER_STARTUP_S["spot"]
        delay = (lo + hi) / 2 if self.provisioning_delay == "paper" else self.provisioning_delay
        return float(delay) / self.time_scale + JOIN_S

    async def _spare_ahead(self) -> None:
        """Ask for a spare for each Spot worker whose revocation the lifetime model predicts
        within the lead time (:func:`transient_nb.policy.spares.due_for_spare`)."""
        model = self._lifetime_model()
        while not self._closing:
            lead = self._lead_s()
            now = time.time()
            for vm in list(self.workers.values()):
                since = getattr(vm, "running_since", None)
                if (
                    vm.spec.role != "worker"
                    or not vm.spec.spot
                    or vm.stopped
                    or since is None
                    or vm.name in self._spared
                    or not self._working(vm)
                ):
                    continue
                age_s = (now - since) * self.time_scale
                gpu = self._asked_gpu(vm)
                odds = due_for_spare(model, gpu, age_s, lead * self.time_scale, vm.spec.zone)
                if odds is None:
                    continue
                self._spared.add(vm.name)
                slot = self._free_slot()
                self._slots[slot] = ""  # reserved now: no other request takes it meanwhile
                self._slot_gpu[slot] = gpu
                self._spare_slots.add(slot)
                await self._post(
                    "spare-requested",
                    worker=vm.name,
                    role="worker",
                    gpu=gpu,
                    odds=round(odds, 4),
                    age_s=round(age_s, 1),
                    lead_s=round(lead * self.time_scale, 1),
                )
                self._spawn(self._provision("worker", slot=slot, gpu=gpu))
            await asyncio.sleep(min(1.0, max(0.05, lead / 10)))

    # -- preemption ----------------------------------------------------------------------------------
    def _worker_vms(self) -> list[TransientVM]:
        return [
            w
            for w in self.workers.values()
            if w.spec.role == "worker" and not w.stopped and w.lifecycle not in ("notice",)
        ]

    def _resolve_targets(self, target: int | str | Sequence[str]) -> list[str]:
        if isinstance(target, bool):
            raise ValueError(f"preempt({target!r}): give a number of workers or worker names.")
        if isinstance(target, int):
            if target < 1:
                raise ValueError(f"preempt({target}): the number of workers must be at least 1.")
            candidates = sorted(
                w.name for w in self._worker_vms() if w.lifecycle in ("running", "joined")
            )
            if not candidates:
                candidates = sorted(w.name for w in self._worker_vms())
            if target > len(candidates):
                raise ValueError(
                    f"preempt({target}): only {len(candidates)} worker(s) can be preempted now "
                    f"({', '.join(candidates) or 'none'})."
                )
            return self._rng.sample(candidates, target)
        names = [target] if isinstance(target, str) else list(target)
        for n in names:
            vm = self.workers.get(n)
            if vm is None or vm.spec.role != "worker":
                known = ", ".join(sorted(w.name for w in self._worker_vms())) or "none"
                raise ValueError(f"No preemptible worker named {n!r}: use one of {known}.")
        return names

    async def _preempt(
        self, target: int | str | Sequence[str] = 1, notice: bool = True
    ) -> list[str]:
        names = self._resolve_targets(target)
        for n in names:
            self._spawn(self._preempt_one(n, notice, "manual"))
        return names

    async def _preempt_one(self, name: str, notice: bool, source: str) -> None:
        vm = self.workers.get(name)
        if vm is None or vm.stopped or self._closing:
            return
        self.simulator.vm_gone(name)
        if source != "manual":
            self.policy.record_preemption(vm.spec.gpu, vm.spec.zone)
        deadline = None
        if notice:
            deadline = time.time() + self.notice_s / self.time_scale
            await vm.post("notice", deadline=deadline, source=source)
            if self.replace_at == "notice":
                self._spawn(self._maybe_replace(vm))
        await vm.preempt(notice=notice, deadline=deadline)
        await vm.post("preempted", notice=notice, source=source)
        self._forget(vm)
        if self.replace_at == "preempted" or not notice:
            await self._maybe_replace(vm)

    def preempt(self, target: int | str | Sequence[str] = 1, notice: bool = True) -> Any:
        """Preempt workers now, as the provider would.

        Parameters
        ----------
        target
            How many workers (chosen at random among the running ones), or a worker name, or a
            list of names.
        notice
            Give the preemption notice first (the worker drains and leaves); ``False`` kills at
            once, as a crash would.

        Returns
        -------
        The names of the workers being preempted (the preemptions go on in the background).
        """
        return self.sync(self._preempt, target, notice=notice)

    # -- scaling ----------------------------------------------------------------------------------------
    def scale(
        self,
        n: int | str | Mapping[str, int] = 0,
        memory: Any = None,
        cores: Any = None,
        *,
        gpu: str | None = None,
        on_demand: int | Mapping[str, int] | None = None,
    ) -> Any:
        """Keep ``n`` preemptible GPU workers (the PS host is not counted).

        Parameters
        ----------
        n
            How many workers: of type ``gpu`` if given (the other types keep theirs), else of
            the cluster's one type. A mixed cluster takes a whole mix instead
            (``{"k80": 2, "v100": 2}`` or ``"k80=2,v100=2"``, types left out go to 0) or a
            number with ``gpu=``; a plain number alone is refused there (0 excepted: no
            workers of any type), because no split of it between the types is the obvious one.
        gpu
            The GPU type that ``n`` counts; a type not in the cluster yet is added to it.
        on_demand
            How many of those workers run on demand, on a Spot cluster: a number (of the type
            ``n`` counts, or of the cluster's one type) or GPU type -> number (types left out:
            none). Default: as before, at most the new counts. New workers and replacements
            are asked for on demand until a type has that many; surplus on-demand workers are
            given back and replaced by Spot ones; more than it has replace its Spot workers
            most likely to be revoked. What the transient-aware policy does when a storm of
            revocations makes Spot too slow for a deadline.

        Examples
        --------
        >>> cluster.scale(4)  # doctest: +SKIP
        >>> cluster.scale(2, gpu="v100")  # doctest: +SKIP
        >>> cluster.scale({"k80": 3, "v100": 1})  # doctest: +SKIP
        >>> cluster.scale({"p100": 4}, on_demand={"p100": 1})  # doctest: +SKIP
        """
        if memory is not None or cores is not None:
            raise ValueError(
                "TransientCluster.scale takes a number of GPU workers, not memory or cores."
            )
        mix = self._scaled_mix(n, gpu)
        wanted = self._scaled_on_demand(on_demand, mix, gpu)
        # Refused before anything is asked for (the panel's and the magic's scale come here too).
        self.limits.check_workers(sum(mix.values()))
        self._check_hourly_cost(mix, wanted)
        if not self._closing:
            self._mix = mix
            self._on_demand = wanted
            assert self.loop is not None
            self.loop.add_callback(self._scale_to_target)
        if self.asynchronous:
            return NoOpAwaitable()
        return None

    def scale_ps(self, n: int) -> Any:
        """Keep ``n`` PS hosts: add hosts for more PS shards (a run can only gain shards).

        A run started without ``shards=`` follows: once the new hosts have joined, its driver
        splits the PS into one shard per host, from the PS's own state, and the trainers
        follow the new generation (a ``ps-resharded`` event). The paper measured one 4-vCPU PS
        serving at most about 45 global steps/s and two about 1.75 times that: where fast GPUs
        reach that plateau, a second PS host buys more speed than more workers do.

        Examples
        --------
        >>> cluster.scale_ps(2)  # doctest: +SKIP
        """
        n = positive_int(n, "scale_ps: n")
        if n < self.ps_hosts:
            raise ValueError(
                f"scale_ps({n}): the cluster has {self.ps_hosts} PS hosts and a running PS "
                "cannot give back a shard's host; start a new run on a smaller cluster instead."
            )
        if n > MAX_PS_HOSTS:
            raise ValueError(
                f"scale_ps({n}): at most {MAX_PS_HOSTS} PS hosts (the paper's PS gains 1.75x "
                "from a second host; more shards mostly add cost)."
            )
        before = self.ps_hosts
        if n == before or self._closing:
            return NoOpAwaitable() if self.asynchronous else None
        self.ps_hosts = n
        try:
            self._check_hourly_cost(self._mix)
        except ValueError:
            self.ps_hosts = before
            raise
        assert self.loop is not None
        self.loop.add_callback(self._add_ps_hosts, before, n)
        return NoOpAwaitable() if self.asynchronous else None

    def move_ps(self, zone: str, reason: str = "") -> Any:
        """Move the PS hosts to ``zone``: where most workers run, a PS nearby saves each of
        them the round trips to another region (the paper measured workers there up to 1.48x
        slower).

        New PS hosts (as many as the cluster keeps) are started in ``zone``; once they have
        joined, a training run moves its PS onto them from the PS's own state, as it does when
        it gains a shard (a ``ps-moved`` event; the trainers follow the new generation), and
        the old hosts are given back. With no run training, the old hosts go once the new ones
        have joined. Replacements go near the PS from then on.

        Parameters
        ----------
        zone
            One of the zones the cluster may use (its own and its ``fallback_zones``).
        reason
            Said in the ``ps-move`` event (the transient-aware policy says why it moves).

        Examples
        --------
        >>> cluster.move_ps("us-east1-c")  # doctest: +SKIP
        """
        zones = self._zones()
        if not isinstance(zone, str) or zone not in zones:
            raise ValueError(
                f"move_ps({zone!r}): not a zone this cluster may use ({', '.join(zones)}); add "
                "it to fallback_zones when the cluster starts."
            )
        if self.ps_move_zone is not None:
            raise ValueError(
                f"move_ps({zone!r}): the PS is being moved to {self.ps_move_zone} already; wait "
                "for its ps-moved event, then move it again."
            )
        here = self.policy.ps_zone or self.zone
        if zone == here or self._closing:
            return NoOpAwaitable() if self.asynchronous else None
        self.ps_move_zone = zone
        assert self.loop is not None
        self.loop.add_callback(self._move_ps, here, zone, reason)
        return NoOpAwaitable() if self.asynchronous else None

    def _run_going(self) -> bool:
        """Whether a training run has started on this cluster and not finished."""
        started, finished = set(), set()
        for e in self.monitor.events:
            if e.get("kind") == "train-started":
                started.add(e.get("run"))
            elif e.get("kind") == "train-finished":
                finished.add(e.get("run"))
        return bool(started - finished)

    async def _move_ps(self, here: str, zone: str, reason: str) -> None:
        old = [w for w in self.workers.values() if w.spec.role == "ps" and not w.stopped]
        start = len(self.monitor.events)
        await self._post(
            "ps-move", zone_from=here, zone=zone, hosts=[w.name for w in old], reason=reason
        )
        self._log(f"Moving the PS from {here} to {zone}: {self.ps_hosts} new PS host(s)")
        names = await asyncio.gather(
            *(self._provision("ps", zone=zone) for _ in range(self.ps_hosts))
        )
        hosts = [n for n in names if n]
        if len(hosts) < len(names) or self._closing:
            # No half moves: the hosts that did start go, the PS stays where it is.
            await self._fail_move(hosts, zone, self._last_failure or "the cluster closed")
            return
        # The run moves its PS once the new hosts have joined (it watches for them); without a
        # run, nothing holds the old hosts once the new ones work.
        self._ps_move_hosts = set(hosts)
        self._ps_move_lost = [n for n in hosts if n not in self.workers]  # lost as it started
        try:
            moved = await self._ps_moved(hosts, start)
        finally:
            self._ps_move_hosts = set()
        lost, self._ps_move_lost = self._ps_move_lost, []
        if self._closing:
            return
        if not moved and lost:
            # A new host was lost before the run moved onto it: the move fails whole (the
            # other new hosts go), and the PS goes on where it is; a move may be asked again.
            await self._fail_move(
                hosts,
                zone,
                f"new PS host {lost[0]} was lost before the run moved onto it; the PS stays in "
                f"{here}",
            )
            return
        for vm in old:
            self.worker_spec.pop(vm.name, None)
        self.policy.ps_zone = zone
        await self._correct_state()
        self.ps_move_zone = None
        for _ in lost:
            # Lost as the run moved onto it: a PS host like any other, replaced near the PS.
            self._spawn(self._provision("ps"))

    async def _fail_move(self, hosts: list[str], zone: str, reason: str) -> None:
        """A move to ``zone`` that will not be made: its new ``hosts`` go, the PS stays."""
        for name in hosts:
            self.worker_spec.pop(name, None)
        await self._correct_state()
        self.ps_move_zone = None
        await self._post("ps-move-failed", zone=zone, reason=reason)

    async def _ps_moved(self, names: list[str], start: int) -> bool:
        """Wait until the run moved its PS onto the new hosts ``names`` (True), or, without a
        run, until they have joined (True); False once one of them is lost first (or the
        cluster closes)."""
        while not self._closing:
            if any(e.get("kind") == "ps-moved" for e in self.monitor.events[start:]):
                return True
            if self._ps_move_lost:
                return False
            if all(n in self._joined for n in names) and not self._run_going():
                return True
            await asyncio.sleep(0.1)
        return False

    async def _add_ps_hosts(self, before: int, n: int) -> None:
        await self._post("ps-hosts", hosts=n, hosts_from=before)
        self._log(f"Adding {n - before} PS host(s): {n} in all, one PS shard each")
        for _ in range(n - before):
            self._spawn(self._provision("ps"))

    def _scaled_mix(self, n: int | str | Mapping[str, int], gpu: str | None) -> Mix:
        """The mix that ``scale(n, gpu=gpu)`` asks for, checked against the catalog."""
        if isinstance(n, str) and n.strip().isdigit():
            n = int(n.strip())
        if isinstance(n, bool) or not isinstance(n, (int, str, Mapping)):
            raise ValueError(f"scale({n!r}): give a whole number of workers, 0 or more.")
        if isinstance(n, int):
            if n < 0:
                raise ValueError(f"scale({n!r}): give a whole number of workers, 0 or more.")
            if gpu is None:
                live = [g for g, c in self._mix.items() if c > 0]
                if n == 0:  # no workers of any type: unambiguous (and SpecCluster's close)
                    return {g: 0 for g in self._mix}
                if len(live) > 1:
                    raise ValueError(
                        f"scale({n}): this cluster mixes {format_mix(self._mix)}; say which type "
                        f"to scale, e.g. scale({n}, gpu={live[0]!r}), or give the whole mix, "
                        "e.g. scale({'k80': 2, 'v100': 1})."
                    )
                key = live[0] if live else self.gpu
            else:
                if not isinstance(gpu, str) or not gpu.strip():
                    raise ValueError(f"scale({n}, gpu={gpu!r}): give a GPU type such as 'v100'.")
                key = gpu.strip().lower()
            mix = {**self._mix, key: n}
        else:
            if gpu is not None:
                raise ValueError(
                    f"scale({n!r}, gpu={gpu!r}): a mix names its types already; drop gpu."
                )
            try:
                mix = parse_mix(n, self.gpu)
            except ValueError as e:
                if "asks for no workers" not in str(e):
                    raise
                mix = {}  # every type to 0: no workers, as scale(0)
        for g in mix:
            if g not in self._mix:
                for z in self._zones():
                    self.catalog.worker_price(g, self.machine_type, z)
        # Types at 0 stay in the mix until scaled again, so the cluster keeps its main type.
        kept = {g: 0 for g in self._mix}
        return {**kept, **mix}

    def _scaled_on_demand(
        self, on_demand: int | Mapping[str, int] | None, mix: Mix, gpu: str | None
    ) -> Mix:
        """The on-demand counts that ``scale(..., on_demand=on_demand)`` asks for, checked.

        Every type ever given a count keeps one (0 included): only those are brought to it, so
        an ``on_demand_fallback`` VM of a type never given one is left alone.
        """
        if on_demand is None:
            return {g: min(n, mix.get(g, 0)) for g, n in self._on_demand.items()}
        if isinstance(on_demand, Mapping):
            asked = {**{g: 0 for g in self._on_demand}, **dict(on_demand)}
        else:
            live = [g for g, c in mix.items() if c > 0]
            key = gpu.strip().lower() if gpu else live[0] if len(live) == 1 else None
            if key is None and on_demand == 0:
                return {g: 0 for g in self._on_demand}
            if key is None:
                raise ValueError(
                    f"scale(on_demand={on_demand!r}): this cluster mixes {format_mix(mix)}; give "
                    "a number per type, e.g. on_demand={'p100': 1}."
                )
            asked = {**self._on_demand, key: on_demand}
        out: Mix = {}
        for g, count in asked.items():
            name = str(g).strip().lower()
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                raise ValueError(
                    f"scale(on_demand={on_demand!r}): {g}={count!r} is not a number of workers; "
                    "give a whole number, 0 or more."
                )
            if count > mix.get(name, 0):
                raise ValueError(
                    f"scale(on_demand={on_demand!r}): {count} {name} on demand, but the mix keeps "
                    f"{mix.get(name, 0)} {name}; at most that many can run on demand."
                )
            if count and not self.spot:
                raise ValueError(
                    f"scale(on_demand={on_demand!r}): this cluster's workers are all on demand "
                    "already (spot=False); on_demand= shares out a Spot cluster's workers."
                )
            out[name] = count
        return out

    async def _scale_to_target(self) -> None:
        if self._closing or self.status != Status.running:
            return
        asked = False

        async def announce() -> None:
            nonlocal asked
            if not asked:
                await self._post(
                    "scale", workers=self._target, mix=dict(self._mix), on_demand=self.on_demand
                )
                asked = True

        for gpu in list(self._mix):
            # Read now, not before the loop: an earlier pass awaits a scale-down while a later
            # scale() changes the mix, and must not undo what that one asked for.
            want = self._mix.get(gpu, 0)
            vms = self._worker_vms_of(gpu)
            pending = sum(
                1 for s, v in self._slots.items() if v == "" and self._slot_gpu.get(s) == gpu
            )
            if len(vms) + pending < want:
                await announce()
                await asyncio.gather(
                    *(self._provision("worker", gpu=gpu) for _ in range(want - len(vms) - pending))
                )
            elif len(vms) > want:
                await announce()
                # Selective revocation: the VMs not yet working first, then those most likely
                # to be revoked within the hour at their age, then the newest.
                await self._give_back_vms(gpu, self._give_back(vms, len(vms) - want))
            await self._rebalance_on_demand(gpu, announce)

    async def _give_back_vms(self, gpu: str, chosen: list[tuple[Any, float]]) -> None:
        """Give back ``chosen`` (VMs of ``gpu`` with their odds of revocation within the hour)."""
        for vm, odds in chosen:
            await self._post(
                "give-back",
                worker=vm.name,
                gpu=gpu,
                working=self._working(vm),
                p_revoked_1h=round(odds, 4),
                spot=bool(vm.spec.spot),
            )
            self.simulator.vm_gone(vm.name)
            self.worker_spec.pop(vm.name, None)
            if vm.spec.slot is not None:
                self._slots.pop(vm.spec.slot, None)
        await self._correct_state()

    async def _rebalance_on_demand(self, gpu: str, announce: Any) -> bool:
        """Bring ``gpu``'s on-demand workers to what ``scale`` asked: swap surplus on-demand
        workers for Spot ones, or the Spot workers most likely to be revoked for on-demand ones
        (each given back, then asked for again: the ask goes on demand while the type is
        short). Returns whether it changed anything."""
        if not self.spot or gpu not in self._on_demand:
            return False  # never given a count: its on-demand fallback VMs are left alone
        want = min(self._on_demand[gpu], self._mix.get(gpu, 0))
        vms = self._worker_vms_of(gpu)
        held = self._on_demand_held(gpu)
        if held > want:
            dear = [w for w in vms if not w.spec.spot]
            swap = self._give_back(dear, min(len(dear), held - want))
        elif held < want:
            # Only Spot workers the mix already counts: a type still growing asks on demand.
            cheap = [w for w in vms if w.spec.spot]
            swap = self._give_back(cheap, min(len(cheap), want - held))
        else:
            return False
        if not swap:
            return False
        await announce()
        await self._give_back_vms(gpu, swap)
        await asyncio.gather(*(self._provision("worker", gpu=gpu) for _ in swap))
        return True

    def _working(self, vm: Any) -> bool:
        """Whether ``vm``'s worker has joined and not left (the scheduler's membership; a VM's
        own lifecycle ends at "running")."""
        return vm.name in self._joined and not getattr(vm, "worker_left", False)

    def _give_back(self, vms: list[Any], n: int) -> list[tuple[Any, float]]:
        """The ``n`` of ``vms`` to give back, with their odds of revocation within the hour."""
        from transient_nb.catalog.lifetimes import revoked_within
        from transient_nb.policy.placement import Held, give_back_order

        model = self._lifetime_model()
        now = time.time()
        held, by_name = [], {}
        for vm in vms:
            since = getattr(vm, "running_since", None)
            age_s = 0.0 if since is None else (now - since) * self.time_scale
            spot = bool(getattr(vm.spec, "spot", self.spot))
            gpu = self._asked_gpu(vm)
            odds = revoked_within(model, gpu, age_s, zone=vm.spec.zone) if spot else 0.0
            held.append(Held(vm.name, self._working(vm), odds, int(vm.name.split("-")[1])))
            by_name[vm.name] = vm
        return [(by_name[h.name], h.p_revoked_1h) for h in give_back_order(held)[:n]]

    # -- waiting -------------------------------------------------------------------------------------------
    async def _wait_for_workers(
        self, n_workers: int | None = None, timeout: float | None = None
    ) -> None:
        n = self._target if n_workers is None else n_workers
        deadline = None if timeout is None else time.monotonic() + parse_timedelta(timeout)
        while True:
            joined = vm_states(self.monitor.events)
            if not joined.empty:
                working = joined[joined["state"] == "joined"]
                n_gpu = int((working["role"] == "worker").sum())
                n_ps = int((working["role"] == "ps").sum())
                if n_gpu >= n and n_ps >= self.ps_hosts:
                    return
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"Only some of {n} workers joined within {timeout}.")
            await asyncio.sleep(0.05)

    def wait_for_workers(self, n_workers: int | None = None, timeout: float | None = None) -> Any:
        """Block until ``n_workers`` GPU workers (default: the target) and the PS hosts have joined."""
        return self.sync(self._wait_for_workers, n_workers, timeout)

    # -- the transient-aware policy ------------------------------------------------------------------
    def adapt(self, goal: str | None = None, **kwargs: Any) -> Any:  # type: ignore[override]
        """Let a :class:`~transient_nb.policy.adaptive.TransientPolicy` choose the GPU mix for a goal.

        Unlike Dask's ``adapt`` (which sizes a cluster to its task queue), the policy sizes it
        to a training goal, from the run's progress, the workers' step rates, revocations and
        prices; every change is a ``policy-decision`` event with its reason.

        Parameters
        ----------
        goal
            ``"deadline"`` (with ``deadline="2h"``), ``"budget"`` (with ``budget=20``) or
            ``"cost-per-step"``; None stops a running policy (the cluster keeps its mix).
        **kwargs
            Passed to :class:`~transient_nb.policy.adaptive.TransientPolicy` (``gpus``, ``max_workers``,
            ``max_shards``, ``interval``, ``hysteresis``, ``on_demand``, ...). Where one PS is
            the bottleneck the policy adds PS hosts (:meth:`scale_ps`) for a run started
            without ``shards=``. On a Spot cluster it may run some workers on demand
            (:meth:`scale`'s ``on_demand``) where its goal needs them; ``on_demand=False``
            keeps them all Spot.

        Returns
        -------
        The running policy (None when stopped).

        Examples
        --------
        >>> policy = cluster.adapt(goal="deadline", deadline="2h")  # doctest: +SKIP
        >>> policy.last.reason  # doctest: +SKIP
        '6 k80 in us-central1-a, 1 PS shard: ETA 3.90 h -> 1.10 h, +1.30 $/h, ...'
        """
        from transient_nb.policy.adaptive import TransientPolicy

        previous = getattr(self, "_policy", None)
        policy = None if goal is None else TransientPolicy(self, goal, **kwargs)  # checks first
        if previous is not None:
            previous.stop()
        self._policy = policy
        if policy is not None:
            policy.start()
            if previous is None:
                self.close_hooks.append(self._stop_policy)
        return policy

    def _stop_policy(self) -> None:
        policy, self._policy = getattr(self, "_policy", None), None
        if policy is not None:
            policy.stop(announce=False)  # closing: the log ends with "closed" anyway

    def __repr__(self) -> str:
        live = {g: n for g, n in self._mix.items() if n}
        what = f"{self._target} x {self.gpu}" if len(live) <= 1 else f"workers {format_mix(live)}"
        return (
            f"<TransientCluster {self.name!r}: {self.backend.name}, {what} "
            f"{'spot' if self.spot else 'on-demand'} in {self.zone}, "
            f"status={self.status.name}>"
        )
