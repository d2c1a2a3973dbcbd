"""The guard of every worker and nanny: what other VMs of the cluster may ask of it.

``--preload transient_nb.worker.guard`` (a worker) and ``--preload-nanny
transient_nb.worker.guard`` (its nanny). Workers talk to each other for data and actors: a trainer
calls its PS actor (``actor_execute``), a worker fetches what a task needs from another
(``get_data``). Nothing else is theirs to ask. So an operation other than those
(:data:`PEER_OPS`) is answered only for the scheduler (its certificate's role is ``head``), a
client (the driver, a notebook: ``client``), or the same VM (a worker and its own nanny share the
VM's certificate); any other certificate gets a ``PermissionError``: running a function
(``run``, ``run_coroutine``), adding a plugin, opening a stream of tasks (``connection_stream``),
closing the worker, a preemption notice (``transient_notice``)...

What this does not protect against: Dask's workers unpickle what arrives on their comms before
any handler sees it (the data plane is pickle), so root on one worker VM, who holds its key, can
still craft a message that runs code in another worker, the PS included. The guard keeps roles
apart for every peer that speaks Dask's protocol as written; the scheduler, which does not
unpickle on arrival, is guarded for real (:mod:`transient_nb.deploy.guard`).
"""

from __future__ import annotations

import logging
from typing import Any

from transient_nb.worker.peers import ROLE_CLIENT, ROLE_HEAD, guarded, peer_of, refusal

logger = logging.getLogger(__name__)

#: What another VM of the cluster may ask of a worker: data, actors, and harmless look-ups.
PEER_OPS = frozenset(
    {
        "get_data",
        "actor_execute",
        "actor_attribute",
        "ping",
        "identity",
        "versions",
        "keys",
        # Dask's p2p shuffles move data between workers (not used by training, allowed anyway).
        "shuffle_receive",
        "shuffle_inputs_done",
    }
)
#: Roles that may ask a worker anything: the scheduler and the cluster's clients.
TRUSTED_ROLES = frozenset({ROLE_HEAD, ROLE_CLIENT})


def own_name(server: Any) -> str | None:
    """The common name of ``server``'s own certificate (a worker's, or its nanny's: the VM's)."""
    security = getattr(server, "security", None)
    cert = getattr(security, "tls_worker_cert", None) if security is not None else None
    if not cert:
        return None
    try:
        from cryptography import x509
        from cryptography.x509.oid import NameOID

        if "-----BEGIN" in cert:
            pem = cert.encode()
        else:
            with open(cert, "rb") as f:
                pem = f.read()
        names = x509.load_pem_x509_certificate(pem).subject.get_attributes_for_oid(
            NameOID.COMMON_NAME
        )
        return str(names[0].value) if names else None
    except (OSError, ValueError) as e:
        logger.warning("Could not read this worker's own certificate (%s): %r", cert, e)
        return None


def install(server: Any) -> None:
    """Guard every handler of ``server`` (a Worker or a Nanny) but :data:`PEER_OPS`."""
    me = own_name(server)

    def check(op: str, comm: Any, kwargs: dict[str, Any]) -> Any:
        peer = peer_of(comm)
        if peer is None or peer.role in TRUSTED_ROLES or (me is not None and peer.name == me):
            return None
        return refusal(op, peer, "only the scheduler and the cluster's clients may ask it")

    for op, handler in list(server.handlers.items()):
        if op in PEER_OPS or hasattr(handler, "__transient_guarded__"):
            continue
        server.handlers[op] = guarded(op, handler, check)


def dask_setup(server: Any) -> None:
    """Dask preload entry point, for a worker (``--preload``) and a nanny (``--preload-nanny``)."""
    install(server)
