"""The trainer's end, against a PS in a process of its own that is frozen, killed in the middle of
a reply, or cut off: every wait is bounded, a frozen PS's reply still counts once it resumes, a
dead one is an error at once."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import signal
import threading
import time
from typing import Any

import numpy as np
import pytest

from transient_nb.training.wire.client import DataClient, RemoteError, connect_shards
from transient_nb.training.wire.server import DataServer
from transient_nb.training.wire.transport import tls_contexts

N = 500_000  # 2 MB of float32: more than one socket buffer's worth over TLS


class Shard:
    """A PS stand-in: the update is ``w += grad``, the version counts pushes."""

    def __init__(self) -> None:
        self.w = np.zeros(N, np.float32)
        self.version = 0

    async def push_pull(self, *, grad: Any, **_: Any) -> tuple[Any, None, int]:
        self.w += grad
        self.version += 1
        return self.w.copy(), None, self.version

    async def pull(self, trainer: Any = None) -> tuple[Any, None, int]:
        return self.w.copy(), None, self.version


def _serve(mode: str, security: Any, fault: str, info: Any) -> None:
    """A PS process: serves until killed; ``fault="die-mid-reply"`` SIGKILLs itself halfway
    through sending its first reply."""
    if fault == "die-mid-reply":
        from transient_nb.training.wire import frame

        real = frame.Channel.send_frame

        def send_frame(self: Any, kind: int, meta: Any, arrays: Any, offsets: Any = (), fd=None):
            if kind != frame.REPLY:  # the TLS key exchange's answer goes through
                return (yield from real(self, kind, meta, arrays, offsets, fd))
            head = frame.encode_head(kind, meta, arrays, offsets)
            payload = b"".join(
                [head]
                + [
                    a.tobytes()
                    for i, a in enumerate(arrays)
                    if a is not None and (i >= len(offsets) or offsets[i] is None)
                ]
            )
            self.sock.settimeout(5)
            self.sock.sendall(payload[: len(payload) // 2])
            os.kill(os.getpid(), signal.SIGKILL)
            yield from real(self, kind, meta, arrays, offsets)

        def send_sealed(self: Any, data: Any):
            # A sealed reply (TLS): half of its records go out, then the PS dies.
            self.sock.sock.settimeout(5)
            self.sock.sock.sendall(data[: len(data) // 2])
            os.kill(os.getpid(), signal.SIGKILL)
            yield

        frame.Channel.send_frame = send_frame  # type: ignore[method-assign]
        frame.Channel.send_sealed = send_sealed  # type: ignore[method-assign]
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    server_tls = tls_contexts(security)[0] if mode == "tls" else None
    shard = Shard()  # held here: a server lives only as long as its PS
    server = DataServer(shard, loop, mode, "proc", server_tls=server_tls)
    info.put(server.endpoint)
    while True:
        time.sleep(60)


@pytest.fixture
def ps_process(certs):
    """Start a PS process: ``start(mode, fault="")`` -> (process, endpoint)."""
    procs = []
    ctx = mp.get_context("spawn")

    def start(mode: str, fault: str = "") -> tuple[Any, dict[str, Any]]:
        info = ctx.Queue()
        proc = ctx.Process(target=_serve, args=(mode, certs["ps"], fault, info), daemon=True)
        proc.start()
        procs.append(proc)
        return proc, info.get(timeout=120)

    yield start
    for p in procs:
        try:
            os.kill(p.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        p.kill()
        p.join(30)


def _freeze(proc) -> None:
    """SIGSTOP the PS process and wait until the kernel has stopped it (every thread)."""
    import psutil

    from tests.conftest import wait_for_sync

    os.kill(proc.pid, signal.SIGSTOP)
    wait_for_sync(lambda: psutil.Process(proc.pid).status() == psutil.STATUS_STOPPED, timeout=30)


def _client(endpoint, mode, certs):
    return DataClient(endpoint, tls_contexts(certs["trainer"])[1] if mode == "tls" else None)


@pytest.mark.parametrize("mode", ["unix", "tls"])
def test_a_frozen_ps_is_waited_for_in_slices_and_its_reply_counts_once_it_resumes(
    ps_process, certs, mode
):
    proc, endpoint = ps_process(mode)
    client = _client(endpoint, mode, certs)
    grad = np.ones(N, np.float32)
    assert client.push_pull(trainer="t", grad=grad, base_version=0, local_step=1).result(30)[2] == 1
    _freeze(proc)
    call = client.push_pull(trainer="t", grad=grad, base_version=1, local_step=2)
    for _ in range(3):  # each slice is bounded, and nothing is lost between slices
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            call.result(timeout=0.3)
        assert time.monotonic() - t0 < 3
    os.kill(proc.pid, signal.SIGCONT)
    w, _, version = call.result(timeout=30)
    assert version == 2 and float(w[0]) == 2.0 and float(w[-1]) == 2.0
    assert client.pull("t").result(30)[2] == 2  # the connection goes on
    client.close()


@pytest.mark.parametrize("mode", ["unix", "tls"])
def test_a_ps_killed_in_the_middle_of_a_reply_is_an_error_at_once(ps_process, certs, mode):
    proc, endpoint = ps_process(mode, fault="die-mid-reply")
    client = _client(endpoint, mode, certs)
    call = client.push_pull(trainer="t", grad=np.ones(N, np.float32), base_version=0, local_step=1)
    t0 = time.monotonic()
    with pytest.raises((ConnectionError, OSError)):
        while True:  # slices, as the trainer waits
            try:
                call.result(timeout=0.5)
                break
            except TimeoutError:
                assert time.monotonic() - t0 < 30, "a dead PS must not look slow"
    assert time.monotonic() - t0 < 10
    proc.join(10)
    assert proc.exitcode == -signal.SIGKILL
    assert client.broken
    with pytest.raises(ConnectionError):
        client.pull("t")


def test_a_call_given_up_cuts_the_connection(ps_process, certs):
    proc, endpoint = ps_process("unix")
    client = _client(endpoint, "unix", certs)
    _freeze(proc)
    call = client.pull("t")
    with pytest.raises(TimeoutError):
        call.result(timeout=0.2)
    with pytest.raises(RuntimeError, match="in flight"):
        client.pull("t")  # one call at a time
    call.abandon()
    assert call.done() and client.broken
    with pytest.raises(ConnectionError):
        call.result(0)
    os.kill(proc.pid, signal.SIGCONT)
    fresh = _client(endpoint, "unix", certs)  # a rejoin connects anew
    assert fresh.pull("t").result(30)[2] == 0
    fresh.close()


def test_the_region_grows_with_the_request(ps_process, certs):
    _, endpoint = ps_process("unix")
    client = _client(endpoint, "unix", certs)
    call = client.push_pull(trainer="t", grad=np.ones(10, np.float32), base_version=0, local_step=1)
    small = client.region
    with pytest.raises(RemoteError):  # Shard's w has N entries: 10 do not add up
        call.result(30)
    w, _, _ = client.push_pull(
        trainer="t", grad=np.ones(N, np.float32), base_version=0, local_step=1
    ).result(30)
    assert client.region is not None and client.region is not small
    assert client.region.size >= 2 * N * 4 and np.shares_memory(w, client.region.bytes)


def test_connect_shards_all_or_none(ps_process, certs):
    _, endpoint = ps_process("unix")
    assert connect_shards([], None, 5) is None
    assert connect_shards([endpoint, {}], None, 5) is None  # a shard without a data plane
    links = connect_shards([endpoint, endpoint], None, 5)
    assert [link.transport for link in links] == ["unix", "unix"]
    far = {"host": "elsewhere/1", "tls": ["127.0.0.1", 1]}
    assert connect_shards([endpoint, far], None, 5) is None  # no certificates for the far one
    for link in links:
        link.close()
    gone = dict(endpoint, unix=endpoint["unix"] + ".gone")
    with pytest.raises(OSError):
        connect_shards([gone], None, 5)
