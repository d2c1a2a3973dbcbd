"""Transports: who may connect (a 0700 folder and a 0600 socket; TLS with the cluster's
certificates only), which one a trainer takes, and the settings a backend passes down."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import ssl
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from transient_nb.training.wire import transport
from transient_nb.training.wire.transport import (
    MODE_ENV,
    PORTS_ENV,
    TLS_CIPHERS,
    connect,
    host_id,
    listen_tcp,
    listen_unix,
    peer_uid,
    port_range,
    remove_unix,
    resolve_mode,
    sweep_unix,
    tls_contexts,
)


def test_the_backend_picks_the_transport_unless_the_run_names_one(monkeypatch):
    monkeypatch.delenv(MODE_ENV, raising=False)
    assert resolve_mode("auto") == "unix"  # one host unless a backend says otherwise
    monkeypatch.setenv(MODE_ENV, "tls")
    assert resolve_mode("auto") == "tls"
    assert resolve_mode("unix") == "unix" and resolve_mode("dask") == "dask"
    monkeypatch.setenv(MODE_ENV, "carrier-pigeon")
    assert resolve_mode("auto") == "unix"
    with pytest.raises(ValueError, match="use one of 'auto', 'unix', 'tls', 'dask'"):
        resolve_mode("tcp")


def test_port_ranges(monkeypatch):
    assert port_range("41200:41202") == [41200, 41201, 41202]
    assert port_range("41200") == [41200] and port_range("") == [0]
    for bad in ("0:3", "5:4", "70000"):
        with pytest.raises(ValueError, match=PORTS_ENV):
            port_range(bad)


def test_a_unix_listener_is_this_users_only_and_goes_without_a_trace():
    sock, path = listen_unix("ps-0")
    folder = os.path.dirname(path)
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_ISSOCK(os.stat(path).st_mode)
    peer = socket.socket(socket.AF_UNIX)
    peer.connect(path)
    conn, _ = sock.accept()
    assert peer_uid(conn) == os.getuid()
    for s in (peer, conn, sock):
        s.close()
    remove_unix(path)
    assert not os.path.exists(folder)


_LISTENER = (
    "import sys\n"
    "from transient_nb.training.wire.transport import listen_unix\n"
    "sock, path = listen_unix('ps-0')\n"
    "print(path, flush=True)\n"
    "sys.stdin.read()\n"  # held open until the test closes stdin (or kills it)
)


def _listener(tmp: str) -> tuple[subprocess.Popen[str], str]:
    """A process that listens on a data-plane socket in ``tmp``; returns it and the path."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _LISTENER],
        env={**os.environ, "TMPDIR": tmp},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


@pytest.fixture
def short_tmp():
    """A temporary folder with a short path (a Unix socket's path is at most 107 bytes, and
    pytest's ``tmp_path`` under xdist is longer than that leaves room for)."""
    folder = tempfile.mkdtemp(prefix="tnb-")
    yield Path(folder)
    shutil.rmtree(folder, ignore_errors=True)


def test_a_sweep_removes_the_folders_of_killed_listeners_only(short_tmp):
    tmp_path = short_tmp
    tmp = str(tmp_path)
    killed, dead = _listener(tmp)
    alive, live = _listener(tmp)
    try:
        killed.send_signal(signal.SIGKILL)
        killed.wait(30)
        assert os.path.exists(dead)  # a killed PS leaves its folder behind
        # A folder between mkdtemp and bind, another user's dead socket, something else.
        empty = tmp_path / "transient-nb-data-empty"
        empty.mkdir(mode=0o700)
        # An empty folder older than any PS could be before it binds: it died there.
        stale = tmp_path / "transient-nb-data-stale"
        stale.mkdir(mode=0o700)
        old = time.time() - transport.EMPTY_GRACE_S - 60
        os.utime(stale, (old, old))
        theirs = tmp_path / "transient-nb-data-theirs"
        theirs.mkdir(mode=0o700)
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(theirs / "ps-0.sock"))
        sock.close()  # dead: bound by nobody now
        os.chown(theirs, os.getuid() + 4242, -1)
        # A PS between bind() and listen(): refused, but bound, so alive.
        binding = tmp_path / "transient-nb-data-binding"
        binding.mkdir(mode=0o700)
        half = socket.socket(socket.AF_UNIX)
        half.bind(str(binding / "ps-0.sock"))
        other = tmp_path / "transient-nb-data-notes"
        other.mkdir()
        (other / "notes.txt").write_text("not a socket")

        assert sorted(sweep_unix(tmp)) == sorted([os.path.dirname(dead), str(stale)])
        assert not os.path.exists(os.path.dirname(dead))
        assert os.path.exists(live) and empty.exists() and other.exists()
        assert (theirs / "ps-0.sock").exists() and (binding / "ps-0.sock").exists()
        half.close()
        # The live one still serves.
        peer = socket.socket(socket.AF_UNIX)
        peer.connect(live)
        peer.close()
        assert sweep_unix(tmp) == [str(binding)]  # closed since: dead now
    finally:
        assert alive.stdin is not None
        alive.stdin.close()
        alive.wait(30)


def test_a_new_listener_sweeps_first(short_tmp, monkeypatch):
    tmp = str(short_tmp)
    killed, dead = _listener(tmp)
    killed.send_signal(signal.SIGKILL)
    killed.wait(30)
    monkeypatch.setattr(transport.tempfile, "tempdir", tmp)
    sock, path = listen_unix("ps-1")
    try:
        assert not os.path.exists(os.path.dirname(dead))
        assert os.path.dirname(os.path.dirname(path)) == tmp
    finally:
        sock.close()
        remove_unix(path)


def test_a_tcp_listener_takes_the_next_free_port_of_its_range():
    taken = listen_tcp("127.0.0.1", [0])
    port = taken.getsockname()[1]
    nxt = listen_tcp("127.0.0.1", [port, port + 1, port + 2])
    assert nxt.getsockname()[1] in (port + 1, port + 2)
    with pytest.raises(OSError, match="No free data-plane port"):
        listen_tcp("127.0.0.1", [port])
    taken.close()
    nxt.close()


def test_tls_contexts_verify_the_peer_and_prefer_aes128_on_tls12(certs):
    assert tls_contexts(None) == (None, None)
    server, client = tls_contexts(certs["ps"])
    for ctx in (server, client):
        assert ctx.verify_mode == ssl.CERT_REQUIRED
        assert ctx.maximum_version == ssl.TLSVersion.TLSv1_2
        # TLS 1.3 suites stay listed (OpenSSL always lists them) but are never negotiated.
        names = [c["name"] for c in ctx.get_ciphers() if not c["name"].startswith("TLS_")]
        assert names and all(n in TLS_CIPHERS for n in names)


def test_dask_settings_that_name_ciphers_or_tls13_are_kept(certs, tmp_path):
    from transient_nb.backends.tls import security_from_files

    paths = certs["ca"].write_files(str(tmp_path / "t"), "w-9", role="worker")
    sec = security_from_files(paths, "worker")
    sec.tls_min_version = ssl.TLSVersion.TLSv1_3
    server, _ = tls_contexts(sec)
    assert server.minimum_version == ssl.TLSVersion.TLSv1_3
    assert server.maximum_version != ssl.TLSVersion.TLSv1_2


def test_a_trainer_takes_the_unix_socket_on_the_ps_host_and_tls_elsewhere(certs):
    sock, path = listen_unix("ps-0")
    here = {"host": host_id(), "unix": path}
    conn, kind = connect(here, None, 5)
    assert kind == "unix"
    conn.close()
    # Another host: the socket is of no use; without TLS there is no path (the actor then).
    assert connect({"host": "elsewhere/1", "unix": path}, None, 5) == (None, None)
    tcp = listen_tcp("127.0.0.1", [0])
    far = {"host": "elsewhere/1", "unix": path, "tls": ["127.0.0.1", tcp.getsockname()[1]]}
    assert connect(far, None, 5) == (None, None)  # a TLS endpoint but no certificates
    # The PS's socket gone on its own host: the PS is gone (an error), not another path.
    sock.close()
    remove_unix(path)
    with pytest.raises(OSError):
        connect(here, None, 5)
    tcp.close()


def test_tune_sets_big_buffers_and_tcp_keepalive():
    s = socket.socket()
    transport.tune(s)
    assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    assert s.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE)
    assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == transport.KEEPALIVE_IDLE_S
    assert s.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) >= 1 << 20
    s.close()
