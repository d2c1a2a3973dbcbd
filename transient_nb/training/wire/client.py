"""The trainer's end of the data plane: one connection to one PS shard, and its calls.

:class:`DataClient` has the actor's ``push_pull`` and ``pull`` (same arguments), and returns a
:class:`Call` whose ``result(timeout)`` behaves as an actor call's future: the trainer's loop
(``Trainer._gather``) waits in slices, and a slice that runs out raises ``TimeoutError`` without
losing what was sent or received so far, so the next slice goes on from there.

The request is sent when the call is made (within a first slice, :data:`SEND_SLICE_S`), so a
pipelined trainer computes its next step while the PS updates; the reply is read by ``result``.
One call at a time per connection: a call that is given up breaks the connection (its frame is
cut), and the trainer rejoins with a new one.
"""

from __future__ import annotations

import math
import ssl
import time
from collections.abc import Generator
from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:
    from typing_extensions import NotRequired, Unpack

import numpy as np

from transient_nb.training.wire import frame, sealed, transport
from transient_nb.training.wire.region import Region, aligned

#: How long making a call may block on sending its request before it returns (seconds); the
#: rest is sent by ``result``.
SEND_SLICE_S = 0.5
#: What a call's steps yield once the request is out (other yields: out of time).
SENT = "sent"


class Push(TypedDict):
    """The keywords of a push: those of the actor's ``push_pull``
    (:meth:`~transient_nb.training.ps.ParameterServer.push_pull`), which says what they mean."""

    trainer: str
    grad: np.ndarray
    base_version: int
    local_step: int
    loss: NotRequired[float]
    images: NotRequired[int]
    bn_delta: NotRequired[np.ndarray | None]
    final: NotRequired[bool]


class RemoteError(RuntimeError):
    """The PS received the call and refused it (its error, as text)."""


class Call:
    """One request on a :class:`DataClient`; ``result(timeout)`` is its reply.

    The reply's arrays are views of the connection's receive buffers, valid until the next
    call on the same connection.
    """

    def __init__(self, client: DataClient, step: Generator[Any, None, Any]):
        self._client = client
        self._step = step
        self._value: Any = None
        self._error: BaseException | None = None
        self._done = False

    def _advance(self, timeout: float | None, until_sent: bool = False) -> bool:
        """Run for at most ``timeout`` seconds (or until the request is sent, with
        ``until_sent``); True when the call is over."""
        if self._done:
            return True
        chan = self._client.channel
        chan.deadline = math.inf if timeout is None else time.monotonic() + max(0.0, timeout)
        try:
            while next(self._step) is SENT and not until_sent:
                pass
        except StopIteration as stop:
            self._value, self._done = stop.value, True
        except RemoteError as e:  # the PS refused this call: its frame is through
            self._error, self._done = e, True
        except BaseException as e:  # the frame is cut: the connection cannot go on
            self._error, self._done = e, True
            self._client.broken = True
        if self._done:
            self._client.busy = None
        return self._done

    def done(self) -> bool:
        """Whether the reply is in (or the call failed)."""
        return self._done

    def result(self, timeout: float | None = None) -> Any:
        """The reply ``(weights, statistics or None, version)``.

        Raises ``TimeoutError`` when ``timeout`` passes first (call again to go on), the
        connection's error when it failed, :class:`RemoteError` when the PS refused the call.
        """
        if not self._advance(timeout):
            raise TimeoutError(f"no data-plane reply within {timeout} s")
        if self._error is not None:
            raise self._error
        return self._value

    def abandon(self) -> None:
        """Give the call up: the connection is cut mid-frame, so it is closed."""
        if not self._done:
            self._done = True
            self._error = ConnectionError("call abandoned")
            self._client.close()


class DataClient:
    """A trainer's connection to one PS shard's data plane.

    Parameters
    ----------
    endpoint
        What the shard published (``ParameterServer.data_endpoint``).
    client_tls
        The trainer's TLS context (its worker's certificates), for a PS on another host.
    timeout
        Bound of connecting (and of the TLS handshake).

    Raises
    ------
    LookupError
        When no transport of the endpoint is usable from here (the Dask actor carries the
        bytes then).

    Examples
    --------
    >>> import asyncio, threading
    >>> from transient_nb.training.wire.server import DataServer
    >>> class PS:
    ...     async def pull(self, trainer): return np.arange(3, dtype=np.float32), None, 7
    >>> loop = asyncio.new_event_loop()
    >>> threading.Thread(target=loop.run_forever, daemon=True).start()
    >>> server = DataServer(ps := PS(), loop, "unix", "demo")
    >>> client = DataClient(server.endpoint)
    >>> w, bn, version = client.pull("w-0").result(timeout=5)
    >>> client.transport, w.tolist(), bn, version
    ('unix', [0.0, 1.0, 2.0], None, 7)
    >>> client.close(); server.close(); _ = loop.call_soon_threadsafe(loop.stop)
    """

    def __init__(
        self,
        endpoint: dict[str, Any],
        client_tls: ssl.SSLContext | None = None,
        timeout: float = 5.0,
    ):
        sock, kind = transport.connect(endpoint, client_tls, timeout)
        if sock is None:
            raise LookupError(f"No data-plane transport to {endpoint!r} from this host.")
        self.transport: str = kind
        self.channel = frame.Channel(sock)
        if kind == "tls":
            try:
                self._seal(timeout)
            except BaseException:
                self.channel.close()
                raise
        self.broken = False
        self.busy: Call | None = None
        self._buffers = frame.Buffers()
        #: On a Unix socket, the memory region shared with the PS (made at the first call).
        self.region: Region | None = None
        self._reply_bytes = 0  # room the last reply took: what the next one will need

    def _seal(self, timeout: float) -> None:
        """Agree on the sealed stream's keys inside the TLS session (a ``SEAL`` frame each way),
        then leave TLS for that stream (:mod:`.sealed`)."""
        chan = self.channel
        mine = sealed.contribution()
        frame.drive(chan, chan.send_frame(frame.SEAL, {"share": mine.hex()}, []), timeout)
        kind, meta, _ = frame.drive(chan, chan.recv_frame(frame.Buffers()), timeout)
        if kind != frame.SEAL:
            raise frame.FrameError(f"Unexpected answer to the key exchange (kind {kind}).")
        to_server, to_client = sealed.derive(mine, sealed.share_of(meta))
        chan.sock.settimeout(timeout)
        chan.sock = sealed.SealedSocket(chan.sock.unwrap(), to_server, to_client)

    def close(self) -> None:
        """Close the connection (a call in flight fails)."""
        self.broken = True
        self.channel.close()

    def _call(self, kind: int, meta: dict[str, Any], arrays: list[np.ndarray | None]) -> Call:
        if self.broken:
            raise ConnectionError("The data-plane connection is closed.")
        if self.busy is not None:
            # The trainer waits for (or gives up on) every call before the next one.
            raise RuntimeError("A data-plane call is still in flight on this connection.")
        call = Call(self, self._exchange(kind, meta, arrays))
        self.busy = call
        call._advance(
            SEND_SLICE_S, until_sent=True
        )  # the request goes out now (the reply is read later)
        return call

    def _exchange(
        self, kind: int, meta: dict[str, Any], arrays: list[np.ndarray | None]
    ) -> Generator[Any, None, Any]:
        chan = self.channel
        offsets: list[int | None] = []
        if chan.unix:
            offsets = yield from self._stage(meta, arrays)
        yield from chan.send_frame(kind, meta, arrays, offsets)
        yield SENT  # the call's first slice ends here: the caller gets on with its step
        reply_kind, reply, out = yield from chan.recv_frame(self._buffers, region=self.region)
        if reply_kind == frame.ERROR:
            raise RemoteError(str(reply.get("error", "the PS refused the call")))
        if reply_kind != frame.REPLY or len(out) != 2:
            raise frame.FrameError(f"Unexpected reply frame (kind {reply_kind}).")
        self._reply_bytes = max(
            self._reply_bytes, sum(aligned(a.nbytes) for a in out if a is not None)
        )
        return out[0], out[1], int(reply["version"])

    def _stage(
        self, meta: dict[str, Any], arrays: list[np.ndarray | None]
    ) -> Generator[Any, None, list[int | None]]:
        """Put the request's arrays in the shared region (made, or made larger, first) and
        leave room for the reply; their offsets."""
        request = sum(aligned(a.nbytes) for a in arrays if a is not None)
        room = max(self._reply_bytes, request)  # a push's reply is the size of its gradient
        if request + room == 0:
            return []  # nothing to share yet (a first pull): the reply comes inline
        if self.region is None or self.region.size < request + room:
            region = Region.create(request + room)
            try:
                yield from self.channel.send_frame(frame.SETUP, {}, [], fd=region.fd)
            finally:
                region.close()  # the PS has its own descriptor now; the mapping stays
            self.region = region
        offsets: list[int | None] = []
        at = 0
        for a in arrays:
            if a is None:
                offsets.append(None)
                continue
            self.region.view(at, a.dtype, a.nbytes)[...] = a
            offsets.append(at)
            at += aligned(a.nbytes)
        meta["reply_at"], meta["reply_room"] = at, self.region.size - at
        return offsets

    # -- the actor's data methods ---------------------------------------------------------------
    def push_pull(self, **push: Unpack[Push]) -> Call:
        """Push one gradient; the call's result is the new weights (as the actor's)."""
        meta = {
            "trainer": push["trainer"],
            "base_version": int(push["base_version"]),
            "local_step": int(push["local_step"]),
            "loss": float(push.get("loss", 0.0)),
            "images": int(push.get("images", 0)),
            "final": bool(push.get("final", False)),
        }
        arrays = [np.ascontiguousarray(push["grad"]), push.get("bn_delta")]
        return self._call(frame.PUSH_PULL, meta, arrays)

    def pull(self, trainer: str | None = None) -> Call:
        """The current weights, statistics and version (as the actor's ``pull``)."""
        return self._call(frame.PULL, {"trainer": trainer}, [])


def connect_shards(
    endpoints: list[dict[str, Any]], security: Any, timeout: float
) -> list[DataClient] | None:
    """A connection to every shard's data plane, or None when some shard has none usable from
    here (no endpoint published, or TLS without certificates): the actor carries the bytes.

    ``security`` is the trainer's worker's Dask ``Security`` (its certificates, for TLS).
    Raises ``OSError`` when a data plane is published but cannot be reached.
    """
    if not endpoints or not all(endpoints):
        return None
    client_tls = transport.tls_contexts(security)[1] if any("tls" in e for e in endpoints) else None
    links: list[DataClient] = []
    try:
        for endpoint in endpoints:
            links.append(DataClient(endpoint, client_tls, timeout))
    except LookupError:
        for link in links:
            link.close()
        return None
    except BaseException:
        for link in links:
            link.close()
        raise
    return links
