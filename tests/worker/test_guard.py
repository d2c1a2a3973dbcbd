"""Tests for transient_nb.worker.guard: what other VMs may ask of a worker and of its nanny.

A real local cluster over TLS: GPU worker ``w-0``'s certificate (its VM's files) may call the PS's
actor and fetch data from it, as trainers do, but not run a function on it, on its nanny, or
tell it to drain; the scheduler (``client.run``) and the cluster's client may.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from distributed import Client
from distributed.core import rpc
from distributed.protocol import pickle

from tests.deploy.test_guard import vm_security
from transient_nb import TransientCluster
from transient_nb.worker.guard import PEER_OPS, own_name


class Counter:
    """A stand-in for the PS actor: trainers on other workers call it."""

    def __init__(self) -> None:
        self.n = 0

    def add(self, k: int) -> int:
        self.n += k
        return self.n


def call_the_actor(counter: Any) -> int:
    # Runs on w-0: an actor call from one worker to another, with w-0's own certificate.
    return int(counter.add(5).result())


def where(dask_worker: Any = None) -> str:
    return str(dask_worker.name)


def test_other_vms_get_data_and_actors_only(cleanup: None) -> None:
    with (
        TransientCluster(workers=1, provisioning_delay=0, notice="1s", name="wguard") as cluster,
        Client(cluster) as client,
    ):
        cluster.wait_for_workers(1, timeout=120)
        workers = {w["name"]: a for a, w in client.scheduler_info()["workers"].items()}
        ps, w0 = workers["ps-0"], workers["w-0"]
        nanny = cluster.scheduler.workers[ps].nanny
        # Trainers' path: an actor on the PS, called from a task on the GPU worker.
        counter = client.submit(Counter, actor=True, workers=[ps]).result(timeout=60)
        assert client.submit(call_the_actor, counter, workers=[w0]).result(timeout=60) == 5
        # The scheduler (client.run goes through it) and the client may run functions.
        assert client.run(where) == {ps: "ps-0", w0: "w-0"}

        as_w0 = vm_security(cluster, "w-0").get_connection_args("client")
        function = pickle.dumps(where)

        async def ask(address: str, op: str, **kwargs: Any) -> Any:
            async with rpc(address, connection_args=as_w0, timeout=10) as r:
                return await asyncio.wait_for(getattr(r, op)(**kwargs), 10)

        for address, op, kwargs in [
            (ps, "run", {"function": function}),
            (ps, "run_coroutine", {"function": function}),
            (ps, "plugin-add", {"plugin": b"x"}),
            (ps, "transient_notice", {"deadline": 0.0}),
            (ps, "terminate", {}),
            (nanny, "run", {"function": function}),
            (nanny, "kill", {}),
        ]:
            with pytest.raises(PermissionError, match=rf"Refused '{op}' from a worker"):
                cluster.sync(ask, address, op, **kwargs)
        assert cluster.sync(ask, ps, "identity")["type"] == "Worker"  # harmless look-ups pass
        assert client.run(where, workers=[ps]) == {ps: "ps-0"}  # the PS is untouched


def test_a_worker_knows_its_own_name_and_guards_all_but_the_data_plane(tmp_path: Any) -> None:
    from distributed.security import Security

    from transient_nb.backends.tls import ClusterCA
    from transient_nb.worker.guard import install

    ca = ClusterCA.create("demo")
    files = ca.write_files(str(tmp_path), "demo-w-0", role="worker", vm="w-0")

    class Server:
        security = Security(tls_ca_file=files["ca"], tls_worker_cert=files["cert"])
        handlers = {"get_data": lambda: "data", "run": lambda comm: "ran", "close": lambda: 1}

    server = Server()
    assert own_name(server) == "demo-w-0"
    install(server)
    assert server.handlers["get_data"]() == "data"  # left as it is
    assert hasattr(server.handlers["run"], "__transient_guarded__")
    assert hasattr(server.handlers["close"], "__transient_guarded__")
    assert {"get_data", "actor_execute"} <= PEER_OPS and "run" not in PEER_OPS
