"""The sealed stream the TLS data plane moves its bytes in once the keys are agreed."""

from __future__ import annotations

import socket
import ssl
import threading
from typing import Any

import numpy as np
import pytest

from tests.conftest import wait_for_sync
from transient_nb.training.wire import frame, sealed
from transient_nb.training.wire.client import DataClient
from transient_nb.training.wire.codec import to_wire
from transient_nb.training.wire.server import DataServer
from transient_nb.training.wire.transport import tls_contexts


def _pair() -> tuple[sealed.SealedSocket, sealed.SealedSocket, socket.socket, socket.socket]:
    a, b = socket.socketpair()
    to_b, to_a = sealed.derive(sealed.contribution(), sealed.contribution())
    return sealed.SealedSocket(a, to_b, to_a), sealed.SealedSocket(b, to_a, to_b), a, b


def test_frames_cross_in_records_larger_than_tls_and_no_byte_is_in_the_clear():
    x, y, _, raw_b = _pair()
    grad = np.arange(3 * sealed.RECORD // 4 + 5, dtype=np.float32)  # 3 records and a bit
    cx, cy = frame.Channel(x), frame.Channel(y)  # type: ignore[arg-type]
    cx.unix = cy.unix = False  # a socketpair is a Unix one; the sealed stream runs over TCP
    got: list[object] = []
    reader = threading.Thread(
        target=lambda: got.append(frame.drive(cy, cy.recv_frame(frame.Buffers()), 10))
    )
    reader.start()
    frame.drive(cx, cx.send_frame(frame.PUSH_PULL, {"trainer": "w-0"}, [grad]), 10)
    reader.join(10)
    kind, meta, arrays = got[0]  # type: ignore[misc]
    assert (kind, meta) == (frame.PUSH_PULL, {"trainer": "w-0"})
    assert np.array_equal(arrays[0], grad)
    # What travels is not the plaintext: seal a known pattern and read the raw bytes.
    x.sendall(b"gradient-bytes " * 100)
    raw = raw_b.recv(1 << 16)
    assert b"gradient-bytes" not in raw and len(raw) == sealed.HEAD.size + 1500 + sealed.TAG


def test_a_tampered_replayed_or_reflected_record_drops_the_connection():
    x, y, raw_a, raw_b = _pair()
    buf = bytearray(64)
    # Tampered: a bit flipped in the ciphertext.
    x.send(b"hello")
    record = bytearray(raw_b.recv(100))
    record[6] ^= 1
    raw_a.sendall(record)
    with pytest.raises(sealed.SealError, match="authentication"):
        y.recv_into(buf)
    # Replayed: the same record twice (the second has the wrong number).
    x2, y2, _, raw_b2 = _pair()
    x2.send(b"hello")
    record = raw_b2.recv(100)
    a, b = socket.socketpair()
    a.sendall(record + record)
    y3 = sealed.SealedSocket(b, b"k" * 32, y2._in._master)
    assert y3.recv_into(buf) == 5 and bytes(buf[:5]) == b"hello"
    with pytest.raises(sealed.SealError):
        y3.recv_into(buf)
    # Reflected: a record sent back to its sender (the other direction has another key).
    x4, _, _raw_a4, raw_b4 = _pair()
    x4.send(b"hello")
    raw_b4.sendall(raw_b4.recv(100))
    with pytest.raises(sealed.SealError):
        x4.recv_into(buf)
    # Not a record at all: a length over the bound.
    x5, y5, raw_a5, _ = _pair()
    raw_a5.sendall(sealed.HEAD.pack(sealed.RECORD + 1) + b"\0" * 32)
    with pytest.raises(sealed.SealError, match="Not a sealed record"):
        y5.recv_into(buf)
    for s in (x, y, x2, y2, y3, x4, x5, y5, a):
        s.close()


def test_an_interrupted_send_or_receive_goes_on_where_it_stopped():
    x, y, _raw_a, _raw_b = _pair()
    payload = np.random.default_rng(0).integers(0, 255, 3 << 20, dtype=np.uint8)
    x.settimeout(0.05)
    sent, stalls = 0, 0
    out = bytearray(len(payload))
    got = 0
    view = memoryview(out)
    y.settimeout(0.05)
    while got < len(payload):  # one thread: each side times out while the other is behind
        if sent < len(payload):
            try:
                sent += x.send(memoryview(payload)[sent:])
            except TimeoutError:
                stalls += 1
        try:
            got += y.recv_into(view[got:])
        except TimeoutError:
            stalls += 1
    assert stalls and bytes(out) == payload.tobytes()
    for s in (x, y):
        s.close()


def test_the_keys_change_every_epoch(monkeypatch):
    monkeypatch.setattr(sealed, "EPOCH_RECORDS", 2)
    x, y, _raw_a, _raw_b = _pair()
    buf = bytearray(8)
    for i in range(5):
        x.send(b"%d" % i)
        assert y.recv_into(buf) == 1 and buf[:1] == b"%d" % i
    assert x._out._epoch == 2
    for s in (x, y):
        s.close()


def test_a_tls_trainer_seals_its_connection_and_a_plain_tls_peer_still_gets_answers(
    ps, loop, certs
):
    server = DataServer(ps, loop, "tls", "seal", server_tls=tls_contexts(certs["ps"])[0])
    client = DataClient(server.endpoint, tls_contexts(certs["trainer"])[1])
    try:
        assert isinstance(client.channel.sock, sealed.SealedSocket)
        w, _, version = client.pull("w-0").result(30)
        grad = np.ones_like(w)
        for step in range(1, 4):
            w2, _, v2 = client.push_pull(
                trainer="w-0", grad=grad, base_version=version, local_step=step
            ).result(30)
        assert v2 == version + 3 and w2.shape == w.shape
        # A second key exchange on a sealed connection is not one: the connection is dropped.
        chan = client.channel
        frame.drive(chan, chan.send_frame(frame.SEAL, {"share": "00" * 32}, []), 10)
        with pytest.raises(ConnectionError):
            frame.drive(chan, chan.recv_frame(frame.Buffers()), 10)
        wait_for_sync(lambda: server.refused >= 1, timeout=10, message="the server never refused")
        assert server.refused == 1
        # A peer that speaks the frames over TLS without sealing is served as before.
        ctx = tls_contexts(certs["trainer"])[1]
        raw = socket.create_connection(tuple(server.endpoint["tls"]), timeout=10)
        tls = ctx.wrap_socket(raw, server_hostname=None)
        plain = frame.Channel(tls)
        frame.drive(plain, plain.send_frame(frame.PULL, {"trainer": "w-1"}, []), 10)
        kind, meta, _arrays = frame.drive(plain, plain.recv_frame(frame.Buffers()), 10)
        assert kind == frame.REPLY and meta["version"] == v2
        assert isinstance(plain.sock, ssl.SSLSocket)
        plain.close()
    finally:
        client.close()
        server.close()


class _Counting:
    """A PS whose every entry is its version after each update; its reply is ``to_wire`` of its
    weights, as the real PS's."""

    def __init__(self, n: int):
        self.w = np.zeros(n, np.float32)
        self.version = 0

    async def push_pull(self, *, grad: Any, **_: Any) -> Any:
        self.w += 1
        self.version += 1
        return to_wire(self.w, "float32"), None, self.version

    async def pull(self, trainer: Any = None) -> Any:
        return to_wire(self.w, "float32"), None, self.version


def test_a_reply_sealed_from_the_live_weights_is_the_weights_of_its_version(loop, certs):
    """The float32 reply is encrypted from the PS's own weights (no copy) on the PS's loop:
    with trainers pushing at once, every reply still holds exactly its version's weights."""
    ps = _Counting(3 * sealed.RECORD // 4)  # 3 records: a reply takes a while to seal
    server = DataServer(ps, loop, "tls", "live", server_tls=tls_contexts(certs["ps"])[0])
    bad: list[str] = []

    def trainer(name: str) -> None:
        client = DataClient(server.endpoint, tls_contexts(certs["trainer"])[1])
        grad = np.zeros_like(ps.w)
        for step in range(1, 16):
            w, _, version = client.push_pull(
                trainer=name, grad=grad, base_version=0, local_step=step
            ).result(30)
            if not (w.min() == w.max() == version):
                bad.append(f"{name}: version {version}, weights {w.min()}..{w.max()}")
        client.close()

    threads = [threading.Thread(target=trainer, args=(f"w-{i}",)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    server.close()
    assert ps.version == 45 and not bad, bad
