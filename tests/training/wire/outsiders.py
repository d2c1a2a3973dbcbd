"""Knocking on a PS's data plane as a member and as outsiders (shared by the wire's tests and the
backends' tests, which knock on a real cluster's PS)."""

from __future__ import annotations

import os
import socket
import ssl
from typing import Any

from transient_nb.backends.tls import ClusterCA
from transient_nb.training.wire.frame import MAGIC, PREFIX, PULL

#: A pull request with empty metadata: a member's PS answers it.
PULL_REQUEST = PREFIX.pack(MAGIC, PULL, 0, 0, 2) + b"{}"


def knock_tls(endpoint: dict[str, Any], context: ssl.SSLContext | None) -> bytes:
    """Send a pull over TLS with ``context`` (None: plain TCP); the reply's first byte (b"T" for
    a member), b"" when dropped. Raises what a refused handshake raises."""
    host, port = endpoint["tls"]
    raw = socket.create_connection((host, int(port)), timeout=10)
    try:
        sock = context.wrap_socket(raw) if context is not None else raw
        sock.settimeout(10)
        sock.sendall(PULL_REQUEST)
        return sock.recv(1)
    finally:
        raw.close()


def outsider_contexts(ca_file: str, outsider: dict[str, str]) -> dict[str, ssl.SSLContext | None]:
    """Clients that are not members: a certificate from another CA (the cluster's CA trusted),
    no certificate, and plain TCP."""
    other = ssl.create_default_context(cafile=ca_file)
    other.check_hostname = False
    other.load_cert_chain(outsider["cert"], outsider["key"])
    bare = ssl.create_default_context(cafile=ca_file)
    bare.check_hostname = False
    return {"another CA's certificate": other, "no certificate": bare, "plain TCP": None}


def refused(endpoint: dict[str, Any], context: ssl.SSLContext | None) -> bool:
    """Whether the data plane refuses this client (a failed handshake, or no answer)."""
    try:
        return knock_tls(endpoint, context) == b""
    except (ssl.SSLError, ConnectionError, OSError):
        return True


def assert_only_members_admitted(
    endpoint: dict[str, Any], ca: ClusterCA, folder: str, name: str
) -> None:
    """The TLS data plane at ``endpoint`` answers a holder of ``ca``'s worker certificate for
    ``name`` and refuses every outsider (another CA's certificate, none, plain TCP)."""
    member = ca.write_files(os.path.join(folder, "m"), name, role="worker")
    ctx = ssl.create_default_context(cafile=member["ca"])
    ctx.check_hostname = False
    ctx.load_cert_chain(member["cert"], member["key"])
    assert knock_tls(endpoint, ctx) == b"T"  # a holder of the cluster's certificate
    outsider = ClusterCA.create("intruder").write_files(
        os.path.join(folder, "x"), name, role="worker"
    )
    for who, context in outsider_contexts(member["ca"], outsider).items():
        assert refused(endpoint, context), who


def knock_unix_as_nobody(path: str) -> str:
    """Try the Unix socket from a child process of uid/gid 65534 (needs root): "no entry" (the
    folder's and the socket's modes kept it out), "dropped" (in, then closed unanswered) or
    "answered"."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 3
        try:
            os.setgid(65534)
            os.setuid(65534)
            s = socket.socket(socket.AF_UNIX)
            s.settimeout(10)
            s.connect(path)
            s.sendall(PULL_REQUEST)
            code = 0 if s.recv(1) else 2
        except PermissionError:
            code = 1
        except OSError:
            code = 2
        os._exit(code)
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    return {0: "answered", 1: "no entry", 2: "dropped"}.get(code, f"failed ({code})")
