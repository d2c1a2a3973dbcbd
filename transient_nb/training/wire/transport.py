"""How a data-plane connection is made, and who may make one.

Two transports, both from the standard library:

- ``unix``: a Unix domain socket in a folder of its own (mode 0700, the socket 0600), for a
  trainer on the PS's host. Only this user can reach it, and the server also checks the peer's
  uid (``SO_PEERCRED``). Nothing is encrypted: the bytes never leave the host's kernel.
- ``tls``: TCP with TLS 1.2+ (``ssl``), mutually authenticated with the cluster's certificates,
  the very ones the worker's Dask comms use (its :class:`distributed.security.Security`: the
  cluster CA's certificate and the worker's own pair). A peer without a certificate from the
  cluster's CA fails the handshake. This is the path across hosts (GCE). The bulk then travels
  in a stream keyed inside that TLS session (:mod:`.sealed`: same cipher, larger records).

The backend tells its workers which transport the PS offers, through ``TRANSIENT_NB_DATA_PLANE``
(``unix`` on the local backend, ``tls`` on GCE) and, on GCE, the ports its firewall rule opens
(``TRANSIENT_NB_DATA_PORTS``); ``HParams.data_plane`` overrides it per run (``dask`` keeps the
bytes on the Dask actor, as before the data plane).
"""

from __future__ import annotations

import logging
import os
import socket
import ssl
import struct
import tempfile
import time
from typing import Any

logger = logging.getLogger(__name__)

#: What a backend sets in its workers' environment: the transport the PS offers by default.
MODE_ENV = "TRANSIENT_NB_DATA_PLANE"
#: The TCP ports ("first:last") a TLS listener may take (where a firewall opens only those).
PORTS_ENV = "TRANSIENT_NB_DATA_PORTS"
#: ``HParams.data_plane`` values: the backend's choice, one transport, or the Dask actor.
MODES = ("auto", "unix", "tls", "dask")
#: Socket buffers asked for (the kernel caps them at ``net.core.[rw]mem_max``).
SOCKET_BUFFER = 4 << 20
#: The data plane's TLS: 1.2 with ECDHE and AES-128-GCM where Dask's settings allow it. Python
#: cannot pick TLS 1.3's cipher suite (it would be AES-256-GCM), and AES-128 costs ~10% less CPU
#: per byte here (benchmarks/NOTES.md, round thirteen); ECDHE keeps forward secrecy.
TLS_CIPHERS = "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256"
#: TCP keepalive: a peer whose host vanished (a partition) is noticed on an idle connection
#: after about ``IDLE + INTERVAL * COUNT`` seconds.
KEEPALIVE_IDLE_S, KEEPALIVE_INTERVAL_S, KEEPALIVE_COUNT = 10, 5, 3


def resolve_mode(setting: str) -> str:
    """The transport a PS offers for ``HParams.data_plane`` = ``setting`` on this worker.

    Examples
    --------
    >>> resolve_mode("dask"), resolve_mode("tls")
    ('dask', 'tls')
    """
    if setting not in MODES:
        raise ValueError(f"data_plane={setting!r}: use one of {', '.join(map(repr, MODES))}.")
    if setting != "auto":
        return setting
    mode = os.environ.get(MODE_ENV, "unix") or "unix"
    return mode if mode in MODES[1:] else "unix"


def host_id() -> str:
    """This host's identity (name and boot): a Unix socket is only of use on the same one."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


def port_range(text: str | None) -> list[int]:
    """Ports of a ``"first:last"`` (or one port) setting; ``[0]`` (any) when unset.

    Examples
    --------
    >>> port_range("41200:41202"), port_range(None)
    ([41200, 41201, 41202], [0])
    """
    if not text:
        return [0]
    first, _, last = text.partition(":")
    lo, hi = int(first), int(last or first)
    if not 0 < lo <= hi < 65536:
        raise ValueError(f"{PORTS_ENV}={text!r}: give a port or a range like '41200:41299'.")
    return list(range(lo, hi + 1))


def tune(sock: socket.socket) -> None:
    """Large socket buffers; on TCP no Nagle delay and keepalive probes."""
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER)
        except OSError:
            pass
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for name, value in (
            ("TCP_KEEPIDLE", KEEPALIVE_IDLE_S),
            ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL_S),
            ("TCP_KEEPCNT", KEEPALIVE_COUNT),
        ):
            if hasattr(socket, name):
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


# -- the two listeners ------------------------------------------------------------------------------
#: The prefix of a Unix socket's folder (in the temporary folder).
UNIX_PREFIX = "transient-nb-data-"
#: Seconds after which an empty socket folder is a PS that died before it bound its socket (or
#: between removing its socket and its folder): a live PS binds within microseconds.
EMPTY_GRACE_S = 600.0


def listen_unix(name: str) -> tuple[socket.socket, str]:
    """A Unix socket ``name`` in a new 0700 folder, mode 0600; returns it and its path.

    The folders of this user's sockets whose PS is gone go first (:func:`sweep_unix`).
    """
    sweep_unix()
    folder = tempfile.mkdtemp(prefix=UNIX_PREFIX)  # mkdtemp: 0700, this user's
    path = os.path.join(folder, f"{name}.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)  # the socket is never, even for a moment, open to others
    try:
        sock.bind(path)
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    sock.listen(64)
    return sock, path


def remove_unix(path: str) -> None:
    """Remove a socket made by :func:`listen_unix` and its folder."""
    for remove in (os.unlink, os.rmdir):
        try:
            remove(path)
        except OSError:
            pass
        path = os.path.dirname(path)


def _bound_unix_paths() -> set[str]:
    """The paths of every Unix socket bound on this host (Linux: ``/proc/net/unix``)."""
    with open("/proc/net/unix") as table:
        next(table)  # "Num RefCount Protocol Flags Type St Inode Path"
        rows = (line.rstrip("\n").split(maxsplit=7) for line in table)
        return {f[7] for f in rows if len(f) == 8}


def _refused(path: str) -> bool:
    """Whether nothing listens on the Unix socket at ``path`` (connecting is refused)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        return True
    except OSError:
        return False
    finally:
        probe.close()
    return False


def sweep_unix(root: str | None = None) -> list[str]:
    """Remove the folders of this user's data-plane sockets whose PS is gone; returns them.

    A PS killed outright (SIGKILL, the OOM killer, a preempted local VM) cannot remove its
    socket's folder, and a long-lived machine gathered hundreds of them. A folder goes only when
    it is this user's and every socket in it is provably dead: bound by no process on this host
    (``/proc/net/unix``, read after the folders are listed: a socket's file exists only once it
    is bound, so a live PS's socket is always in the table) and refusing a connection. An empty
    folder goes once it is :data:`EMPTY_GRACE_S` old: a live PS binds within microseconds of
    making it. Without ``/proc/net/unix`` (not Linux) no socket is removed.
    """
    root = root or tempfile.gettempdir()
    found: dict[str, list[str]] = {}
    try:
        entries = [e for e in os.scandir(root) if e.name.startswith(UNIX_PREFIX)]
    except OSError:
        return []
    now = time.time()
    for entry in entries:
        try:
            info = entry.stat(follow_symlinks=False)
            if not entry.is_dir(follow_symlinks=False) or info.st_uid != os.getuid():
                continue
            paths = [os.path.join(entry.path, n) for n in os.listdir(entry.path)]
        except OSError:
            continue  # removed meanwhile, or not ours to read
        if paths or now - info.st_mtime > EMPTY_GRACE_S:
            found[entry.path] = paths
    bound: set[str] = set()
    if any(found.values()):
        try:
            bound = _bound_unix_paths()
        except OSError:
            found = {folder: paths for folder, paths in found.items() if not paths}
    gone = []
    for folder, paths in found.items():
        dead = [p for p in paths if p.endswith(".sock") and p not in bound and _refused(p)]
        if len(dead) != len(paths):
            continue
        for path in dead:
            remove_unix(path)
        if not paths:
            try:
                os.rmdir(folder)
            except OSError:
                continue
        if not os.path.exists(folder):
            gone.append(folder)
    return gone


def listen_tcp(host: str, ports: list[int]) -> socket.socket:
    """A TCP listener on ``host`` at the first free port of ``ports``."""
    last: OSError | None = None
    for port in ports:
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as e:
            sock.close()
            last = e
            continue
        sock.listen(64)
        return sock
    raise OSError(f"No free data-plane port on {host} in {ports[0]}-{ports[-1]}: {last}")


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of a Unix socket."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[1])


# -- TLS with the cluster's certificates ------------------------------------------------------------
def tls_contexts(security: Any) -> tuple[ssl.SSLContext | None, ssl.SSLContext | None]:
    """The server and client TLS contexts of a worker's Dask ``Security`` (its certificates).

    Both require the peer's certificate, signed by the cluster's CA (Dask's own TLS settings:
    minimum version, ciphers). ``(None, None)`` when the worker has no TLS.
    """
    if security is None:
        return None, None
    try:
        server = security.get_listen_args("worker").get("ssl_context")
        client = security.get_connection_args("worker").get("ssl_context")
    except (OSError, ssl.SSLError, ValueError) as e:
        logger.warning("The worker's TLS certificates cannot be used: %r", e)
        return None, None
    for ctx in (server, client):
        if ctx is None:
            continue
        if ctx.verify_mode != ssl.CERT_REQUIRED:
            raise ValueError("The data plane needs TLS that verifies the peer's certificate.")
        if ctx.minimum_version <= ssl.TLSVersion.TLSv1_2 and not security.tls_ciphers:
            ctx.maximum_version = ssl.TLSVersion.TLSv1_2
            ctx.set_ciphers(TLS_CIPHERS)
    return server, client


def connect(endpoint: dict[str, Any], client_tls: ssl.SSLContext | None, timeout: float) -> Any:
    """A connected socket to a PS's data plane, over the best transport both ends have.

    ``endpoint`` is what the PS published (``host``, ``unix``, ``tls``). Returns
    ``(socket, transport)``, or ``(None, None)`` when there is none this trainer can use (the
    Dask actor then carries the bytes): a Unix socket on another host, TLS without certificates.
    Raises ``OSError`` when the transport is there but the PS does not answer on it.
    """
    path = endpoint.get("unix")
    if path and endpoint.get("host") == host_id():
        # On the PS's host: a socket that is gone is a PS that is gone (an OSError), not a
        # reason to take another path.
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        tune(sock)
        sock.settimeout(timeout)
        try:
            sock.connect(path)
        except OSError:
            sock.close()
            raise
        return sock, "unix"
    addr = endpoint.get("tls")
    if addr and client_tls is not None:
        raw = socket.create_connection((addr[0], int(addr[1])), timeout=timeout)
        try:
            tune(raw)
            sock = client_tls.wrap_socket(raw, server_hostname=None)
        except BaseException:
            raw.close()
            raise
        return sock, "tls"
    return None, None
