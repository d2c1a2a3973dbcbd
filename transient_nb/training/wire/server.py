"""The PS's end of the data plane: a listener, and each trainer's connection served beside the
PS's update.

On a Unix socket only frame heads travel (the arrays are in the region the trainer shares,
:mod:`.region`), so a connection is served by the PS's own event loop: the request is read, the
PS's ``push_pull`` (or ``pull``) awaited in place, as atomic as when Dask calls it, and the reply
head written, with no thread in between. Over TLS the arrays themselves travel and are encrypted,
so each connection has a thread of its own: it reads a request into buffers it keeps, hands the
call to the PS's loop, and encrypts and sends the reply beside it (the update releases the GIL in
torch's kernels, the AEAD in ``cryptography``). A trainer's TLS connection first agrees on the
keys of a sealed stream inside TLS (a ``SEAL`` frame each way) and then moves its frames in that
stream's 1 MiB AES-128-GCM records rather than TLS's 16 KiB ones (:mod:`.sealed`); a peer that
does not ask is served over TLS itself.

Bounds (chaos suite): a request or a reply that stalls for ``stall_s`` in the middle drops the
connection (the trainer has given up and rejoins by then); an idle connection lives as long as
its peer (a killed peer's kernel closes it; a vanished host's is noticed by TCP keepalive).
The server closes itself once its PS is no longer an actor of its worker (a new generation, the
run's end), and with it every connection.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import socket
import ssl
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from transient_nb.training.wire import frame, sealed, transport
from transient_nb.training.wire.codec import reply_into, reply_live
from transient_nb.training.wire.region import Region, aligned

logger = logging.getLogger(__name__)

#: How often the listener looks whether its PS is still there (seconds).
CHECK_S = 0.5
#: Bound of a TLS handshake (an outsider that connects and says nothing is dropped by then).
HANDSHAKE_S = 10.0


class DataServer:
    """Serve ``target``'s ``push_pull`` and ``pull`` on a data-plane listener.

    Parameters
    ----------
    target
        The PS (held weakly): coroutines ``push_pull(**kwargs)`` and ``pull(trainer)`` that
        return ``(weights, statistics or None, version)``.
    loop
        The event loop the PS's coroutines run on (the worker's).
    mode
        ``"unix"`` or ``"tls"`` (see :mod:`.transport`).
    name
        Names the threads and the socket (the run and the shard).
    host
        The interface a TLS listener binds (the worker's own address).
    server_tls
        The server's TLS context (mode ``"tls"``).
    ports
        Ports a TLS listener may take (``[0]``: any).
    stall_s
        A frame that stalls this long in the middle drops its connection.
    alive
        Called every :data:`CHECK_S`; the server closes itself once it returns False.

    Examples
    --------
    >>> import asyncio, numpy as np
    >>> class PS:
    ...     async def pull(self, trainer): return np.ones(2, np.float32), None, 7
    >>> loop = asyncio.new_event_loop()
    >>> threading.Thread(target=loop.run_forever, daemon=True).start()
    >>> ps = PS()  # held: a server lives only as long as its PS
    >>> server = DataServer(ps, loop, "unix", "demo")
    >>> sorted(server.endpoint)
    ['host', 'unix']
    >>> server.close(); _ = loop.call_soon_threadsafe(loop.stop)
    """

    def __init__(
        self,
        target: Any,
        loop: asyncio.AbstractEventLoop,
        mode: str,
        name: str,
        *,
        host: str = "127.0.0.1",
        server_tls: ssl.SSLContext | None = None,
        ports: list[int] | None = None,
        stall_s: float = 30.0,
        alive: Callable[[], bool] | None = None,
    ):
        self._target = weakref.ref(target)
        self._loop = loop
        self.mode = mode
        self.name = name
        self.stall_s = stall_s
        self._alive = alive
        self._tls = server_tls
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._channels: set[frame.Channel] = set()
        self._path: str | None = None
        self.endpoint: dict[str, Any] = {"host": transport.host_id()}
        if mode == "unix":
            self._sock, self._path = transport.listen_unix(name)
            self.endpoint["unix"] = self._path
        elif mode == "tls":
            if server_tls is None:
                raise ValueError("A TLS data plane needs the worker's TLS certificates.")
            self._sock = transport.listen_tcp(host, ports or [0])
            self.endpoint["tls"] = [host, self._sock.getsockname()[1]]
        else:
            raise ValueError(f"No data-plane server for mode {mode!r}.")
        self._sock.settimeout(CHECK_S)
        #: Connections refused (a failed handshake, a foreign uid, not our protocol).
        self.refused = 0
        self.served = 0
        self._thread = threading.Thread(
            target=self._accept_loop, name=f"transient-data-{name}", daemon=True
        )
        self._thread.start()

    # -- life -----------------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def close(self) -> None:
        """Stop listening and drop every connection (their threads end at once)."""
        if self._closed.is_set():
            return
        self._closed.set()
        try:
            self._sock.close()
        except OSError:
            pass
        if self._path is not None:
            transport.remove_unix(self._path)
        self.cut()

    def cut(self) -> int:
        """Drop every open connection but keep listening (a fault the chaos tests inject);
        returns how many there were. Each connection sees its end and closes itself."""
        with self._lock:
            channels = list(self._channels)
        for chan in channels:
            chan.shutdown()
        return len(channels)

    def _gone(self) -> bool:
        if self._target() is None:
            return True
        try:
            return self._alive is not None and not self._alive()
        except Exception:
            return False

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            if self._gone():
                self.close()
                break
            try:
                sock, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                break  # closed
            if self.mode == "unix":
                # Only frame heads cross a Unix socket (the arrays are in the shared region):
                # served on the PS's own loop, with no thread between the bytes and the update.
                admitted = self._admit(sock)
                if admitted is not None:
                    asyncio.run_coroutine_threadsafe(self._serve_on_loop(admitted), self._loop)
                continue
            threading.Thread(
                target=self._connection,
                args=(sock,),
                name=f"transient-data-{self.name}-conn",
                daemon=True,
            ).start()

    # -- one connection -------------------------------------------------------------------------
    def _keep(self, chan: frame.Channel) -> bool:
        """Count ``chan`` among the open connections (:meth:`cut` and :meth:`close` drop them);
        False, and ``chan`` closed, when the server is closing."""
        with self._lock:
            if self._closed.is_set():
                chan.close()
                return False
            self._channels.add(chan)
        return True

    def _forget(self, chan: frame.Channel) -> None:
        """``chan`` is done: no longer an open connection, and closed."""
        with self._lock:
            self._channels.discard(chan)
        chan.close()

    def _admit(self, sock: socket.socket) -> socket.socket | None:
        """The connection as a member's, or None (closed) when it is not one."""
        transport.tune(sock)
        try:
            if self.mode == "unix":
                uid = transport.peer_uid(sock)
                if uid != os.getuid():
                    raise PermissionError(f"a process of uid {uid}")
                return sock
            assert self._tls is not None
            sock.settimeout(HANDSHAKE_S)
            tls = self._tls.wrap_socket(sock, server_side=True)
            return tls
        except (OSError, ssl.SSLError, ValueError) as e:
            self.refused += 1
            logger.info("Data plane %s refused a connection: %r", self.name, e)
            sock.close()
            return None

    def _connection(self, raw: socket.socket) -> None:
        sock = self._admit(raw)
        if sock is None:
            return
        chan = frame.Channel(sock)
        if not self._keep(chan):
            return
        buffers, replies = frame.Buffers(), frame.Buffers()
        region: Region | None = None
        try:
            while not self._closed.is_set():
                # Idle until the peer sends (or goes); then the whole frame within stall_s.
                step = chan.recv_frame(buffers, stall=self.stall_s, region=region)
                kind, meta, arrays = frame.drive(chan, step, None)
                if kind == frame.SETUP:
                    region = _adopt(chan.take_fds())
                    continue
                if kind == frame.SEAL:
                    _seal(chan, meta, self.stall_s)
                    continue
                _close_fds(chan)
                if isinstance(chan.sock, sealed.SealedSocket):
                    # The reply is sealed on the PS's loop from its live weights (no copy).
                    reply, meta_out, out = self._call(kind, meta, arrays, seal_on=chan)
                    if reply == frame.REPLY:
                        frame.drive(chan, chan.send_sealed(out), self.stall_s)
                        self.served += 1
                        continue
                else:
                    room = _room(region, meta, arrays, kind, replies)
                    reply, meta_out, out = self._call(kind, meta, arrays, room)
                offsets = _place(region, meta, out) if reply == frame.REPLY else []
                frame.drive(chan, chan.send_frame(reply, meta_out, out, offsets), self.stall_s)
                self.served += 1
        except frame.FrameError as e:
            self.refused += 1
            logger.info("Data plane %s dropped a peer: %r", self.name, e)
        except (ConnectionError, TimeoutError, OSError, ssl.SSLError):
            pass  # the peer went, stalled, or we are closing
        finally:
            self._forget(chan)

    async def _serve_on_loop(self, sock: socket.socket) -> None:
        """One Unix connection, served by the PS's loop (see :meth:`_accept_loop`)."""
        loop = asyncio.get_running_loop()
        chan = frame.Channel(sock)
        chan.set_nonblocking()
        if not self._keep(chan):
            return
        fd = sock.fileno()
        readable = asyncio.Event()
        loop.add_reader(fd, readable.set)
        buffers, replies = frame.Buffers(), frame.Buffers()
        region: Region | None = None
        try:
            while not self._closed.is_set():
                chan.deadline = math.inf  # idle as long as the peer lives
                step = chan.recv_frame(buffers, stall=self.stall_s, region=region)
                kind, meta, arrays = await _pump(chan, step, readable)
                if kind == frame.SETUP:
                    region = _adopt(chan.take_fds())
                    continue
                _close_fds(chan)
                room = _room(region, meta, arrays, kind, replies)
                reply, meta_out, out = await self._call_here(kind, meta, arrays, room)
                offsets = _place(region, meta, out) if reply == frame.REPLY else []
                chan.deadline = time.monotonic() + self.stall_s
                await _pump_out(chan, chan.send_frame(reply, meta_out, out, offsets), loop, fd)
                self.served += 1
        except frame.FrameError as e:
            self.refused += 1
            logger.info("Data plane %s dropped a peer: %r", self.name, e)
        except (ConnectionError, TimeoutError, OSError):
            pass  # the peer went, stalled, or we are closing
        finally:
            loop.remove_reader(fd)
            self._forget(chan)

    async def _call_here(
        self, kind: int, meta: dict[str, Any], arrays: list[Any], room: Any
    ) -> tuple[Any, ...]:
        """:meth:`_call` on the PS's own loop: the PS's coroutine is awaited in place."""
        made = self._request(kind, meta, arrays)
        if isinstance(made, tuple):
            return made
        try:
            if room is not None:
                with reply_into(room):
                    weights, bn, version = await made
            else:
                weights, bn, version = await made
        except Exception as e:  # the PS refused the call: the trainer sees why
            return frame.ERROR, {"error": repr(e)[:500]}, []
        return frame.REPLY, {"version": int(version)}, [weights, bn]

    def _request(self, kind: int, meta: dict[str, Any], arrays: list[Any]) -> Any:
        """The PS's coroutine for a request, or an error reply frame for a bad one."""
        target = self._target()
        if target is None:
            raise ConnectionError("The parameter server is gone.")
        try:
            if kind == frame.PUSH_PULL:
                return target.push_pull(
                    trainer=str(meta["trainer"]),
                    grad=arrays[0],
                    base_version=int(meta["base_version"]),
                    local_step=int(meta["local_step"]),
                    loss=float(meta.get("loss", 0.0)),
                    images=int(meta.get("images", 0)),
                    bn_delta=arrays[1] if len(arrays) > 1 else None,
                    final=bool(meta.get("final", False)),
                )
            if kind == frame.PULL:
                return target.pull(meta.get("trainer"))
        except (KeyError, ValueError, TypeError, IndexError) as e:
            return frame.ERROR, {"error": f"bad request: {e!r}"[:500]}, []
        raise frame.FrameError(f"Frame kind {kind} is not a request.")

    def _call(
        self,
        kind: int,
        meta: dict[str, Any],
        arrays: list[Any],
        room: Any = None,
        seal_on: frame.Channel | None = None,
    ) -> tuple[Any, ...]:
        """Run the request on the PS's event loop; the reply frame ``(kind, meta, arrays)``.

        ``room``: where in the shared region the reply's weights may be written directly
        (:func:`~transient_nb.training.wire.codec.reply_into`). ``seal_on``: a sealed channel;
        the reply is then sealed on the loop (:func:`_sealed_reply`) and its arrays are the
        sealed frame (an error reply is a frame as always).
        """
        coro = self._request(kind, meta, arrays)
        if isinstance(coro, tuple):
            return coro
        if seal_on is not None:
            coro = _sealed_reply(coro, seal_on)
        if room is not None:
            with reply_into(room):  # the task made now inherits this context
                future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        else:
            future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        while True:
            try:
                result = future.result(timeout=CHECK_S)
                break
            except FutureTimeout:
                if self._closed.is_set():
                    future.cancel()
                    raise ConnectionError("closing") from None
            except Exception as e:  # the PS refused the call: the trainer sees why
                return frame.ERROR, {"error": repr(e)[:500]}, []
        if seal_on is not None:
            return frame.REPLY, {}, result
        weights, bn, version = result
        return frame.REPLY, {"version": int(version)}, [weights, bn]


async def _sealed_reply(call: Any, chan: frame.Channel) -> memoryview:
    """Await the PS's ``call`` with its float32 reply live (its own weights, not a copy:
    :func:`~transient_nb.training.wire.codec.reply_live`) and seal the reply frame at once, on
    the loop: there is no ``await`` in between, so no other update touches the weights before
    they are encrypted. The connection's thread sends the sealed frame."""
    with reply_live():
        weights, bn, version = await call
    return chan.seal_frame(frame.REPLY, {"version": int(version)}, [weights, bn])


async def _pump(chan: frame.Channel, step: Any, readable: asyncio.Event) -> Any:
    """Drive a receiving step of a non-blocking channel from the loop: on until the socket has
    nothing more, then wait for it to be readable (until the channel's deadline)."""
    while True:
        try:
            next(step)
        except StopIteration as stop:
            return stop.value
        readable.clear()
        if chan.deadline == math.inf:
            await readable.wait()
            continue
        left = chan.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("The data-plane frame stalled.")
        await asyncio.wait_for(readable.wait(), left)


async def _pump_out(
    chan: frame.Channel, step: Any, loop: asyncio.AbstractEventLoop, fd: int
) -> None:
    """Drive a sending step of a non-blocking channel: a frame head goes at once; more waits
    for the socket to be writable (until the channel's deadline)."""
    writable: asyncio.Event | None = None
    try:
        while True:
            try:
                next(step)
            except StopIteration:
                return
            if writable is None:
                writable = asyncio.Event()
                loop.add_writer(fd, writable.set)
            writable.clear()
            left = chan.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("The data-plane reply stalled.")
            await asyncio.wait_for(writable.wait(), left)
    finally:
        if writable is not None:
            loop.remove_writer(fd)


def _seal(chan: frame.Channel, meta: dict[str, Any], timeout: float) -> None:
    """Answer a trainer's key share with ours inside the TLS session, then leave TLS for the
    sealed stream (:mod:`.sealed`); once per connection, over TLS only."""
    if not isinstance(chan.sock, ssl.SSLSocket):
        raise frame.FrameError("A key exchange outside TLS, or a second one.")
    theirs, mine = sealed.share_of(meta), sealed.contribution()
    to_server, to_client = sealed.derive(theirs, mine)
    frame.drive(chan, chan.send_frame(frame.SEAL, {"share": mine.hex()}, []), timeout)
    chan.sock.settimeout(timeout)
    chan.sock = sealed.SealedSocket(chan.sock.unwrap(), to_client, to_server)


def _close_fds(chan: frame.Channel) -> None:
    """Close the descriptors that came with a frame other than a setup frame's."""
    for fd in chan.take_fds():
        os.close(fd)


def _adopt(fds: list[int]) -> Region:
    """The shared region a setup frame handed over (mapped; its descriptor closed)."""
    if not fds:
        raise frame.FrameError("A setup frame without a region.")
    for fd in fds[1:]:
        os.close(fd)
    try:
        region = Region.adopt(fds[0])
    except (ValueError, OSError) as e:
        raise frame.FrameError(f"Bad shared region: {e}") from None
    region.close()  # mapped: the descriptor is no longer needed
    return region


def _room(
    region: Region | None, meta: dict[str, Any], arrays: list[Any], kind: int, spare: frame.Buffers
) -> Any:
    """Where a push's new weights may be written: an array of the gradient's dtype and size (a
    push's reply is the same size as its gradient) at the start of the room the request left in
    the shared region, else in a buffer this connection keeps for its replies (a reply is sent
    before the next request is read, so the buffer is free again by then); None for a pull."""
    if kind != frame.PUSH_PULL or not arrays or arrays[0] is None:
        return None
    grad = arrays[0]
    if region is None:
        return spare.get(0, grad.dtype, grad.nbytes)
    at, room = meta.get("reply_at"), meta.get("reply_room")
    if not isinstance(at, int) or not isinstance(room, int) or grad.nbytes > room:
        return None
    try:
        return region.view(at, grad.dtype, grad.nbytes)
    except ValueError:
        return None


def _place(region: Region | None, meta: dict[str, Any], arrays: list[Any]) -> list[int | None]:
    """Copy reply arrays into the room the request left for them in the shared region (or find
    them there already); their offsets (None: sent inline, when there is no region or no
    room)."""
    at, room = meta.get("reply_at"), meta.get("reply_room")
    if region is None or not isinstance(at, int) or not isinstance(room, int):
        return []
    offsets: list[int | None] = []
    end = at + room
    base = region.bytes.ctypes.data
    for a in arrays:
        if a is not None and a.nbytes and base <= a.ctypes.data < base + region.size:
            offsets.append(a.ctypes.data - base)  # written there by the PS itself
            at = aligned(a.ctypes.data - base + a.nbytes)
            continue
        if a is None or at + a.nbytes > end:
            offsets.append(None)
            continue
        try:
            region.view(at, a.dtype, a.nbytes)[...] = a
        except ValueError:  # outside the region: inline then
            offsets.append(None)
            continue
        offsets.append(at)
        at += aligned(a.nbytes)
    return offsets


def serve_ps(ps: Any, worker: Any, hp: Any, name: str) -> DataServer | None:
    """Start the data plane of PS shard ``ps`` on its ``worker``; None when the bytes stay on
    the actor.

    ``hp.data_plane`` picks the transport (``"auto"``: the backend's, through
    ``TRANSIENT_NB_DATA_PLANE``). A PS outside a worker (the unit tests' doubles) has one only
    when a transport is named; a TLS one needs the worker's certificates (without them the
    bytes stay on the actor, said in the log). Runs on the event loop of the PS's coroutines.
    """
    setting = str(hp.data_plane)
    if setting == "dask" or (worker is None and setting == "auto"):
        return None
    mode = transport.resolve_mode(setting)
    if mode == "dask":
        return None
    host, server_tls, ports = "127.0.0.1", None, None
    if mode == "tls":
        server_tls = transport.tls_contexts(getattr(worker, "security", None))[0]
        if server_tls is None:
            logger.warning(
                "Data plane %s: no TLS certificates on this worker; the bytes stay on the actor.",
                name,
            )
            return None
        if worker is not None:
            from distributed.comm import get_address_host

            host = get_address_host(worker.address)
        ports = transport.port_range(os.environ.get(transport.PORTS_ENV))
    ref = weakref.ref(ps)

    def alive() -> bool:
        # The server lives as long as its PS is an actor of the worker (a released generation,
        # or the run's end, closes it).
        p = ref()
        if p is None:
            return False
        return worker is None or any(a is p for a in worker.state.actors.values())

    return DataServer(
        ps,
        asyncio.get_running_loop(),
        mode,
        name,
        host=host,
        server_tls=server_tls,
        ports=ports,
        stall_s=float(hp.call_timeout_s),
        alive=alive,
    )
