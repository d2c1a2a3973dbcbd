"""Tests for transient_nb.deploy.control: control requests from other processes, over TLS."""

from __future__ import annotations

import os
from typing import Any

import pytest
from distributed import Client
from distributed.core import Status, rpc

from tests.conftest import (
    alive,
    child_pids,
    of_kind,
    vm_pids,
    wait_for_sync,
)
from tests.deploy.cluster_helpers import (
    replacement_of,
    snapshot,
    worker_states,
)
from transient_nb import TransientCluster
from transient_nb.deploy import registry
from transient_nb.eventlog.records import read_run_record
from transient_nb.eventlog.vocabulary import CONTROL_TOPIC


# -- control requests on the scheduler ------------------------------------------------------------
@pytest.mark.slow
def test_control_requests(cleanup: None) -> None:
    before = child_pids()
    with TransientCluster(
        workers=1, notice="1s", provisioning_delay=0, name="controlled"
    ) as cluster, Client(cluster) as client:  # fmt: skip
        cluster.wait_for_workers(timeout=60)

        def answer(request_id: int) -> dict[str, Any]:
            return wait_for_sync(
                lambda: of_kind(snapshot(cluster), "control", request=request_id), timeout=60
            )[0]

        client.log_event(CONTROL_TOPIC, {"action": "scale", "workers": 2, "id": 1})
        assert answer(1)["ok"] is True and answer(1)["action"] == "scale"
        wait_for_sync(lambda: len(worker_states(cluster)) == 2, timeout=60)

        client.log_event(
            CONTROL_TOPIC, {"action": "preempt", "worker": "w-1", "notice": False, "id": 2}
        )
        assert answer(2)["ok"] is True
        wait_for_sync(lambda: replacement_of(snapshot(cluster), "w-1")[0] == "w-2", timeout=60)
        events = snapshot(cluster)
        assert of_kind(events, "preempted", worker="w-1")[0]["notice"] is False
        assert of_kind(events, "notice", worker="w-1") == []

        for request_id, msg, error in [
            (3, {"action": "preempt", "worker": "w-99"}, "No preemptible worker named 'w-99'"),
            (4, {"action": "scale", "workers": -3}, "scale(-3)"),
            (5, {"action": "scale"}, "workers"),
            (6, {"action": "dance"}, "unknown action 'dance'"),
        ]:
            client.log_event(CONTROL_TOPIC, {**msg, "id": request_id})
            reply = answer(request_id)
            assert reply["ok"] is False and error in reply["error"], reply
        assert len(worker_states(cluster)) == 2
        assert registry.lookup("controlled")["stale"] is False
        pids = vm_pids(cluster)

        client.close()

        # "stop" comes over a plain RPC, as the JupyterLab panel sends it (a Client whose
        # scheduler closes under it keeps its loop thread alive: distributed's Client.close
        # returns early when the client is already closed).
        async def post(msg: dict[str, Any]) -> None:
            args = cluster.security.get_connection_args("client")
            async with rpc(cluster.scheduler_address, connection_args=args) as scheduler:
                await scheduler.log_event(topic=CONTROL_TOPIC, msg=msg)

        cluster.sync(post, {"action": "stop", "id": 7})
        assert answer(7)["ok"] is True
        wait_for_sync(lambda: cluster.status == Status.closed, timeout=60)
    record = read_run_record(cluster.run_record)
    assert record[-1]["kind"] == "closed"
    assert {e["worker"] for e in of_kind(record, "deleted")} == {"ps-0", "w-0", "w-2"}
    with pytest.raises(KeyError):
        registry.lookup("controlled")
    wait_for_sync(lambda: not alive(pids), timeout=30)
    wait_for_sync(lambda: not (child_pids() - before), timeout=30)


def test_the_local_control_plane_is_tls_and_obeys_only_its_own_client(cleanup: None) -> None:
    from distributed.security import Security

    from transient_nb.backends.tls import ClusterCA, security_from_files

    with TransientCluster(workers=1, provisioning_delay=0, name="private") as cluster:
        cluster.wait_for_workers(timeout=60)
        address = cluster.scheduler_address
        assert address.startswith("tls://127.0.0.1:")
        assert all(a.startswith("tls://") for a in cluster.scheduler.workers)
        entry = registry.lookup("private")
        for path in entry["tls"].values():
            assert os.stat(path).st_mode & 0o077 == 0  # this user's only

        async def control(args: dict[str, Any], request: int) -> None:
            async with rpc(address, connection_args=args, timeout=5) as scheduler:
                msg = {"action": "scale", "workers": 3, "id": request}
                await scheduler.log_event(topic=CONTROL_TOPIC, msg=msg)

        # Another user: no certificate of this cluster's CA, so no connection at all.
        other = ClusterCA.create("other")
        cert, key = other.issue("transient-client", role="client")
        stranger = Security(
            require_encryption=True, tls_ca_file=other.cert_pem, tls_client_cert=cert,
            tls_client_key=key,
        )  # fmt: skip
        with pytest.raises(OSError):
            cluster.sync(control, stranger.get_connection_args("client"), 1)
        # A worker's certificate connects (workers must), but its control requests are refused.
        folder = os.path.join(cluster.backend._tls_dir, "w-0")  # what root on w-0 can read
        worker_files = {
            "ca": os.path.join(folder, "ca.pem"),
            "cert": os.path.join(folder, "w-0.pem"),
            "key": os.path.join(folder, "w-0.key"),
        }
        as_worker = security_from_files(worker_files, "client").get_connection_args("client")
        cluster.sync(control, as_worker, 2)
        refused = wait_for_sync(lambda: of_kind(snapshot(cluster), "control-refused"), 30)
        assert refused[0]["sender"] == "w-0" and refused[0]["action"] == "scale"
        # The client's own certificate (the registry's files, as connect() and the panel use).
        as_client = security_from_files(entry["tls"], "client").get_connection_args("client")
        cluster.sync(control, as_client, 3)
        reply = wait_for_sync(lambda: of_kind(snapshot(cluster), "control", request=3), 30)[0]
        assert reply["ok"] is True and cluster._target == 3
        assert of_kind(snapshot(cluster), "control", request=2) == []
