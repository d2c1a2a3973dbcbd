"""The PS's end: it serves the PS's own coroutines on their loop, only to the cluster's members,
drops what stalls, and goes with its PS."""

from __future__ import annotations

import gc
import os
import socket
import ssl
import threading
import time

import numpy as np
import pytest

from tests.conftest import wait_for_sync
from transient_nb.training.hparams import HParams
from transient_nb.training.wire.client import DataClient, RemoteError
from transient_nb.training.wire.frame import MAGIC, PREFIX, PULL
from transient_nb.training.wire.server import DataServer, serve_ps
from transient_nb.training.wire.transport import tls_contexts

from .conftest import N, make_ps
from .outsiders import knock_tls, knock_unix_as_nobody, outsider_contexts, refused


def _server(ps, loop, mode, certs=None, **kw):
    server_tls = tls_contexts(certs["ps"])[0] if mode == "tls" else None
    return DataServer(ps, loop, mode, "test-s0", server_tls=server_tls, **kw)


def _client(server, mode, certs=None):
    client_tls = tls_contexts(certs["trainer"])[1] if mode == "tls" else None
    return DataClient(server.endpoint, client_tls)


@pytest.mark.parametrize("mode", ["unix", "tls"])
def test_push_pull_and_pull_are_the_ps_own_coroutines_on_its_loop(ps, loop, certs, tmp_path, mode):
    twin = make_ps(tmp_path)  # the same update applied without the data plane
    on = []
    original = ps.push_pull

    async def recorded(**kw):
        on.append(threading.current_thread().name)
        return await original(**kw)

    ps.push_pull = recorded
    server = _server(ps, loop, mode, certs)
    client = _client(server, mode, certs)
    assert client.transport == mode
    w, bn, version = client.pull("w-0").result(timeout=10)
    assert version == 0 and np.array_equal(w, twin.w) and bn.tolist() == [0.0] * 4
    import asyncio

    for step in (1, 2, 3):
        grad = np.full(N, 0.01 * step, np.float32)
        delta = np.ones(4, np.float32)
        w, bn, version = client.push_pull(
            trainer="w-0", grad=grad, base_version=step - 1, local_step=step, bn_delta=delta
        ).result(timeout=10)
        asyncio.run(
            twin.push_pull(
                trainer="w-0", grad=grad, base_version=step - 1, local_step=step, bn_delta=delta
            )
        )
        assert version == step and np.array_equal(w, twin.w) and np.array_equal(bn, twin.bn)
    assert on == ["test-loop"] * 3  # the update ran where the actor's calls run
    assert ps.accepted == {"w-0": 3} and "w-0" in ps.registered
    client.close()
    server.close()


def test_the_reply_lands_in_the_region_shared_with_the_trainer(ps, loop):
    replies = []
    real = ps._reply

    def recorded():
        replies.append(real())
        return replies[-1]

    ps._reply = recorded
    server = _server(ps, loop, "unix")
    client = _client(server, "unix")
    assert client.region is None
    w, _, _ = client.push_pull(
        trainer="w-0", grad=np.zeros(N, np.float32), base_version=0, local_step=1
    ).result(timeout=10)
    assert client.region is not None and np.shares_memory(w, client.region.bytes)
    # The PS wrote its reply straight into the shared memory (one copy of the weights, not
    # two): what the trainer writes there, the PS's reply array shows.
    w[0] = 123.0
    assert replies[-1][0][0] == 123.0 and not np.shares_memory(replies[-1][0], ps.w)
    first = client.region
    w, _, _ = client.pull("w-0").result(timeout=10)
    assert client.region is first and np.shares_memory(w, first.bytes)
    client.close()
    server.close()


def test_a_refused_call_is_the_ps_error_and_the_connection_goes_on(ps, loop):
    server = _server(ps, loop, "unix")
    client = _client(server, "unix")
    with pytest.raises(RemoteError, match="size"):  # a gradient of the wrong size
        client.push_pull(
            trainer="w-0", grad=np.zeros(7, np.float32), base_version=0, local_step=1
        ).result(timeout=10)
    assert client.pull("w-0").result(timeout=10)[2] == 0
    client.close()
    server.close()


# -- only members ------------------------------------------------------------------------------------
def test_over_tls_only_holders_of_the_clusters_certificates_get_in(ps, loop, certs):
    server = _server(ps, loop, "tls", certs)
    assert knock_tls(server.endpoint, tls_contexts(certs["trainer"])[1]) == b"T"  # a member
    outsiders = outsider_contexts(certs["ca_file"], certs["outsider"])
    for who, ctx in outsiders.items():
        assert refused(server.endpoint, ctx), who
    wait_for_sync(lambda: server.refused >= len(outsiders), timeout=10)
    assert ps.registered == set() and ps.computing == {}  # nothing reached the PS
    server.close()


def test_a_trainer_refuses_a_ps_that_is_not_the_clusters(ps, loop, certs, tmp_path):
    from transient_nb.backends.tls import ClusterCA, security_from_files

    impostor = security_from_files(
        ClusterCA.create("impostor").write_files(str(tmp_path / "i"), "ps-0", role="ps"), "worker"
    )
    server = DataServer(ps, loop, "tls", "impostor", server_tls=tls_contexts(impostor)[0])
    with pytest.raises((ssl.SSLError, OSError)):
        _client(server, "tls", certs)
    server.close()


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to act as another user")
def test_over_unix_another_user_cannot_reach_the_socket_or_use_it(ps, loop):
    server = _server(ps, loop, "unix")
    path = server.endpoint["unix"]
    assert knock_unix_as_nobody(path) == "no entry"  # the 0700 folder and 0600 socket
    # A folder made too open by mistake: the server's uid check still drops the stranger.
    os.chmod(os.path.dirname(path), 0o755)
    os.chmod(path, 0o777)
    before = server.refused
    assert knock_unix_as_nobody(path) == "dropped"
    assert server.refused == before + 1
    assert _client(server, "unix").pull("w-0").result(timeout=10)[2] == 0  # members still in
    server.close()


# -- faults -------------------------------------------------------------------------------------------
def test_a_request_that_stalls_midway_is_dropped_and_others_are_served(ps, loop):
    server = _server(ps, loop, "unix", stall_s=0.5)
    stalled = socket.socket(socket.AF_UNIX)
    stalled.connect(server.endpoint["unix"])
    stalled.sendall(PREFIX.pack(MAGIC, PULL, 0, 0, 2))  # the prefix, not the metadata
    t0 = time.monotonic()
    other = _client(server, "unix")
    assert other.pull("w-1").result(timeout=10)[2] == 0  # served while the other stalls
    stalled.settimeout(10)
    assert stalled.recv(1) == b""  # dropped
    assert 0.4 < time.monotonic() - t0 < 5
    stalled.close()
    other.close()
    server.close()


def test_an_idle_connection_is_kept(ps, loop):
    server = _server(ps, loop, "unix", stall_s=0.2)
    client = _client(server, "unix")
    client.pull("w-0").result(timeout=10)
    time.sleep(0.5)  # the fault's shape: idle for longer than a frame may stall
    assert client.pull("w-0").result(timeout=10)[2] == 0
    client.close()
    server.close()


def test_cut_drops_every_connection_and_new_ones_are_served(ps, loop):
    server = _server(ps, loop, "unix")
    client = _client(server, "unix")
    client.pull("w-0").result(timeout=10)
    assert server.cut() == 1
    with pytest.raises(ConnectionError):
        client.pull("w-0").result(timeout=10)
    assert client.broken
    assert _client(server, "unix").pull("w-0").result(timeout=10)[2] == 0
    server.close()


def test_the_server_goes_with_its_ps(loop, tmp_path):
    ps = make_ps(tmp_path)
    there = [True]
    server = _server(ps, loop, "unix", alive=lambda: there[0])
    client = _client(server, "unix")
    path = server.endpoint["unix"]
    there[0] = False  # released from its worker
    wait_for_sync(lambda: server.closed, timeout=10)
    assert not os.path.exists(os.path.dirname(path))
    with pytest.raises(ConnectionError):
        client.pull("w-0").result(timeout=10)
    wait_for_sync(
        lambda: not [t for t in threading.enumerate() if t.name.startswith("transient-data-test")],
        timeout=10,
    )
    # Garbage-collected without a release: the same.
    ps2 = make_ps(tmp_path)
    second = _server(ps2, loop, "unix")
    del ps2
    gc.collect()
    wait_for_sync(lambda: second.closed, timeout=10)


def test_serve_ps_follows_the_runs_setting(loop, tmp_path, certs, monkeypatch):
    import asyncio

    async def serve(ps, worker):
        return serve_ps(ps, worker, ps.hp, "s")

    def run(ps, worker=None):
        return asyncio.run_coroutine_threadsafe(serve(ps, worker), loop).result(10)

    monkeypatch.delenv("TRANSIENT_NB_DATA_PLANE", raising=False)
    assert run(make_ps(tmp_path)) is None  # not on a worker, "auto": the actor
    assert run(make_ps(tmp_path, data_plane="dask")) is None
    ps = make_ps(tmp_path, data_plane="unix")
    server = run(ps)
    assert server.mode == "unix" and server.stall_s == HParams().call_timeout_s
    server.close()

    class Worker:  # what serve_ps reads of a worker
        def __init__(self, security):
            self.security = security
            self.address = "tls://127.0.0.1:1"
            self.state = type("S", (), {"actors": {}})()

    tls_ps = make_ps(tmp_path, data_plane="tls")
    assert run(tls_ps, Worker(None)) is None  # no certificates: the actor, said in the log
    worker = Worker(certs["ps"])
    monkeypatch.delenv("TRANSIENT_NB_DATA_PORTS", raising=False)
    worker.state.actors["ps"] = tls_ps
    server = run(tls_ps, worker)
    assert server.mode == "tls" and server.endpoint["tls"][0] == "127.0.0.1"
    del worker.state.actors["ps"]  # the actor released: its server goes
    wait_for_sync(lambda: server.closed, timeout=10)


def test_the_ps_metrics_the_policy_learns_from_count_the_data_planes_pushes(loop, tmp_path):
    """The policy learns the PS's capacity from shard 0's ``metrics`` (steps/s served): pushes
    over the data plane are the PS's own ``push_pull``, so they are counted there as before."""
    ps = make_ps(tmp_path, metrics_interval_s=0.05)
    events = []

    class Worker:  # what the PS posts its events through
        name = "ps-0"

        def log_event(self, topic, event):
            events.append(event)

    ps._worker = Worker()
    server = _server(ps, loop, "unix")
    client = _client(server, "unix")
    grad = np.zeros(N, np.float32)
    version = 0
    t0 = time.monotonic()
    while time.monotonic() - t0 < 0.5:
        version = client.push_pull(
            trainer="w-0", grad=grad, base_version=version, local_step=version + 1
        ).result(timeout=10)[2]
    metrics = [e for e in events if e["kind"] == "metrics"]
    # Every push up to the last window posted is counted once (the pushes after it wait for the
    # next window: how many depends on the host's pace, so they are not asserted).
    assert metrics and sum(e["updates"] for e in metrics) == metrics[-1]["step"]
    assert all(e["steps_per_s"] > 0 and e["shard"] == 0 for e in metrics)
    assert metrics[-1]["step"] <= version
    client.close()
    server.close()
