"""Tests for transient_nb.worker.peers: a peer's role and name, and guarded handlers."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

from transient_nb.worker.peers import Peer, guarded, peer_from_cert, peer_of, refusal


class Comm:
    def __init__(self, cert: dict[str, Any] | None):
        self.extra_info = {"peercert": cert} if cert is not None else {}


def cert(cn: str, ou: str | None = None, serial: str = "0A") -> dict[str, Any]:
    subject: list[Any] = [(("commonName", cn),)]
    if ou is not None:
        subject.append((("organizationalUnitName", ou),))
    return {"subject": tuple(subject), "serialNumber": serial}


def test_a_peer_is_read_from_its_certificate() -> None:
    assert peer_of(Comm(cert("demo-w-0", "worker", "FF"))) == Peer("demo-w-0", "worker", 255)
    assert peer_of(Comm(cert("transient-client", "client"))) == Peer(
        "transient-client", "client", 10
    )
    assert peer_of(Comm(None)) is None  # no TLS: no identity
    # A role the vocabulary does not know is no role; an OU cannot be smuggled in the CN.
    assert peer_from_cert(cert("x", "root")).role is None
    assert peer_from_cert(cert("client")).role is None


def test_a_guarded_handler_keeps_its_signature_and_asks_first() -> None:
    seen: list[tuple[str, Any]] = []

    def check(op: str, comm: Any, kwargs: dict[str, Any]) -> Any:
        seen.append((op, kwargs))
        return None if kwargs.get("ok") else refusal(op, Peer("w-0", "worker", 1), "no")

    async def with_comm(comm: Any, ok: bool = False, serializers: Any = None) -> str:
        return "with comm"

    def without_comm(ok: bool = False) -> str:
        return "without"

    a = guarded("a", with_comm, check)
    b = guarded("b", without_comm, check)
    # Dask hands the comm to a handler whose first parameter is "comm", and serializers to one
    # that names them: both must still hold.
    assert list(inspect.signature(a).parameters) == ["comm", "ok", "serializers"]
    assert list(inspect.signature(b).parameters) == ["comm", "ok"]
    assert asyncio.run(a(Comm(None), ok=True)) == "with comm"
    assert asyncio.run(b(Comm(None), ok=True)) == "without"
    answer = asyncio.run(b(Comm(None), ok=False))
    assert answer["status"] == "uncaught-error"
    assert "Refused 'b' from a worker certificate 'w-0': no." in str(answer)
    # From inside the process (a preload calling its own handler): no comm, no peer.
    assert asyncio.run(b(ok=True)) == "without"
    assert [op for op, _ in seen] == ["a", "b", "b", "b"]
