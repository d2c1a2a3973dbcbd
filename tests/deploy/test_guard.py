"""Tests for transient_nb.deploy.guard: what each certificate of a cluster may ask of its scheduler.

On the local backend, with real worker processes over TLS: a worker's own certificate and key
(the files its VM holds, what root there can read) used as a client cannot run a function on the
scheduler, submit a task, post a control request or speak for another VM; the client's
certificate can do all of it; a VM's certificate is refused once the VM is gone. The same on GCE,
against the fake, is in tests/backends/gce/test_backend.py.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest
from distributed import Client
from distributed.comm import connect
from distributed.core import rpc
from distributed.protocol import pickle
from distributed.security import Security

from tests.conftest import of_kind, wait_for, wait_for_sync
from tests.deploy.cluster_helpers import snapshot
from transient_nb import TransientCluster
from transient_nb.backends.tls import security_from_files
from transient_nb.deploy.guard import _STREAM_PEER, RoleGuard
from transient_nb.eventlog.vocabulary import CONTROL_TOPIC
from transient_nb.worker.peers import Peer


def vm_security(cluster: TransientCluster, vm: str) -> Security:
    """The certificate and key VM ``vm`` holds (0600 files on its disk), used as a client's."""
    folder = os.path.join(cluster.backend._tls_dir, vm)  # type: ignore[attr-defined]
    files = {k: os.path.join(folder, f) for k, f in (("ca", "ca.pem"), ("cert", f"{vm}.pem"))}
    files["key"] = os.path.join(folder, f"{vm}.key")
    return security_from_files(files, "client")


def ask(cluster: TransientCluster, security: Security, op: str, **kwargs: Any) -> Any:
    """Call ``op`` on the scheduler over RPC with ``security``'s certificate."""

    async def call() -> Any:
        args = security.get_connection_args("client")
        async with rpc(cluster.scheduler_address, connection_args=args, timeout=10) as r:
            return await asyncio.wait_for(getattr(r, op)(**kwargs), 10)

    return cluster.sync(call)


def on_scheduler() -> str:
    # Where a thief would read the head's cloud credentials.
    return "ran on the scheduler"


def test_a_workers_certificate_is_no_client_and_the_clients_is(cleanup: None) -> None:
    with TransientCluster(workers=1, provisioning_delay=0, name="roles") as cluster:
        cluster.wait_for_workers(1, timeout=120)
        as_worker = vm_security(cluster, "w-0")
        as_client = cluster.security
        function = pickle.dumps(on_scheduler)

        # Run a function on the scheduler.
        with pytest.raises(PermissionError, match=r"Refused 'run_function' from a worker"):
            ask(cluster, as_worker, "run_function", function=function)

        # Submit a task: a client stream is refused at its registration, and so is a task sent
        # to every worker through the scheduler (broadcast) or a plugin.
        async def submit_as_a_client() -> Any:
            # What Client() opens first: a stream, on which graphs are submitted. (A worker may
            # open one: Dask gives a worker that holds an actor a client of its own.)
            args = as_worker.get_connection_args("client")
            comm = await connect(cluster.scheduler_address, **args)
            try:
                await comm.write({"op": "register-client", "client": "thief", "versions": {}})
                await asyncio.wait_for(comm.read(), 10)  # the stream starts
                await comm.write({"op": "update-graph", "client": "thief", "keys": []})
                await comm.write({"op": "cancel-keys", "client": "thief", "keys": ["k"]})
                return await wait_for(lambda: ("cancel-keys", "w-0") in guard.refused, timeout=10)
            finally:
                comm.abort()

        guard = next(p for p in cluster.scheduler.plugins.values() if isinstance(p, RoleGuard))
        cluster.sync(submit_as_a_client)
        assert ("update-graph", "w-0") in guard.refused
        for op, kwargs in [
            ("broadcast", {"msg": {"op": "run", "function": function}}),
            ("register_scheduler_plugin", {"plugin": b"x", "name": "p"}),
            ("register_worker_plugin", {"plugin": b"x", "name": "p"}),
            ("feed", {"function": function}),
            ("terminate", {}),
        ]:
            with pytest.raises(PermissionError, match=rf"'{op}' from a worker certificate 'w-0'"):
                ask(cluster, as_worker, op, **kwargs)
        # Post a control request.
        ask(cluster, as_worker, "log_event", topic=CONTROL_TOPIC, msg={"action": "stop"})
        # Speak for another VM: retire or unregister ps-0, join under its name.
        ps = next(a for a, w in cluster.scheduler.workers.items() if w.name == "ps-0")
        for op, kwargs in [
            ("retire_workers", {"workers": [ps]}),
            ("retire_workers", {}),  # whichever the scheduler picks
            ("unregister", {"address": ps, "stimulus_id": "x"}),
            ("heartbeat_worker", {"address": ps, "now": 0.0, "metrics": {}}),
        ]:
            with pytest.raises(PermissionError, match=r"not its own VM|whichever"):
                ask(cluster, as_worker, op, **kwargs)
        assert ps in cluster.scheduler.workers  # still there
        # What a worker does ask for itself still works.
        assert ask(cluster, as_worker, "identity")["type"] == "Scheduler"
        refused = {
            (e["action"], e["sender"]) for e in of_kind(snapshot(cluster), "control-refused")
        }
        assert {("run_function", "w-0"), ("update-graph", "w-0"), ("stop", "w-0")} <= refused
        assert cluster.status.name == "running"

        # The client's certificate can do all of it.
        assert ask(cluster, as_client, "run_function", function=function) == {
            "status": "OK",
            "result": "ran on the scheduler",
        }
        with Client(cluster) as client:
            assert client.submit(sum, [1, 2]).result(timeout=60) == 3
            assert client.run_on_scheduler(on_scheduler) == "ran on the scheduler"
        ask(
            cluster,
            as_client,
            "log_event",
            topic=CONTROL_TOPIC,
            msg={"action": "scale", "workers": 2},
        )
        wait_for_sync(lambda: of_kind(snapshot(cluster), "control", action="scale", ok=True), 30)


def test_a_gone_vms_certificate_is_refused_whatever_it_asks(cleanup: None) -> None:
    with TransientCluster(workers=1, provisioning_delay=0, notice="1s", name="revoked") as cluster:
        cluster.wait_for_workers(1, timeout=120)
        as_w0 = vm_security(cluster, "w-0")
        assert ask(cluster, as_w0, "identity")["type"] == "Scheduler"
        cluster.preempt("w-0", notice=False)
        wait_for_sync(lambda: of_kind(snapshot(cluster), "preempted", worker="w-0"), 60)
        with pytest.raises(PermissionError, match="revoked"):
            ask(cluster, as_w0, "identity")
        # Its replacement has a certificate of its own, valid.
        wait_for_sync(lambda: of_kind(snapshot(cluster), "joined", worker="w-1"), 60)
        assert ask(cluster, vm_security(cluster, "w-1"), "identity")["type"] == "Scheduler"


def test_a_workers_stream_carries_no_client_operation() -> None:
    """The scheduler reads clients' and workers' streams with one table of handlers: a worker's
    stream is refused what only a client sends (a graph, keys to compute, subscriptions)."""
    guard = RoleGuard()
    called: list[str] = []
    worker = Peer("w-0", "worker", 1)
    update_graph = guard._guard_stream("update-graph", lambda **kw: called.append("graph"))
    finished = guard._guard_stream("task-finished", lambda **kw: called.append("finished"))
    token = _STREAM_PEER.set(worker)
    try:
        assert update_graph(client="x", worker="tls://w") is None
        finished(worker="tls://w", key="k")
    finally:
        _STREAM_PEER.reset(token)
    token = _STREAM_PEER.set(Peer("transient-client", "client", 2))
    try:
        update_graph(client="x")
    finally:
        _STREAM_PEER.reset(token)
    assert called == ["finished", "graph"]
    assert guard.refused == [("update-graph", "w-0")]
