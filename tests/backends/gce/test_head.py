"""Tests for a detached GCE cluster's head VM (transient_nb.backends.gce.head,
gce_head_serve, and gce_head_ps: the PS on the head VM).

Against the fake Compute Engine: with ``run_vms=True`` the head VM's startup script really runs
``python -m transient_nb.deploy.head_vm`` (its own folder and HOME, its own metadata
server), which starts the cluster, whose PS and worker VMs run their startup scripts too. This
test process is the client "outside": it dials the head's external address (the fake's natIP,
127.0.0.1) with the certificate the head signed for it.
"""

from __future__ import annotations

import json
import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from distributed import Client
from distributed.security import Security

from tests.backends.gce.fake_gce import FakeGCE
from tests.backends.gce.gce_helpers import (
    PROJECT,
    metadata_items,
    new_fake,
    options,
    owner_labels,
    vm_body,
)
from tests.conftest import alive, of_kind, wait_for_sync
from transient_nb import TransientCluster, connect
from transient_nb.backends.gce.api import ComputeAPI
from transient_nb.backends.gce.head import (
    CLIENT_CSR_KEY,
    CLOUD_PLATFORM,
    HEAD_SPEC_KEY,
    head_spec,
)
from transient_nb.backends.tls import ClusterCA
from transient_nb.cli.commands import main as cli_main
from transient_nb.deploy import registry
from transient_nb.deploy.remote import RemoteCluster
from transient_nb.deploy.sweep import sweep

ZONE = "us-central1-a"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def head_options(fake: FakeGCE, **kw: Any) -> dict[str, Any]:
    """A detached cluster against the fake, reachable from this process (127.0.0.1/32)."""
    opts = {
        "detached": None,  # GCE's default: detached
        "client_cidr": "127.0.0.1/32",
        "scheduler_port": free_port(),
        **kw,
    }
    return options(fake, **opts)


@pytest.fixture
def running_fake(tmp_path: Path) -> Iterator[FakeGCE]:
    f = new_fake(tmp_path, run_vms=True, notice_s=2.0)
    yield f
    f.close()


def _body(fake: FakeGCE, name: str) -> dict[str, Any]:
    return next(b for b in fake.inserted() if b["name"] == name)


def vm_processes(fake: FakeGCE) -> set[int]:
    """Every process the fake's VMs run now: startup scripts and all they started (the head,
    its PS worker, the workers' nannies)."""
    pids = set(fake.pids())
    for pid in list(pids):
        try:
            pids |= {p.pid for p in psutil.Process(pid).children(recursive=True)}
        except psutil.NoSuchProcess:
            pass
    return pids


def _nothing_left(fake: FakeGCE, pids: set[int]) -> bool:
    return not fake.instance_names() and not fake.firewalls and not alive(pids)


# -- pure functions --------------------------------------------------------------------------------
def test_the_spec_keeps_the_clients_folders_and_objects_at_home() -> None:
    spec = head_spec(
        "demo",
        {"workers": 2, "credentials": object(), "run_dir": "/home/me/runs"},
        {"run-dir": "/home/me/runs", "registry-dir": "/home/me/reg", "gpu": "t4", "detached": None},
        "abc123",
    )
    assert spec == {
        "name": "demo",
        "cluster": {"workers": 2},
        "config": {"gpu": "t4", "detached": False},
        "cluster_id": "abc123",
    }
    json.dumps(spec)  # metadata is text


def test_a_head_vms_entry_is_never_stale_locally() -> None:
    registry.register(
        "far", {"pid": None, "head_vm": {"project": PROJECT, "zone": ZONE, "instance": "far-head"}}
    )
    (entry,) = registry.entries()
    assert entry["stale"] is False and entry["pid"] is None
    assert registry.owner(entry) == f"head VM far-head in {ZONE}"
    with pytest.raises(ValueError, match="head VM far-head"):
        registry.check_free("far")


# -- (d) bad input costs nothing ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"zone": "us-east1-b"}, "Zone 'us-east1-b' does not exist"),
        ({"gpu": "p100"}, "is not offered in"),
        ({"head_machine_type": "n9-huge"}, "Unknown machine type 'n9-huge'"),
        ({"head_machine_type": "a2-highgpu-1g"}, "head-machine-type 'a2-highgpu-1g'"),
        ({"client_cidr": None}, "gce.client-cidr"),
        ({"client_cidr": "10.0.0.1/8"}, "is not a network"),
        ({"workers": 0}, "workers=0"),
        # The head VM is billed as its own machine type (it hosts the PS): $0.22/h for a Spot
        # T4 and $0.38/h for an n1-standard-8 head go past $0.50/h (an n1-standard-4, $0.19/h,
        # would not).
        (
            {"head_machine_type": "n1-standard-8", "max_hourly_cost": 0.5, "head_timeout": 5},
            r"plus \$0.380/h for the head VM\), above max_hourly_cost=\$0.50/h",
        ),
    ],
)
def test_bad_settings_fail_before_any_instance_is_inserted(
    fake: FakeGCE, kw: dict[str, Any], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        TransientCluster(**{**head_options(fake), **kw}, name="bad")
    assert fake.inserted() == []
    assert fake.firewalls == {}
    assert registry.entries() == []


def test_without_client_cidr_the_error_shows_the_tunnel(fake: FakeGCE) -> None:
    with pytest.raises(ValueError) as e:
        TransientCluster(**{**head_options(fake), "client_cidr": None}, name="tunnel")
    assert "--tunnel-through-iap -- -N -L 8786:localhost:8786" in str(e.value)
    assert "head_address='tls://localhost:8786'" in str(e.value)


# -- sweep and head VMs ------------------------------------------------------------------------------
def test_sweep_keeps_a_running_heads_cluster_and_deletes_a_stopped_ones(fake: FakeGCE) -> None:
    api = ComputeAPI(PROJECT, api_endpoint=fake.url)
    # Created by heads (on another host: their owner pid says nothing here).
    for cluster, cid in (("up", "aaaa"), ("down", "bbbb")):
        labels = {**owner_labels(cluster, "head-host", 1), "transient-nb-id": cid}
        for vm, role in (("head", "head"), ("w-0", "worker")):
            extra = {"transient-nb-head": f"{cluster}-head"} if role != "head" else {}
            body = vm_body(f"{cluster}-{vm}", ZONE, {**labels, "transient-nb-role": role, **extra})
            api.wait_zone_operation(ZONE, api.insert_instance(ZONE, body))
        api.wait_global_operation(
            api.insert_firewall(
                {
                    "name": f"{cluster}-dask-client",
                    "description": (
                        f"transient_nb cluster {cluster} (host head-host, pid 1, id {cid}): x"
                    ),
                    "network": f"projects/{PROJECT}/global/networks/default",
                }
            )
        )
    # A worker whose head VM no longer exists at all.
    orphan = {
        **owner_labels("lost", "head-host", 1),
        "transient-nb-id": "cccc",
        "transient-nb-role": "worker",
        "transient-nb-head": "lost-head",
    }
    api.wait_zone_operation(ZONE, api.insert_instance(ZONE, vm_body("lost-w-0", ZONE, orphan)))
    wait_for_sync(lambda: fake.instance("down-head")["status"] == "RUNNING", timeout=10)
    fake.instance("down-head")["status"] = "TERMINATED"  # a crashed head powered itself off
    registry.register(
        "down",
        {"pid": None, "head_vm": {"project": PROJECT, "zone": ZONE, "instance": "down-head"}},
    )
    found = sweep(PROJECT, [ZONE], api_endpoint=fake.url, quiet=True, confirm=lambda d: True)
    by_name = {f["name"]: f for f in found}
    assert by_name["up-head"]["alive"] is True and by_name["up-w-0"]["alive"] is True
    assert by_name["up-dask-client"]["alive"] is True
    assert all(by_name[n]["deleted"] for n in ("down-head", "down-w-0", "down-dask-client"))
    # Only some zones were looked at: a head elsewhere may still run, so its worker is kept.
    assert by_name["lost-w-0"]["alive"] is None and not by_name["lost-w-0"]["deleted"]
    wait_for_sync(lambda: fake.instance_names() == ["lost-w-0", "up-head", "up-w-0"], timeout=30)
    assert sorted(fake.firewalls) == ["up-dask-client"]
    assert registry.entries() == []  # the gone head's local entry went with it


# -- (a) the head VM starts the head; a client connects over TLS from outside ------------------------
@pytest.mark.slow
def test_the_head_vm_runs_the_cluster_and_only_the_signed_client_gets_in(
    running_fake: FakeGCE, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = running_fake
    opts = head_options(fake)
    cluster = TransientCluster(**opts, name="hd")
    try:
        assert isinstance(cluster, RemoteCluster) and cluster.detached
        head = _body(fake, "hd-head")
        # On demand, no GPU, never Spot; the cluster's labels (role head), tags and a service
        # account with the cloud-platform scope.
        assert head["scheduling"]["provisioningModel"] == "STANDARD"
        assert "guestAccelerators" not in head
        assert head["machineType"] == f"zones/{ZONE}/machineTypes/n1-standard-4"
        assert head["labels"]["transient-nb-role"] == "head"
        assert head["tags"]["items"] == ["hd-vm", "hd-head"]
        assert head["serviceAccounts"] == [{"email": "default", "scopes": [CLOUD_PLATFORM]}]
        items = metadata_items(head)
        spec = json.loads(items[HEAD_SPEC_KEY])
        assert spec["cluster"]["workers"] == 1 and spec["cluster_id"]
        assert "registry-dir" not in spec["config"] and "run-dir" not in spec["config"]
        assert "CERTIFICATE REQUEST" in items[CLIENT_CSR_KEY]
        # The head's own VMs carry its cluster id and its name; no private key went anywhere
        # the API can read.
        for body in fake.inserted():
            assert body["labels"]["transient-nb-id"] == spec["cluster_id"]
            assert "PRIVATE KEY" not in json.dumps(body)
        for name in fake.instance_names():
            assert "PRIVATE KEY" not in json.dumps(fake.instance(name))
        # The scheduler is on the head VM, dialled on its external address.
        port = opts["scheduler_port"]
        entry = registry.lookup("hd")
        assert entry["scheduler_address"] == f"tls://127.0.0.1:{port}"
        assert entry["head_vm"]["instance"] == "hd-head" and entry["pid"] is None
        assert stat.S_IMODE(os.stat(entry["tls"]["key"]).st_mode) == 0o600
        assert fake.firewalls["hd-dask-client"]["sourceRanges"] == ["127.0.0.1/32"]
        assert fake.firewalls["hd-dask-client"]["targetTags"] == ["hd-head"]
        assert str(port) in fake.firewalls["hd-dask"]["allowed"][0]["ports"]
        cluster.wait_for_workers(1, timeout=90)
        # The PS is a process on the head VM (the paper's PS/scheduler host), not a VM of its
        # own; its line in the bill is the head VM's (on demand, its machine type).
        assert [b["name"] for b in fake.inserted()] == ["hd-head", "hd-w-0"]
        assert of_kind(cluster.monitor.events, "joined", worker="ps-0")
        assert of_kind(cluster.monitor.events, "running", worker="ps-0")[0]["instance"] == "hd-head"
        ps_bill = cluster.cost().per_vm.loc["ps-0"]
        assert ps_bill["role"] == "ps" and not ps_bill["spot"]
        assert ps_bill["price"] == ps_bill["price_on_demand"] > 0
        started = of_kind(cluster.monitor.events, "started")[0]
        assert started["scheduler_address"].endswith(f":{port}")
        # A second client on this machine uses the same entry.
        with connect("hd") as second:
            assert isinstance(second, RemoteCluster) and second.entry["tls"] == entry["tls"]
            assert of_kind(second.monitor.events, "joined", worker="w-0")
        # Without the certificate the head signed, no connection: a client that trusts the
        # cluster's CA (public) with a certificate of its own, or one of another cluster.
        intruder = ClusterCA.create("intruder").write_files(
            str(tmp_path / "x"), "transient-client", role="client"
        )
        for security in (
            Security(
                tls_ca_file=entry["tls"]["ca"],
                tls_client_cert=intruder["cert"],
                tls_client_key=intruder["key"],
                require_encryption=True,
            ),
            ClusterCA.create("other").cluster_security(),
        ):
            with pytest.raises((OSError, TimeoutError)):
                Client(entry["scheduler_address"], security=security, timeout=5).close()
        pids = vm_processes(fake)
        assert len(pids) >= 6  # two startup scripts, the head, its PS (nanny and worker), ...
        cluster.close()
        # The CLI on this machine finds it too, and `down` ends it: nothing is left.
        assert cli_main(["status", "hd"]) == 0
        assert "(head VM hd-head in us-central1-a)" in capsys.readouterr().out
        assert cli_main(["down", "hd"]) == 0
        assert "Cluster hd is down." in capsys.readouterr().out
        wait_for_sync(lambda: _nothing_left(fake, pids), timeout=60)
        assert registry.entries() == []
        assert not os.path.exists(os.path.dirname(entry["tls"]["key"]))
    finally:
        if registry.entries():
            connect("hd").shutdown()


# -- (b, c) preempted while no client is connected; shutdown and sweep leave nothing -----------------
@pytest.mark.slow
def test_the_head_replaces_a_preempted_worker_while_no_client_is_connected(
    running_fake: FakeGCE,
) -> None:
    fake = running_fake
    cluster = TransientCluster(**head_options(fake), name="hp")
    cluster.wait_for_workers(1, timeout=90)
    cluster.close()  # the handle only: nobody watches the cluster now
    fake.preempt("hp-w-0")
    # The head alone asks for a replacement (at the notice) and the preempted VM goes.
    wait_for_sync(
        lambda: (ZONE, "hp-w-1") in fake.procs and "hp-w-0" not in fake.instance_names(),
        timeout=90,
    )
    again = connect("hp")
    try:
        wait_for_sync(lambda: of_kind(again.monitor.events, "joined", worker="w-1"), timeout=90)
        log = list(again.monitor.events)
        assert of_kind(log, "notice", worker="w-0")[0]["source"] == "gce-metadata"
        assert of_kind(log, "preempted", worker="w-0")
        assert of_kind(log, "replacement-requested", worker="w-0")
        pids = vm_processes(fake)
        assert pids
        again.shutdown()
    finally:
        again.close()
    sweep(PROJECT, [ZONE], api_endpoint=fake.url, quiet=True, confirm=lambda d: True)
    wait_for_sync(lambda: _nothing_left(fake, pids), timeout=60)
    assert registry.entries() == []


# -- (e) a deadline stops a cluster no client is attached to; the head deletes itself ----------------
@pytest.mark.slow
def test_a_deadline_closes_the_cluster_and_the_head_vm_deletes_itself(
    running_fake: FakeGCE,
) -> None:
    fake = running_fake
    # Reached through a "tunnel" (gce.head-address) this time: no client firewall rule.
    opts = head_options(fake, deadline="20s", client_cidr=None)
    opts["head_address"] = f"tls://127.0.0.1:{opts['scheduler_port']}"
    cluster = TransientCluster(**opts, name="hl")
    assert cluster.scheduler_address == opts["head_address"]
    assert of_kind(cluster.monitor.events, "started")
    assert sorted(fake.firewalls) == ["hl-dask"]
    cluster.close()
    wait_for_sync(lambda: "hl-head" in fake.instance_names(), timeout=5)
    pids = vm_processes(fake)
    wait_for_sync(lambda: _nothing_left(fake, pids), timeout=90)
    # It was the deadline, enforced in the head: its run record (in the VM's home) says so, and
    # the cluster's close came after it.
    (record,) = Path(fake.workdir, "hl-head", ".transient_nb", "runs").glob("hl-*/events.jsonl")
    log = [json.loads(line) for line in record.read_text().splitlines()]
    (limit,) = of_kind(log, "limit-reached")
    assert "deadline of 20 s reached" in limit["reason"]
    assert log[-1]["kind"] == "closed"
    # The local entry outlived its head: connect() asks the API, says so and forgets it.
    with pytest.raises(ValueError, match="head VM hl-head no longer runs"):
        connect("hl")
    assert registry.entries() == []


# -- a head that cannot start: the client says why, and nothing is left ------------------------------
@pytest.mark.slow
def test_a_head_whose_cluster_cannot_start_says_why_and_leaves_nothing(
    running_fake: FakeGCE,
) -> None:
    fake = running_fake
    opts = head_options(fake)
    with socket.socket() as taken:  # the scheduler's port is in use on the head VM
        taken.bind(("127.0.0.1", opts["scheduler_port"]))
        taken.listen()
        with pytest.raises(RuntimeError, match="head VM down-head could not start its cluster"):
            TransientCluster(**opts, name="down")
    wait_for_sync(lambda: not fake.instance_names() and not fake.firewalls, timeout=60)
    assert registry.entries() == []


@pytest.mark.slow
def test_a_head_vm_whose_script_fails_is_reported_and_deleted(running_fake: FakeGCE) -> None:
    fake = running_fake
    with pytest.raises(RuntimeError, match="stopped while starting") as e:
        TransientCluster(**head_options(fake, python="/nonexistent/python"), name="crash")
    assert "get-serial-port-output crash-head" in str(e.value)
    wait_for_sync(lambda: not fake.instance_names(), timeout=60)
    assert registry.entries() == []


@pytest.mark.slow
def test_a_second_ps_host_of_a_head_is_an_on_demand_vm_of_its_own(running_fake: FakeGCE) -> None:
    # The first PS is a process on the head VM; ps_hosts=2 adds one on-demand VM (no GPU).
    fake = running_fake
    cluster = TransientCluster(**head_options(fake, ps_hosts=2), name="h2")
    try:
        cluster.wait_for_workers(1, timeout=120)
        wait_for_sync(
            lambda: (
                {"ps-0", "ps-1"}
                <= {str(e.get("worker")) for e in of_kind(cluster.monitor.events, "joined")}
            ),
            timeout=120,
        )
        vms = [n for n in fake.instance_names() if n.startswith("h2-")]
        assert sorted(vms) == ["h2-head", "h2-ps-1", "h2-w-0"]
        body = _body(fake, "h2-ps-1")
        assert body["scheduling"].get("provisioningModel") != "SPOT"
        assert not body.get("guestAccelerators")
        pids = vm_processes(fake)
        cluster.shutdown()
    finally:
        cluster.close()
    wait_for_sync(lambda: _nothing_left(fake, pids), timeout=90)
