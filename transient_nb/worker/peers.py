"""Who is on the other end of a Dask comm: the role and the name its certificate names.

Every certificate a transient cluster's CA issues names its holder's role in its subject, as
its organisational unit (``OU``), set by the CA whatever the request asked for: ``client`` (the
driver, a notebook, the CLI, the panel), ``head`` (the scheduler, in the process that owns the
cluster), ``worker`` (a GPU worker's VM) or ``ps`` (a PS host). Its common name (``CN``) names
the holder (a VM's instance name, or ``transient-client``). Dask's TLS comms hand over the
peer's certificate once its chain is verified (``comm.extra_info["peercert"]``, Python's
:meth:`ssl.SSLSocket.getpeercert` form), so a server reads who it talks to with
:func:`peer_of`, and refuses operations by role with :func:`guarded`.

The scheduler's guard (:mod:`transient_nb.deploy.guard`) and the workers' own
(:mod:`transient_nb.worker.guard`) are built on this module; it is here, in the lowest layer that
needs it, because a worker's preload may not import the cluster.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

#: The roles a certificate may name (its subject's OU).
ROLE_CLIENT = "client"
ROLE_HEAD = "head"
ROLE_WORKER = "worker"
ROLE_PS = "ps"
ROLES = (ROLE_CLIENT, ROLE_HEAD, ROLE_WORKER, ROLE_PS)
#: Roles of VMs: they run Dask workers, and take part in the data plane only.
VM_ROLES = frozenset({ROLE_WORKER, ROLE_PS})


@dataclass(frozen=True)
class Peer:
    """The holder of a peer's certificate.

    Attributes
    ----------
    name
        Its common name (a VM's instance name, or ``transient-client``).
    role
        The role its certificate names (:data:`ROLES`), or None when it names none.
    serial
        The certificate's serial number (the CA knows which VM it was issued to).
    """

    name: str
    role: str | None
    serial: int | None


def peer_from_cert(cert: dict[str, Any]) -> Peer:
    """The :class:`Peer` of a certificate in :meth:`ssl.SSLSocket.getpeercert`'s form.

    Examples
    --------
    >>> cert = {"subject": ((("commonName", "demo-w-0"),), (("organizationalUnitName", "worker"),)),
    ...         "serialNumber": "1F"}
    >>> peer_from_cert(cert)
    Peer(name='demo-w-0', role='worker', serial=31)
    """
    fields: dict[str, str] = {}
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            fields.setdefault(str(key), str(value))
    role = fields.get("organizationalUnitName")
    serial = cert.get("serialNumber")
    try:
        number = int(str(serial), 16) if serial is not None else None
    except ValueError:
        number = None
    return Peer(fields.get("commonName", ""), role if role in ROLES else None, number)


def peer_of(comm: Any) -> Peer | None:
    """The :class:`Peer` at the other end of ``comm``; None on a comm without TLS.

    A comm without TLS has no identity: only a cluster that turned TLS off (the local
    backend's ``local.tls: false``) has such comms, and then nothing can be told apart.
    """
    cert = (getattr(comm, "extra_info", None) or {}).get("peercert")
    if not cert:
        return None
    return peer_from_cert(cert)


def refusal(op: str, peer: Peer, why: str = "") -> dict[str, Any]:
    """The answer to a refused operation: Dask's error message, a ``PermissionError`` the
    caller's ``rpc`` raises (and nothing logged as a crash on this side)."""
    from distributed.core import error_message

    what = f"{peer.role or 'unknown'} certificate {peer.name!r}"
    text = f"Refused {op!r} from a {what}{f': {why}' if why else ''}."
    logger.warning(text)
    return dict(error_message(PermissionError(text), status="uncaught-error"))


def guarded(
    op: str, handler: Callable[..., Any], check: Callable[[str, Any, dict[str, Any]], Any]
) -> Callable[..., Any]:
    """``handler`` of an RPC ``op``, called only after ``check(op, comm, kwargs)`` lets it.

    ``check`` returns None to let the call through, or the answer to send instead (see
    :func:`refusal`). The wrapper always takes the comm (Dask passes it to a handler whose
    first parameter is named ``comm``) and keeps the rest of ``handler``'s signature, so Dask
    hands it the same keywords (``serializers`` included) as the handler itself. Called without a
    comm, from inside this process (a preload calling its own handler), ``check`` gets ``None``:
    no peer, nothing to refuse.
    """
    signature = inspect.signature(handler)
    params = list(signature.parameters.values())
    wants_comm = bool(params) and params[0].name == "comm"
    rest = params[1:] if wants_comm else params
    comm_param = inspect.Parameter("comm", inspect.Parameter.POSITIONAL_OR_KEYWORD)

    # ``comm`` None: a call from inside this process (a preload calling its own handler), which
    # no peer made.
    async def guard(comm: Any = None, *args: Any, **kwargs: Any) -> Any:
        answer = check(op, comm, kwargs)
        if answer is not None:
            return answer
        result = handler(comm, *args, **kwargs) if wants_comm else handler(*args, **kwargs)
        if inspect.isawaitable(result):
            result = await result
        return result

    guard.__name__ = getattr(handler, "__name__", op)
    guard.__qualname__ = getattr(handler, "__qualname__", op)
    guard.__doc__ = getattr(handler, "__doc__", None)
    guard.__signature__ = signature.replace(parameters=[comm_param, *rest])  # type: ignore[attr-defined]
    guard.__transient_guarded__ = handler  # type: ignore[attr-defined]
    return guard
