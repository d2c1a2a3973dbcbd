"""Frames of the data plane: one request or reply, and its deadline-bounded I/O on a socket.

A frame is a fixed prefix (magic, kind, number of arrays, length of the metadata), a table of the
arrays (dtype code, length in bytes, offset), a small JSON object of metadata and the arrays' raw
bytes, back to back. Arrays are received straight into buffers the receiver keeps from one frame
to the next (:class:`Buffers`) and sent from the sender's own memory: no pickling, no copy in
Python. On a Unix socket an array may instead lie in the memory region the two ends share
(:mod:`.region`; its entry says where): a ``SETUP`` frame hands the region's descriptor over.

The I/O is written as generators that yield whenever the channel's deadline has passed before
the frame is through. The driver decides what a yield means: the trainer's call returns
``TimeoutError`` and can be resumed from where it stopped (it waits in slices, looking between
them whether a new PS was published); the server gives up on the connection. This keeps one
frame's progress across waits without a thread per call.

Examples
--------
>>> import socket
>>> a, b = socket.socketpair()
>>> ca, cb = Channel(a), Channel(b)
>>> drive(ca, ca.send_frame(PULL, {"trainer": "w-0"}, []), 1.0)
>>> drive(cb, cb.recv_frame(Buffers()), 1.0)
(2, {'trainer': 'w-0'}, [])
"""

from __future__ import annotations

import json
import math
import os
import socket
import ssl
import struct
import time
from collections.abc import Callable, Generator, Sequence
from typing import Any

import numpy as np

#: Requests, and replies (the high bit set).
PUSH_PULL = 1
PULL = 2
SETUP = 3  # carries a shared region's descriptor (Unix sockets only); no reply
SEAL = 4  # over TLS: an end's share of the sealed stream's keys (:mod:`.sealed`), each way
REPLY = 0x81
ERROR = 0x82
KINDS = (PUSH_PULL, PULL, SETUP, SEAL, REPLY, ERROR)

MAGIC = b"TNw1"
PREFIX = struct.Struct("<4sBBHI")  # magic, kind, number of arrays, 0, metadata bytes
ENTRY = struct.Struct("<BQQ")  # dtype code (0: no array; | IN_REGION), bytes, offset
#: Set in an entry's code when the array lies in the shared region, at the entry's offset.
IN_REGION = 0x80
#: Descriptors a frame may carry (a region's; more are closed unread).
MAX_FDS = 1
#: dtype codes; bfloat16 travels as its bits in int16 (numpy has no bfloat16).
DTYPES: dict[int, np.dtype[Any]] = {
    1: np.dtype(np.float32),
    2: np.dtype(np.float16),
    3: np.dtype(np.int16),
}
CODES = {dtype: code for code, dtype in DTYPES.items()}
#: Bounds a frame must keep (a garbled or hostile prefix must not make us allocate gigabytes).
MAX_ARRAYS = 8
MAX_META = 1 << 16
MAX_ARRAY_BYTES = 1 << 34

Step = Generator[None, None, Any]


class FrameError(ConnectionError):
    """The peer sent something that is not a frame of this protocol (the connection is dropped)."""


class Buffers:
    """Receive buffers kept from one frame to the next, one per array slot.

    An array received into slot ``i`` is a view of this object's memory, valid until the next
    frame is received with it: the receiver uses (or copies) it before that.
    """

    def __init__(self) -> None:
        self._slots: list[np.ndarray] = []

    def get(self, slot: int, dtype: np.dtype[Any], nbytes: int) -> np.ndarray:
        """A writable array of ``nbytes`` bytes of ``dtype`` in slot ``slot``."""
        while len(self._slots) <= slot:
            self._slots.append(np.empty(0, np.uint8))
        if self._slots[slot].nbytes < nbytes:
            self._slots[slot] = np.empty(nbytes, np.uint8)
        return self._slots[slot][:nbytes].view(dtype)


def encode_head(
    kind: int,
    meta: dict[str, Any],
    arrays: Sequence[np.ndarray | None],
    offsets: Sequence[int | None] = (),
) -> bytes:
    """The prefix, array table and metadata of a frame (the arrays follow as they are, except
    those with an offset: they lie in the shared region there).

    Examples
    --------
    >>> len(encode_head(PULL, {}, [np.zeros(3, np.float32), None]))
    48
    """
    if kind not in KINDS:
        raise ValueError(f"Unknown frame kind {kind!r}.")
    if len(arrays) > MAX_ARRAYS:
        raise ValueError(f"{len(arrays)} arrays in one frame: at most {MAX_ARRAYS}.")
    body = json.dumps(meta, separators=(",", ":")).encode()
    if len(body) > MAX_META:
        raise ValueError(f"Metadata of {len(body)} bytes: at most {MAX_META}.")
    table = b""
    for i, a in enumerate(arrays):
        if a is None:
            table += ENTRY.pack(0, 0, 0)
            continue
        code = CODES.get(a.dtype)
        if code is None:
            raise ValueError(f"No wire code for dtype {a.dtype}: use one of {list(CODES)}.")
        if not a.flags.c_contiguous:
            raise ValueError("Arrays on the wire must be C-contiguous.")
        offset = offsets[i] if i < len(offsets) else None
        if offset is None:
            table += ENTRY.pack(code, a.nbytes, 0)
        else:
            table += ENTRY.pack(code | IN_REGION, a.nbytes, offset)
    return PREFIX.pack(MAGIC, kind, len(arrays), 0, len(body)) + table + body


def decode_prefix(data: bytes) -> tuple[int, int, int]:
    """``(kind, arrays, metadata bytes)`` of a frame's prefix; :class:`FrameError` if it is none."""
    magic, kind, n, _, meta_len = PREFIX.unpack(data)
    if magic != MAGIC or kind not in KINDS or n > MAX_ARRAYS or meta_len > MAX_META:
        raise FrameError("Not a frame of the transient_nb data plane.")
    return kind, n, meta_len


class Channel:
    """A connected stream socket (Unix or TLS) with deadline-bounded, resumable frame I/O.

    Parameters
    ----------
    sock
        A connected socket; it is used with timeouts (non-blocking underneath).
    """

    def __init__(self, sock: socket.socket):
        #: The socket; over TLS, once the keys are agreed, a :class:`~.sealed.SealedSocket`.
        self.sock: Any = sock
        #: ``time.monotonic()`` by which the current step must be done (inf: no bound).
        self.deadline = math.inf
        self.unix = sock.family == socket.AF_UNIX
        #: Descriptors received with the last frame (its receiver takes and closes them).
        self.fds: list[int] = []
        #: Non-blocking: a step yields whenever the socket has nothing more (an event loop then
        #: waits for it; the deadline is the loop's business).
        self.nonblocking = False

    def set_nonblocking(self) -> None:
        """Drive this channel from an event loop (see :attr:`nonblocking`)."""
        self.nonblocking = True
        self.sock.setblocking(False)

    # -- the steps; each yields when the deadline has passed ------------------------------------
    def _arm(self) -> bool:
        """Set the socket's timeout to what is left; False when nothing is left."""
        if self.nonblocking:
            return True
        if self.deadline == math.inf:
            self.sock.settimeout(None)
            return True
        left = self.deadline - time.monotonic()
        if left <= 0:
            return False
        self.sock.settimeout(left)
        return True

    def send_all(self, views: Sequence[Any]) -> Step:
        """Send every buffer in ``views`` in order."""
        armed = self._arm()
        for v in views:
            # On a timeout the same slice is offered again: what TLS needs (it remembers how
            # much of an interrupted write went out).
            armed = yield from self._move(memoryview(v).cast("B"), self.sock.send, armed)

    def recv_into(self, view: memoryview, fds: bool = False) -> Step:
        """Fill ``view`` from the socket (with ``fds``, on a Unix socket, also take the
        descriptors that come with the bytes)."""
        receive = self._recv_with_fds if fds and self.unix else self.sock.recv_into
        yield from self._move(view, receive, self._arm(), receiving=True)

    def _move(
        self,
        view: memoryview,
        move: Callable[[memoryview], int],
        armed: bool,
        receiving: bool = False,
    ) -> Generator[None, None, bool]:
        """Pass all of ``view`` through ``move`` (a send, or a receive into what is left of it),
        yielding while the deadline has passed or, non-blocking, while the socket is not ready;
        returns whether the deadline still held at the end."""
        pos = 0
        while pos < len(view):
            if not armed:
                yield
                armed = self._arm()
                continue
            try:
                n = move(view[pos:])
            except (TimeoutError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                armed = False
                continue
            except BlockingIOError:  # non-blocking: the loop waits until the socket is ready
                yield
                continue
            if n == 0 and receiving:
                raise ConnectionError("The peer closed the data-plane connection.")
            pos += n
        return armed

    def _recv_with_fds(self, view: memoryview) -> int:
        data, fds, _, _ = socket.recv_fds(self.sock, len(view), MAX_FDS)
        view[: len(data)] = data
        for fd in fds[MAX_FDS:]:
            os.close(fd)
        self.fds += fds[:MAX_FDS]
        return len(data)

    def send_frame(
        self,
        kind: int,
        meta: dict[str, Any],
        arrays: Sequence[np.ndarray | None],
        offsets: Sequence[int | None] = (),
        fd: int | None = None,
    ) -> Step:
        """Send one frame (arrays with an offset are already in the shared region; ``fd``, a
        region's descriptor, goes with the frame's first bytes)."""
        head = encode_head(kind, meta, arrays, offsets)
        inline = [
            a
            for i, a in enumerate(arrays)
            if a is not None and a.nbytes and (i >= len(offsets) or offsets[i] is None)
        ]
        if fd is not None:
            # The few bytes that carry the descriptor: a socket buffer always has room for them.
            socket.send_fds(self.sock, [head[:1]], [fd])
            head = head[1:]
        yield from self.send_all([head, *inline])

    def seal_frame(
        self, kind: int, meta: dict[str, Any], arrays: Sequence[np.ndarray | None]
    ) -> memoryview:
        """A frame sealed now (a sealed stream's only, :mod:`.sealed`), to send later with
        :meth:`send_sealed`: the arrays may change once this returns."""
        head = encode_head(kind, meta, arrays)
        inline = [a for a in arrays if a is not None and a.nbytes]
        sealed: memoryview = self.sock.seal([head, *inline])
        return sealed

    def send_sealed(self, data: memoryview) -> Step:
        """Send a frame :meth:`seal_frame` made."""
        yield from self._move(data, self.sock.sock.send, self._arm())

    def recv_frame(
        self, buffers: Buffers, stall: float | None = None, region: Any = None
    ) -> Generator[None, None, tuple[int, dict[str, Any], list[np.ndarray | None]]]:
        """Receive one frame: ``(kind, metadata, arrays)``, the arrays in ``buffers`` or, for
        entries that say so, views of the shared ``region``.

        With ``stall``, the frame's first byte may take until the channel's deadline (the
        server waits for a request as long as its peer lives) and the rest of it ``stall``
        seconds from there.
        """
        prefix = memoryview(bytearray(PREFIX.size))
        yield from self.recv_into(prefix[:1], fds=True)
        if stall is not None:
            self.deadline = time.monotonic() + stall
        yield from self.recv_into(prefix[1:])
        kind, n, meta_len = decode_prefix(prefix.tobytes())
        rest = bytearray(n * ENTRY.size + meta_len)
        yield from self.recv_into(memoryview(rest))
        table = [ENTRY.unpack_from(rest, i * ENTRY.size) for i in range(n)]
        try:
            meta = json.loads(bytes(rest[n * ENTRY.size :]) or b"{}")
        except ValueError as e:
            raise FrameError(f"Bad frame metadata: {e}") from None
        if not isinstance(meta, dict):
            raise FrameError("Frame metadata must be an object.")
        arrays: list[np.ndarray | None] = []
        for slot, (code, nbytes, offset) in enumerate(table):
            if code == 0:
                arrays.append(None)
                continue
            dtype = DTYPES.get(code & ~IN_REGION)
            if dtype is None or nbytes > MAX_ARRAY_BYTES or nbytes % dtype.itemsize:
                raise FrameError(f"Bad array entry (code {code}, {nbytes} bytes).")
            if code & IN_REGION:
                if region is None:
                    raise FrameError("An array in a shared region, but none was set up.")
                try:
                    arrays.append(region.view(offset, dtype, nbytes))
                except ValueError as e:
                    raise FrameError(str(e)) from None
                continue
            out = buffers.get(slot, dtype, nbytes)
            yield from self.recv_into(out.data.cast("B"))
            arrays.append(out)
        return kind, meta, arrays

    def take_fds(self) -> list[int]:
        """The descriptors received so far (the caller owns them now)."""
        fds, self.fds = self.fds, []
        return fds

    def shutdown(self) -> None:
        """Shut the connection down, from any thread: whoever waits on it sees it end."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def close(self) -> None:
        """Shut the connection down (a thread blocked on it wakes up) and close it."""
        for fd in self.take_fds():
            os.close(fd)
        self.shutdown()
        self.sock.close()


def drive(channel: Channel, step: Generator[None, None, Any], timeout: float | None) -> Any:
    """Run ``step`` of ``channel`` to its end within ``timeout`` seconds (None: no bound).

    Raises ``TimeoutError`` when it is not through by then: the frame is cut, so the connection
    can only be dropped.
    """
    channel.deadline = math.inf if timeout is None else time.monotonic() + timeout
    try:
        while True:
            next(step)
            raise TimeoutError(f"The data-plane frame was not through within {timeout} s.")
    except StopIteration as stop:
        return stop.value
