"""The TLS data plane's bulk stream: AES-128-GCM records of up to 1 MiB, keyed inside the TLS
session.

Python's ``ssl`` moves bytes in TLS records of 16 KiB: 450 records, and as many trips through
OpenSSL's record layer (a copy each way), per 7.4 MB gradient. That costs the PS ~7.8 ms of CPU
per round trip of the 1.86M model, against ~4.2 ms for the same AES-128-GCM over 1 MiB records
(``cryptography``'s AEAD, straight into the receiver's buffer; benchmarks/NOTES.md, issue 29). So
a connection is made as before (TCP, mutual TLS with the cluster's certificates: only members get
this far), both ends then agree on fresh keys *inside* that TLS session (a ``SEAL`` frame each
way, 32 random bytes from each end) and take TLS down (``unwrap``: close_notify both ways); from
there every byte travels in this module's records.

What a record is: a 4-byte little-endian plaintext length ``n`` (at most :data:`RECORD`), then
``n`` bytes of AES-128-GCM ciphertext and its 16-byte tag; the length is the record's associated
data, the nonce the record's number in its direction. What that keeps of TLS:

- confidentiality and integrity (AES-128-GCM, the data plane's TLS cipher), the length included;
- no reordering, replay, drop or reflection: the nonce is an implicit counter and each direction
  has its own key, so any of those fails the tag and the connection is dropped;
- mutual authentication and forward secrecy: the keys come from randomness exchanged in the
  mutually authenticated ECDHE session (HKDF-SHA256 over both ends' contributions), are fresh
  per connection and live only in the two processes' memory;
- key limits: the key changes every :data:`EPOCH_RECORDS` records (64 GiB; RFC 8446 §5.5 allows
  about 2^38 bytes per AES-GCM key), which TLS 1.2 itself never does.

A truncated stream is a broken connection (the frame it cuts was not through), as it was.
"""

from __future__ import annotations

import secrets
import socket
import struct
from collections.abc import Sequence
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from transient_nb.training.wire.frame import FrameError

#: Largest plaintext of one record (bytes): large enough that per-record costs vanish, small
#: enough that a record in flight stays in the CPU's cache.
RECORD = 1 << 20
#: Records per key: the key of each direction is derived afresh after this many.
EPOCH_RECORDS = 1 << 16
#: Random bytes each end contributes to the keys.
NONCE_BYTES = 32
TAG = 16
HEAD = struct.Struct("<I")
INFO = b"transient_nb data plane v1"


class SealError(ConnectionError):
    """A record failed authentication, or is not one (the connection is dropped)."""


def contribution() -> bytes:
    """This end's random share of a connection's keys."""
    return secrets.token_bytes(NONCE_BYTES)


def share_of(meta: dict[str, Any]) -> bytes:
    """The peer's key share, from the metadata of its ``SEAL`` frame (a frame without one is
    a broken frame: :class:`~transient_nb.training.wire.frame.FrameError`)."""
    try:
        return bytes.fromhex(str(meta["share"]))
    except (KeyError, ValueError):
        raise FrameError("A key exchange without a key share.") from None


def derive(client: bytes, server: bytes) -> tuple[bytes, bytes]:
    """The master secrets ``(client to server, server to client)`` of a connection.

    Examples
    --------
    >>> a, b = derive(b"c" * 32, b"s" * 32)
    >>> len(a), len(b), a != b
    (32, 32, True)
    """
    if len(client) != NONCE_BYTES or len(server) != NONCE_BYTES:
        raise SealError("Bad key contribution.")
    okm = HKDF(hashes.SHA256(), 64, salt=None, info=INFO).derive(client + server)
    return okm[:32], okm[32:]


def _epoch_key(master: bytes, epoch: int) -> AESGCM:
    key = HKDF(hashes.SHA256(), 16, salt=None, info=INFO + struct.pack("<Q", epoch)).derive(master)
    return AESGCM(key)


class _Direction:
    """One direction's key schedule and record counter."""

    def __init__(self, master: bytes):
        self._master = master
        self.count = 0
        self._epoch = -1
        self._aead: AESGCM | None = None

    def next(self) -> tuple[AESGCM, bytes]:
        """The AEAD and nonce of the next record."""
        epoch = self.count // EPOCH_RECORDS
        if epoch != self._epoch or self._aead is None:
            self._aead, self._epoch = _epoch_key(self._master, epoch), epoch
        nonce = struct.pack(">IQ", 0, self.count)
        self.count += 1
        return self._aead, nonce


class SealedSocket:
    """A connected TCP socket whose bytes travel in sealed records (the socket calls
    :class:`~transient_nb.training.wire.frame.Channel` makes: ``send``, ``recv_into``, timeouts).

    An interrupted call (a timeout, or ``BlockingIOError`` on a non-blocking socket) keeps its
    progress: ``send`` is offered the same bytes again and goes on with the record it sealed;
    ``recv_into`` goes on reading the record it started.

    Examples
    --------
    >>> a, b = socket.socketpair()
    >>> ka, kb = derive(b"c" * 32, b"s" * 32)
    >>> client, server = SealedSocket(a, ka, kb), SealedSocket(b, kb, ka)
    >>> client.send(b"hello")
    5
    >>> buf = bytearray(5)
    >>> server.recv_into(memoryview(buf)), bytes(buf)
    (5, b'hello')
    >>> client.close(); server.close()
    """

    def __init__(self, sock: socket.socket, send_key: bytes, recv_key: bytes):
        self.sock = sock
        self.family = sock.family
        self._out = _Direction(send_key)
        self._in = _Direction(recv_key)
        # Sending: the sealed record not yet all out, and how many plaintext bytes it holds.
        self._wbuf = bytearray(HEAD.size + RECORD + TAG)
        self._pending: memoryview | None = None
        self._pending_n = 0
        self._sealed = bytearray(0)  # whole frames sealed ahead (:meth:`seal`)
        # Receiving: the record being read, and plaintext left over from the last one.
        self._head = bytearray(HEAD.size)
        self._head_at = 0
        self._rbuf = bytearray(RECORD + TAG)
        self._need = -1  # bytes of the record's body (ciphertext and tag); -1: head first
        self._body_at = 0
        self._plain = bytearray(RECORD)
        self._left: memoryview = memoryview(self._plain)[:0]

    # -- the socket's own calls -----------------------------------------------------------------
    def settimeout(self, value: float | None) -> None:
        self.sock.settimeout(value)

    def setblocking(self, flag: bool) -> None:
        self.sock.setblocking(flag)

    def fileno(self) -> int:
        return self.sock.fileno()

    def shutdown(self, how: int) -> None:
        self.sock.shutdown(how)

    def close(self) -> None:
        self.sock.close()

    def getpeername(self) -> Any:
        return self.sock.getpeername()

    # -- sealed I/O -------------------------------------------------------------------------------
    def send(self, data: Any) -> int:
        """Seal up to :data:`RECORD` bytes of ``data`` into one record and send all of it; the
        plaintext bytes it took."""
        if self._pending is None:
            view = memoryview(data).cast("B")
            n = min(len(view), RECORD)
            if n == 0:
                return 0
            aead, nonce = self._out.next()
            out = memoryview(self._wbuf)
            head = HEAD.pack(n)
            out[: HEAD.size] = head
            aead.encrypt_into(nonce, view[:n], head, out[HEAD.size : HEAD.size + n + TAG])
            self._pending, self._pending_n = out[: HEAD.size + n + TAG], n
        pending = self._pending
        while len(pending):
            sent = self.sock.send(pending)  # a timeout here keeps what is left for the next call
            pending = pending[sent:]
            self._pending = pending
        self._pending = None
        return self._pending_n

    def seal(self, parts: Sequence[Any]) -> memoryview:
        """Seal ``parts`` (a frame's head and arrays, in order) into records now, the same
        records :meth:`send` would make of them; the ciphertext, for the caller to send on
        :attr:`sock` as it is. Valid until the next call."""
        if self._pending is not None:
            raise RuntimeError("A sealed record is still being sent.")
        views = [memoryview(p).cast("B") for p in parts]
        views = [v for v in views if len(v)]
        size = sum(len(v) + -(-len(v) // RECORD) * (HEAD.size + TAG) for v in views)
        if len(self._sealed) < size:
            self._sealed = bytearray(size)
        out = memoryview(self._sealed)
        at = 0
        for view in views:
            for start in range(0, len(view), RECORD):
                chunk = view[start : start + RECORD]
                n = len(chunk)
                aead, nonce = self._out.next()
                head = HEAD.pack(n)
                out[at : at + HEAD.size] = head
                at += HEAD.size
                aead.encrypt_into(nonce, chunk, head, out[at : at + n + TAG])
                at += n + TAG
        return out[:at]

    def sendall(self, data: Any) -> None:
        view = memoryview(data).cast("B")
        while len(view):
            view = view[self.send(view) :]

    def recv_into(self, buffer: Any, nbytes: int = 0) -> int:
        """Fill ``buffer`` with what the next record holds (or what is left of the last one);
        0 at the end of the stream."""
        view = memoryview(buffer).cast("B")
        if nbytes:
            view = view[:nbytes]
        if not len(view):
            return 0
        if len(self._left):
            n = min(len(view), len(self._left))
            view[:n] = self._left[:n]
            self._left = self._left[n:]
            return n
        if self._need < 0:
            while self._head_at < HEAD.size:
                got = self.sock.recv_into(memoryview(self._head)[self._head_at :])
                if not got:
                    if self._head_at:
                        raise SealError("The data-plane stream ended inside a record.")
                    return 0
                self._head_at += got
            (n,) = HEAD.unpack(self._head)
            if not 0 < n <= RECORD:
                raise SealError(f"Not a sealed record ({n} bytes).")
            self._need, self._body_at = n + TAG, 0
        body = memoryview(self._rbuf)[: self._need]
        while self._body_at < self._need:
            got = self.sock.recv_into(body[self._body_at :])
            if not got:
                raise SealError("The data-plane stream ended inside a record.")
            self._body_at += got
        n = self._need - TAG
        self._need, self._head_at = -1, 0
        aead, nonce = self._in.next()
        direct = len(view) >= n
        target = view[:n] if direct else memoryview(self._plain)[:n]
        try:
            aead.decrypt_into(nonce, body, bytes(self._head), target)
        except InvalidTag:
            raise SealError("A data-plane record failed authentication.") from None
        if direct:
            return n
        k = len(view)
        view[:] = target[:k]
        self._left = target[k:]
        return k
