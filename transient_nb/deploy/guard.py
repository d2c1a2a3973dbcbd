"""The scheduler's guard: what each certificate of the cluster may ask of the scheduler.

Dask's scheduler answers any TLS peer whose certificate its CA signed: run a function on the
scheduler (``run_function``), submit a graph, register a plugin, broadcast to every worker... So a
copy of one Spot worker's key would be a client of the cluster, with the rights of the process
that runs the scheduler (the notebook, or the head VM and its service account). :class:`RoleGuard`
reads each peer's certificate (its role, :mod:`transient_nb.worker.peers`; and, from the cluster's
CA, whether it is still valid and for which VM) and:

- answers everything for a ``client`` (the driver, a notebook, the CLI, the panel);
- answers a ``worker`` or ``ps`` only what Dask's workers and nannies ask
  (:data:`WORKER_OPS`: register, heartbeat, leave, log an event...), each about its own VM only
  (a worker joins under its own VM's name, retires or unregisters itself, not another);
- on a worker's streams, only what workers send (:data:`WORKER_STREAM_OPS`: task results,
  events, its provider's notice), and what the client inside a worker sends to hold an actor
  (:data:`WORKER_CLIENT_STREAM_OPS`: Dask gives every worker that unpickles an actor handle, as
  a trainer does with its PS's, a client of its own, with the worker's certificate); never a
  graph, data to scatter, or keys to cancel;
- refuses a certificate the CA no longer knows: its VM is gone (:meth:`ClusterCA.revoke`).

A refused request gets a ``PermissionError`` and a ``control-refused`` event (``action``: the
operation, ``sender``: the certificate's name). The control topic is the monitor's to check
(:class:`~transient_nb.deploy.monitor.TransientMonitor`): only a client may post on it.

The scheduler does not unpickle what arrives on its comms (its handlers do, once called), so a
refused request runs nothing. Workers are another matter (:mod:`transient_nb.worker.guard`).
"""

from __future__ import annotations

import contextvars
import inspect
import logging
from collections.abc import Callable, Iterable
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin

from transient_nb.backends.tls import ClusterCA
from transient_nb.eventlog.vocabulary import PROVIDER_NOTICE_OP, TOPIC, make_event
from transient_nb.worker.peers import ROLE_CLIENT, VM_ROLES, Peer, guarded, peer_of, refusal

logger = logging.getLogger(__name__)

#: What a worker or its nanny asks of the scheduler over RPC (distributed's worker.py, nanny.py).
WORKER_OPS = frozenset(
    {
        "register-worker",
        "register_nanny",
        "heartbeat_worker",
        "unregister",
        "retire_workers",
        "set_resources",
        "who_has",
        "log_event",
        "identity",
        "versions",
        # The client Dask makes inside a worker that holds an actor handle (a trainer holds its
        # PS's): it registers a stream, limited to WORKER_CLIENT_STREAM_OPS.
        "register-client",
        "transient_events",  # the event log's first events (training.emulation)
        # Trainers read where the current PS is from the run's Dask Variable (the driver, a
        # client, sets it: a worker cannot point the others at a PS of its own).
        "variable_get",
        # Dask's p2p shuffles (data between workers: not used by training, allowed anyway).
        "shuffle_barrier",
        "shuffle_get",
        "shuffle_get_or_create",
        "shuffle_restrict_task",
    }
)
#: What a worker sends on its stream to the scheduler.
WORKER_STREAM_OPS = frozenset(
    {
        "task-finished",
        "task-erred",
        "release-worker-data",
        "add-keys",
        "long-running",
        "reschedule",
        "keep-alive",
        "log-event",
        "worker-status-change",
        "request-refresh-who-has",
        "steal-response",
        PROVIDER_NOTICE_OP,
    }
)
#: What the client inside a worker sends on its stream: it holds and lets go of the keys of the
#: actors it calls, says it is alive, follows topics. Nothing that computes, scatters or cancels.
WORKER_CLIENT_STREAM_OPS = frozenset(
    {
        "heartbeat-client",
        "close-client",
        "client-desires-keys",
        "client-releases-keys",
        "report-key",
        # Dask's client subscribes to the print and warn topics (the event log is workers' to
        # read anyway: transient_events).
        "subscribe-topic",
        "unsubscribe-topic",
        "variable-future-received-confirm",
    }
)
#: The peer of the stream being read (set for the life of a client's or a worker's stream).
_STREAM_PEER: contextvars.ContextVar[Peer | None] = contextvars.ContextVar(
    "transient_stream_peer", default=None
)


class RoleGuard(SchedulerPlugin):
    """Refuses client operations to every certificate but a client's (module docstring).

    Parameters
    ----------
    ca
        The cluster's CA: which VM a certificate was issued to, and whether it still is valid.
        None: roles are read from the certificates alone (nothing is revoked).

    Examples
    --------
    >>> from distributed import Scheduler
    >>> guard = RoleGuard(ClusterCA.create("demo"))
    >>> scheduler = Scheduler(plugins=[monitor, guard])  # doctest: +SKIP
    """

    name = "transient-guard"

    def __init__(self, ca: ClusterCA | None = None):
        self.ca = ca
        self.scheduler: Any = None
        #: (operation, sender) of every refusal, in order (for logs and tests).
        self.refused: list[tuple[str, str]] = []

    async def start(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        for op, handler in list(scheduler.handlers.items()):
            if not hasattr(handler, "__transient_guarded__"):
                wrapped = guarded(op, handler, self._check)
                if op in ("register-client", "register-worker"):
                    wrapped = self._streaming(wrapped)
                scheduler.handlers[op] = wrapped
        for op, handler in list(scheduler.stream_handlers.items()):
            scheduler.stream_handlers[op] = self._guard_stream(op, handler)

    # -- who it is -----------------------------------------------------------------------------------
    def _identify(self, comm: Any) -> tuple[Peer | None, str | None, str]:
        """The peer of ``comm``, the VM its certificate was issued to, and why it is refused
        ("" when it is not)."""
        peer = peer_of(comm)
        if peer is None:
            return None, None, ""  # no TLS: nothing to tell apart (local.tls: false)
        if self.ca is None:
            return peer, None, ""
        issued = self.ca.lookup(peer.serial)
        if issued is None:
            return peer, None, "its certificate was revoked (its VM is gone)"
        if issued.role != peer.role:
            return peer, None, f"its certificate names role {peer.role!r}, not {issued.role!r}"
        return peer, issued.vm, ""

    def _refuse(self, op: str, peer: Peer, why: str) -> dict[str, Any]:
        self.refused.append((op, peer.name))
        if self.scheduler is not None:
            self.scheduler.log_event(
                TOPIC, make_event("control-refused", action=op, vm=None, sender=peer.name)
            )
        return refusal(op, peer, why)

    # -- RPC -----------------------------------------------------------------------------------------
    def _check(self, op: str, comm: Any, kwargs: dict[str, Any]) -> Any:
        peer, vm, why = self._identify(comm)
        if peer is None:
            return None
        if why:
            return self._refuse(op, peer, why)
        if peer.role == ROLE_CLIENT:
            return None
        if peer.role not in VM_ROLES or op not in WORKER_OPS:
            return self._refuse(op, peer, "only a client's certificate may ask it")
        other = self._not_its_own(op, vm, kwargs)
        if other is not None:
            return self._refuse(op, peer, f"it names {other!r}, not its own VM {vm!r}")
        return None

    def _names(self, addresses: Iterable[Any]) -> list[str]:
        workers = self.scheduler.workers if self.scheduler is not None else {}
        out = []
        for address in addresses:
            ws = workers.get(address)
            if ws is not None:  # an address the scheduler does not know asks nothing of it
                out.append(str(ws.name))
        return out

    def _not_its_own(self, op: str, vm: str | None, kwargs: dict[str, Any]) -> str | None:
        """The VM an operation of a VM's certificate names that is not its own, if any."""
        if vm is None:
            return None  # a CA that does not know VMs (no CA): the role is all there is
        named: list[str] = []
        if op == "register-worker":
            named = [str(kwargs.get("name"))]
        elif op in ("heartbeat_worker", "unregister"):
            named = self._names([kwargs.get("address")])
        elif op == "set_resources":
            named = self._names([kwargs.get("worker")])
        elif op == "retire_workers":
            workers, names = kwargs.get("workers"), kwargs.get("names")
            if workers is None and names is None:
                return "whichever workers the scheduler picks"
            named = self._names(workers or ()) + [str(n) for n in names or ()]
        return next((n for n in named if n != vm), None)

    def _streaming(self, handler: Callable[..., Any]) -> Callable[..., Any]:
        """``handler`` (a client's or a worker's registration) with its peer known to the stream
        handlers for as long as its stream lasts."""

        async def register(comm: Any, *args: Any, **kwargs: Any) -> Any:
            peer, _, _ = self._identify(comm)
            token = _STREAM_PEER.set(peer)
            try:
                result = handler(comm, *args, **kwargs)
                if inspect.isawaitable(result):
                    result = await result
                return result
            finally:
                _STREAM_PEER.reset(token)

        register.__signature__ = inspect.signature(handler)  # type: ignore[attr-defined]
        register.__name__ = getattr(handler, "__name__", "register")
        register.__transient_guarded__ = handler  # type: ignore[attr-defined]
        return register

    # -- streams -------------------------------------------------------------------------------------
    def _stream_refused(self, op: str) -> bool:
        peer = _STREAM_PEER.get()
        if peer is None or peer.role == ROLE_CLIENT:
            # No TLS, a client's stream, or a call from the scheduler itself.
            if peer is not None and self.ca is not None and self.ca.lookup(peer.serial) is None:
                self._refuse(op, peer, "its certificate was revoked")
                return True
            return False
        if peer.role in VM_ROLES and (op in WORKER_STREAM_OPS or op in WORKER_CLIENT_STREAM_OPS):
            if self.ca is not None and self.ca.lookup(peer.serial) is None:
                self._refuse(op, peer, "its certificate was revoked (its VM is gone)")
                return True
            return False
        self._refuse(op, peer, "a VM's streams carry no client operations")
        return True

    def _guard_stream(self, op: str, handler: Callable[..., Any]) -> Callable[..., Any]:
        if inspect.iscoroutinefunction(handler):

            async def guarded_async(*args: Any, **kwargs: Any) -> Any:
                if self._stream_refused(op):
                    return None
                return await handler(*args, **kwargs)

            return guarded_async

        def guarded_sync(*args: Any, **kwargs: Any) -> Any:
            if self._stream_refused(op):
                return None
            return handler(*args, **kwargs)

        return guarded_sync
