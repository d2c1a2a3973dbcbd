"""What every backend provides: VMs with a lifecycle that posts events.

A VM is a :class:`distributed.deploy.spec.ProcessInterface` (as in dask-cloudprovider's
``VMCluster``) with a lifecycle beside its Dask ``status``: requested, provisioning, running,
notice, preempted, deleted. Preemption, replacement and cost logic live above the backends, in
:class:`~transient_nb.deploy.cluster.TransientCluster`; a backend only creates, boots, notifies, kills
and deletes.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

import dask.config
from distributed.core import Status, rpc
from distributed.deploy.spec import ProcessInterface

from transient_nb.catalog.prices import Price

logger = logging.getLogger(__name__)

PostEvent = Callable[..., Awaitable[None]]

#: The environment Dask's nanny gives every worker process, on every backend. The nanny sets
#: MALLOC_TRIM_THRESHOLD_=65536, which halves torch's CPU speed (measured here); None removes it.
#: One thread per BLAS/OpenMP pool keeps workers from fighting over the cores.
WORKER_PRE_SPAWN_ENVIRON = {
    "MALLOC_TRIM_THRESHOLD_": None,
    "OMP_NUM_THREADS": 1,
    "MKL_NUM_THREADS": 1,
}


def dask_settings(settings: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``transient.cluster-dask`` as dotted Dask keys: the settings of the cluster's scheduler and
    of every VM's nanny and worker.

    Its defaults cut what an idle cluster spends (benchmarks/idle_vm.py) on parts nothing here
    reads: the worker's statistical profiler (a walk of every thread's stack each 10 ms) is off,
    and Dask's event-loop check (each 20 ms) and system monitor (each 0.5 s) run less often.

    Parameters
    ----------
    settings
        Nested Dask settings; None reads ``transient.cluster-dask``.

    Examples
    --------
    >>> dask_settings({"distributed": {"admin": {"tick": {"interval": "500ms"}}}})
    {'distributed.admin.tick.interval': '500ms'}
    """
    if settings is None:
        settings = dask.config.get("transient.cluster-dask") or {}
    flat: dict[str, Any] = {}

    def walk(path: tuple[str, ...], node: Mapping[str, Any]) -> None:
        for key, value in node.items():
            if isinstance(value, Mapping):
                walk((*path, str(key)), value)
            else:
                flat[".".join((*path, str(key)))] = value

    walk((), settings)
    return flat


def dask_environ(settings: Mapping[str, Any] | None = None) -> dict[str, str]:
    """:func:`dask_settings` as the ``DASK_*`` variables a VM's nanny and worker read.

    Examples
    --------
    >>> dask_environ({"distributed": {"admin": {"system-monitor": {"interval": "2s"}}}})
    {'DASK_DISTRIBUTED__ADMIN__SYSTEM_MONITOR__INTERVAL': '2s'}
    >>> dask_environ({"distributed": {"worker": {"profile": {"enabled": False}}}})
    {'DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED': 'False'}
    """
    # Read back by dask.config.collect_env: ast.literal_eval ("False" -> False), else the string.
    return {
        "DASK_" + key.upper().replace("-", "_").replace(".", "__"): str(value)
        for key, value in dask_settings(settings).items()
    }


@dataclass(frozen=True)
class VMSpec:
    """What to ask the provider for."""

    name: str
    role: str  # "worker" (preemptible GPU worker) or "ps" (never-preemptible PS/scheduler host)
    gpu: str | None
    zone: str
    spot: bool
    machine_type: str
    price: Price
    slot: int | None = None
    resources: dict[str, float] = field(default_factory=dict)

    def event_fields(self) -> dict[str, Any]:
        """The fields every lifecycle event of this VM carries."""
        return {
            "worker": self.name,
            "role": self.role,
            "gpu": self.gpu,
            "zone": self.zone,
            "spot": self.spot,
            "machine": self.machine_type,
            "price": self.price.rate(self.spot),
            "price_on_demand": self.price.on_demand,
            "slot": self.slot,
        }


def die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """``preexec_fn`` of a VM's process: the kernel kills it when its parent dies.

    A VM must not outlive the process that owns it (a kernel, a head), even one killed with
    SIGKILL: Linux's ``PR_SET_PDEATHSIG``. Elsewhere, a no-op.
    """
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def start_process(
    cmd: Sequence[str], env: Mapping[str, str], log_path: str, *, new_session: bool = False
) -> tuple[subprocess.Popen[bytes], IO[bytes]]:
    """Start a VM's process, its output appended to ``log_path``; the process and the open log.

    It dies with this process (:func:`die_with_parent`); ``new_session``: in a process group of
    its own, so that one kill stops a nanny and its worker.
    """
    log = open(log_path, "ab")
    proc = subprocess.Popen(
        list(cmd),
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=new_session,
        preexec_fn=die_with_parent,
    )
    return proc, log


class CapacityError(RuntimeError):
    """The provider has no capacity for this VM (e.g. ZONE_RESOURCE_POOL_EXHAUSTED)."""

    def __init__(self, zone: str, gpu: str | None, reason: str = "ZONE_RESOURCE_POOL_EXHAUSTED"):
        super().__init__(f"No capacity for {gpu or 'CPU'} VMs in {zone}: {reason}")
        self.zone = zone
        self.gpu = gpu
        self.reason = reason


class QuotaError(CapacityError):
    """A quota is used up (``GPUS_ALL_REGIONS``, ``NVIDIA_T4_GPUS``): raising it is the fix.

    Unlike a stock-out, waiting does not help, and every zone of ``region`` (every region, for
    a ``global`` quota) shares it. The message names the quota and how to see and raise it.
    """

    def __init__(
        self,
        zone: str,
        gpu: str | None,
        quota: str,
        region: str,
        limit: float | None,
        how: str,
    ):
        RuntimeError.__init__(
            self,
            f"Quota {quota} ({'all regions' if region == 'global' else region}) is used up"
            f"{'' if limit is None else f' (limit {limit:g})'}: GCE refused a "
            f"{gpu or 'CPU'} VM in {zone}. {how}",
        )
        self.zone = zone
        self.gpu = gpu
        self.reason = "QUOTA_EXCEEDED"
        self.quota = quota
        self.region = region
        self.limit = limit


class TransientVM(ProcessInterface):
    """One VM of a transient cluster; subclasses implement the ``_`` methods.

    Parameters
    ----------
    spec
        What to create.
    scheduler_address
        Where the VM's worker connects.
    post
        Coroutine function ``post(kind, **fields)`` that logs an event on the scheduler.
    on_running, on_exit, on_gone
        Callbacks to the cluster: the VM runs (billing starts); the VM stopped by itself; the
        VM is gone, for whatever reason (its certificates are revoked then).
    """

    def __init__(
        self,
        spec: VMSpec,
        *,
        scheduler_address: str,
        post: PostEvent,
        on_running: Callable[[TransientVM], None] | None = None,
        on_exit: Callable[[TransientVM], None] | None = None,
        on_gone: Callable[[TransientVM], None] | None = None,
    ):
        super().__init__()
        self.spec = spec
        self.name = spec.name
        self.scheduler_address = scheduler_address
        self._post_event = post
        self._on_running = on_running
        self._on_exit = on_exit
        self._on_gone = on_gone
        self.lifecycle = "created"
        self.running_since: float | None = None
        #: True once we stopped the VM on purpose (preemption or deletion).
        self.stopped = False
        #: True when the provider's own notice already reached the VM (GCE's metadata server):
        #: there is no notice left to deliver, only the exit to wait for.
        self.provider_notice = False
        #: TLS settings of this cluster's comms (set by backends that use TLS).
        self.connection_args: dict[str, Any] = {}
        #: True once this VM's worker has left the scheduler (set by the cluster).
        self.worker_left = False
        #: When a notice was given and the VM stops (epoch seconds); None without a notice.
        self.notice_deadline: float | None = None
        self._left_waiters: list[asyncio.Future[None]] = []

    def mark_left(self) -> None:
        """The VM's worker left the scheduler (the cluster calls this on ``left``)."""
        self.worker_left = True
        for f in self._left_waiters:
            if not f.done():
                f.set_result(None)
        self._left_waiters.clear()

    async def _wait_gone(self, deadline: float) -> None:
        """Until the worker has left the scheduler, the VM has exited, or the deadline.

        A drained worker counts as gone once it has left: what is left of its VM (a nanny
        that takes seconds to wind down, a guest OS shutting down) does no work, so the
        replacement need not wait for it (measured: the nanny alone stalls about 2 s).
        """
        if self.worker_left:
            return
        left: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._left_waiters.append(left)
        exited = asyncio.ensure_future(self._wait_exit(deadline))
        try:
            await asyncio.wait({left, exited}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            exited.cancel()
            if left in self._left_waiters:
                self._left_waiters.remove(left)

    async def _worker_address(self) -> str | None:
        """The address of this VM's worker as the scheduler knows it (None before it joins)."""
        async with rpc(self.scheduler_address, connection_args=self.connection_args) as r:
            info = await r.identity()
        for addr, w in info.get("workers", {}).items():
            if str(w.get("name")) == self.name:
                return str(addr)
        return None

    async def post(self, kind: str, **fields: Any) -> None:
        """Log a lifecycle event of this VM."""
        self.lifecycle = kind if kind != "left" else self.lifecycle
        if kind == "running":
            self.running_since = time.time()  # its age (selective revocation)
        await self._post_event(kind, **{**self.spec.event_fields(), **fields})

    # -- ProcessInterface ------------------------------------------------------------------------
    async def start(self) -> None:
        """Ask the provider for the VM; returns once it is accepted (not yet booted).

        Raises :class:`CapacityError` when the provider has no room for it.
        """
        await self.post("requested")
        await self._create()
        await self.post("provisioning")
        await super().start()

    async def close(self) -> None:
        """Delete the VM (scale-down or cluster close)."""
        if not self.stopped:
            self.stopped = True
            try:
                await self._delete()
            finally:
                self.gone()
                try:
                    await self.post("deleted")
                except Exception:  # the scheduler may already be gone at interpreter exit
                    logger.debug("could not post 'deleted' for %s", self.name, exc_info=True)
        if self.status != Status.closed:
            await super().close()

    # -- preemption --------------------------------------------------------------------------------
    async def preempt(self, *, notice: bool, deadline: float | None = None) -> None:
        """Stop the VM as the provider would; ``notice`` first if asked for."""
        self.stopped = True  # from here on, the VM going away is expected
        if notice and deadline is not None:
            self.notice_deadline = deadline
            if not self.provider_notice:
                await self._notify(deadline)
            await self._wait_gone(deadline)
        try:
            await self._kill()
        finally:
            self.gone()

    async def joined_during_notice(self) -> None:
        """The VM's worker joined after its notice was given: deliver the notice now.

        On a cloud the notice reaches the VM itself (GCE's metadata server), whenever its worker
        starts; a notice the cluster sent before the worker joined had no one to reach.
        """
        if (
            self.notice_deadline is not None
            and not self.provider_notice
            and time.time() < self.notice_deadline
        ):
            await self._notify_late(self.notice_deadline)

    async def running(self) -> None:
        """To be called by subclasses when the VM is booted."""
        await self.post("running")
        if self._on_running is not None:
            self._on_running(self)

    def exited_by_itself(self) -> None:
        """To be called by subclasses when the VM stopped without being asked to."""
        self.gone()
        if not self.stopped and self._on_exit is not None:
            self._on_exit(self)

    def gone(self) -> None:
        """The VM no longer runs (deleted, preempted, stopped by itself): tell the cluster."""
        if self._on_gone is not None:
            self._on_gone(self)

    # -- to implement ------------------------------------------------------------------------------
    async def _create(self) -> None:
        raise NotImplementedError

    async def _notify(self, deadline: float) -> None:
        raise NotImplementedError

    async def _notify_late(self, deadline: float) -> None:
        """Deliver a notice to a worker that joined after it was given (default: as
        :meth:`_notify`)."""
        await self._notify(deadline)

    async def _wait_exit(self, deadline: float) -> None:
        """Wait until the VM's worker has left by itself, or the deadline."""
        await asyncio.sleep(0)

    async def _kill(self) -> None:
        raise NotImplementedError

    async def _delete(self) -> None:
        raise NotImplementedError


@dataclass(frozen=True)
class Preparation:
    """What :meth:`Backend.prepare` checks against the provider before anything starts."""

    #: The GPU types asked for (the first ``asked_gpus``: a mixed cluster asks for several), then
    #: the fallback types.
    gpus: Sequence[str]
    #: The cluster's zone, then its fallback zones.
    zones: Sequence[str]
    #: The workers' and the PS hosts' machine types.
    machine_type: str
    ps_machine_type: str
    #: The preemption notice, in wall seconds.
    notice_s: float
    #: Unique to the cluster: what it creates carries it, so that it never takes (or deletes) a
    #: resource of someone else's that happens to have the same name.
    cluster_id: str = ""
    #: How many of ``gpus`` the cluster asks for.
    asked_gpus: int = 1


class Backend:
    """Makes VMs. Subclasses set ``name`` and implement :meth:`make_vm`.

    The hooks below let a cloud backend (GCE) check its settings before anything is created,
    secure the scheduler, and own cluster-wide resources (a firewall rule); the defaults do
    nothing, which is what the local backend needs.
    """

    name = "base"

    @property
    def security(self) -> Any:
        """``distributed.security.Security`` of the cluster (None: Dask's default, no TLS)."""
        return None

    def scheduler_options(self) -> dict[str, Any]:
        """Options merged into the scheduler's (host, protocol, security)."""
        return {}

    def prepare(self, cluster_name: str, plan: Preparation) -> None:
        """Check the cluster's settings (``plan``) against the provider; called before anything
        starts."""

    def not_offered(self) -> set[tuple[str, str]]:
        """(GPU type, zone) pairs the provider does not offer, as :meth:`prepare` found them
        (the replacement policy never picks them); none by default."""
        return set()

    async def start(self, scheduler_address: str) -> None:
        """Create cluster-wide resources once the scheduler runs, before any VM."""

    async def close(self) -> None:
        """Remove cluster-wide resources once every VM is gone."""

    def client_tls_files(self, folder: str) -> dict[str, str] | None:
        """``ca``/``cert``/``key`` files of a client certificate for this user's other processes.

        Written 0600 into ``folder`` (0700: the cluster registry's, which owns them); None when
        the cluster does not use TLS.
        """
        return None

    def make_vm(self, spec: VMSpec, **kwargs: Any) -> TransientVM:
        raise NotImplementedError

    def hosts_next_ps(self) -> bool:
        """Whether the next PS host asked for runs on the head VM itself (billed as the head's
        machine type) rather than on a VM of its own; False by default."""
        return False

    def describe(self) -> str:
        """One line for logs: what this backend runs."""
        return self.name
