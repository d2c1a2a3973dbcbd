"""Tests for the GCE backend, against a fake Compute Engine (tests/backends/fake_gce.py).

The real google-cloud-compute client talks to the fake REST server over HTTP; nothing of the SDK
is monkeypatched. Most tests keep VMs as API records only (``run_vms=False``: quick); the
end-to-end test boots them for real: the fake runs each VM's generated startup script, whose
``dask worker`` joins the scheduler over TLS and whose metadata server announces preemptions.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dask.config
import psutil
import pytest
from conftest import alive, index_of, kinds, of_kind, wait_for, wait_for_sync
from fake_gce import DEFAULT_ZONES, FakeGCE, FakeMetadata

from transient_nb import TransientCluster, registry
from transient_nb.backends import gce as gce_mod
from transient_nb.backends import get_backend
from transient_nb.backends.gce import GCEBackend, sweep
from transient_nb.backends.gce_agent import wait_for_preemption
from transient_nb.backends.gce_api import ComputeAPI
from transient_nb.cli import main as cli_main

PROJECT = "test-project"
T4 = "nvidia-tesla-t4"


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeGCE]:
    f = FakeGCE(str(tmp_path / "vms"), project=PROJECT)
    yield f
    f.close()


def options(fake: FakeGCE, **kw: Any) -> dict[str, Any]:
    """A GCE cluster against the fake: quick polls, a 2 s notice, the test's own Python."""
    opts: dict[str, Any] = {
        "backend": "gce",
        "project": fake.project,
        "api_endpoint": fake.url,
        "scheduler_host": "127.0.0.1",
        "python": sys.executable,
        "poll_interval": 0.1,
        "operation_timeout": 30,
        "death_timeout": "30s",
        "workers": 1,
        "gpu": "t4",
        "zone": "us-central1-a",
        "notice": "2s",
        "provisioning_delay": 0,
    }
    opts.update(kw)
    return opts


def events(cluster: TransientCluster) -> list[dict[str, Any]]:
    return list(cluster.monitor.events)


def metadata_items(body: dict[str, Any]) -> dict[str, str]:
    return {i["key"]: i["value"] for i in body["metadata"]["items"]}


# -- the request body ---------------------------------------------------------------------------
def test_request_bodies_of_a_spot_gpu_worker_and_the_on_demand_ps(fake: FakeGCE) -> None:
    with TransientCluster(**options(fake), name="body") as cluster:
        wait_for_sync(lambda: len(of_kind(events(cluster), "running")) == 2, timeout=30)
        bodies = {b["labels"]["transient-nb-role"]: b for b in fake.inserted()}
        worker, ps = bodies["worker"], bodies["ps"]
        # GCE's documented fields of a Spot GPU VM, as they went over the wire.
        assert worker["name"] == "body-w-0"
        assert worker["machineType"] == "zones/us-central1-a/machineTypes/n1-standard-8"
        disk = worker["disks"][0]
        assert disk["boot"] is True and disk["autoDelete"] is True
        assert (
            disk["initializeParams"]["sourceImage"]
            == f"projects/{PROJECT}/global/images/family/transient-nb"
        )
        assert worker["networkInterfaces"][0]["network"] == (
            f"projects/{PROJECT}/global/networks/default"
        )
        assert worker["guestAccelerators"] == [
            {
                "acceleratorType": f"projects/{PROJECT}/zones/us-central1-a/acceleratorTypes/{T4}",
                "acceleratorCount": 1,
            }
        ]
        assert worker["scheduling"] == {
            "provisioningModel": "SPOT",
            "instanceTerminationAction": "DELETE",
            "onHostMaintenance": "TERMINATE",
            "automaticRestart": False,
        }
        assert worker["labels"]["transient-nb"] == "true"
        assert worker["labels"]["transient-nb-cluster"] == "body"
        assert worker["labels"]["transient-nb-pid"] == str(os.getpid())
        assert worker["tags"] == {"items": ["body-vm"]}
        assert worker["serviceAccounts"] == [
            {
                "email": "default",
                "scopes": [
                    "https://www.googleapis.com/auth/devstorage.read_write",
                    "https://www.googleapis.com/auth/logging.write",
                ],
            }
        ]
        items = metadata_items(worker)
        script = items["startup-script"]
        # No credential of any kind in the script: the cluster's TLS key comes from its own key,
        # and the VM acts with its service account.
        for secret in ("PRIVATE KEY", "BEGIN CERTIFICATE", "token", "client_secret", "password"):
            assert secret not in script
        assert "--resources gpu=1" in script and "--name w-0" in script
        assert '"gpu": "t4"' in script and '"zone": "us-central1-a"' in script
        assert f"dask worker {cluster.scheduler_address}" in script
        assert cluster.scheduler_address.startswith("tls://")
        assert "pip install" not in script and "apt-get" not in script  # baked image
        assert "PRIVATE KEY" in items["transient-nb-tls-key"]
        assert set(items) == {"startup-script", "transient-nb-tls-cert", "transient-nb-tls-key"}
        # The PS host: on demand, no GPU, live-migrates.
        assert ps["name"] == "body-ps-0"
        assert ps["machineType"] == "zones/us-central1-a/machineTypes/n1-standard-4"
        assert "guestAccelerators" not in ps
        assert ps["scheduling"] == {
            "provisioningModel": "STANDARD",
            "onHostMaintenance": "MIGRATE",
            "automaticRestart": True,
        }
        assert "--resources ps=1" in metadata_items(ps)["startup-script"]
        # The firewall rule: the cluster's tag only, the Dask worker and nanny ports only.
        rule = fake.firewalls["body-dask"]
        assert rule["targetTags"] == ["body-vm"] and rule["sourceTags"] == ["body-vm"]
        assert rule["allowed"] == [{"IPProtocol": "tcp", "ports": ["41000-41099", "41100-41199"]}]
        assert "sourceRanges" not in rule  # the scheduler is on 127.0.0.1 here
        assert rule["direction"] == "INGRESS"
        # The dashboard is not exposed: it listens on the loopback interface.
        assert "127.0.0.1" in cluster.dashboard_link
    assert fake.instance_names() == []
    assert fake.firewalls == {}


def test_legacy_preemptible_stop_action_and_on_demand_workers(fake: FakeGCE) -> None:
    backend = GCEBackend(
        "/tmp", project=PROJECT, api_endpoint=fake.url, provisioning_model="preemptible"
    )
    from transient_nb.backends import VMSpec
    from transient_nb.prices import Price

    price = Price(1.0, 0.5)
    spot = VMSpec("w-0", "worker", "l4", "us-central1-b", True, "g2-standard-4", price)
    body = backend.instance_body(spot, "tls://10.0.0.2:8786")
    assert body["scheduling"] == {
        "preemptible": True,
        "onHostMaintenance": "TERMINATE",
        "automaticRestart": False,
    }
    assert "guestAccelerators" not in body  # g2 machine types come with their L4
    backend = GCEBackend("/tmp", project=PROJECT, api_endpoint=fake.url, termination_action="STOP")
    assert backend.instance_body(spot, "tls://x:1")["scheduling"]["instanceTerminationAction"] == (
        "STOP"
    )
    on_demand = VMSpec("w-1", "worker", "t4", "us-central1-a", False, "n1-standard-8", price)
    assert backend.instance_body(on_demand, "tls://x:1")["scheduling"] == {
        "provisioningModel": "STANDARD",
        "onHostMaintenance": "TERMINATE",
        "automaticRestart": True,
    }
    assert get_backend("gce", log_dir="/tmp", project=PROJECT, api_endpoint=fake.url).name == "gce"


# -- mistakes are caught before anything is created ------------------------------------------------
@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"project": "no-such-project"}, r"'no-such-project'.*gcloud projects list"),
        ({"zone": "us-central1-x"}, r"'us-central1-x'"),  # unknown to the price catalog
        ({"fallback_zones": ["us-east1-b"]}, r"'us-east1-b'.*gcloud compute zones list"),
        ({"machine_type": "a2-highgpu-1g"}, r"'a2-highgpu-1g'.*gcloud compute machine-types list"),
        ({"gpu": "t5"}, r"'t5'"),  # unknown to the catalog: it lists the valid names
        ({"zone": "us-central1-f"}, r"'t4'.*not offered.*accelerator-types list"),
        ({"image_family": "no-image"}, r"'no-image'.*gce_image.md.*gcloud compute images list"),
        ({"gpu": "l4"}, r"'l4'.*g2 machine type"),
        ({"termination_action": "EXPLODE"}, r"EXPLODE"),
        ({"scheduler": "vm"}, r"scheduler='vm' is not supported"),
    ],
)
def test_bad_settings_are_named_with_how_to_list_valid_ones(
    fake: FakeGCE, kw: dict[str, Any], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        TransientCluster(**options(fake, **kw), name="bad")
    assert fake.inserted() == [] and fake.firewalls == {}


# -- capacity: fallbacks, stock-outs, nothing left behind ----------------------------------------
def test_stockouts_fall_back_and_a_regional_quota_skips_its_region(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    zones = {**DEFAULT_ZONES, "us-east1-b": {T4}}
    fake = FakeGCE(str(tmp_path / "vms"), project=PROJECT, zones=zones)
    try:
        fake.exhaust("us-central1-a")  # no GPU at all: a stock-out
        fake.quota_exceeded("us-central1-b", how="http")  # NVIDIA_T4_GPUS of us-central1: a 403
        fallback = ["us-central1-b", "us-central1-c", "us-east1-b"]
        with TransientCluster(
            **options(fake, workers=1, fallback_zones=fallback), name="fall"
        ) as cluster:
            wait_for_sync(lambda: len(of_kind(events(cluster), "running")) == 2, timeout=30)
            log = events(cluster)
            assert [(e["zone"], e["reason"]) for e in of_kind(log, "stockout")] == [
                ("us-central1-a", "ZONE_RESOURCE_POOL_EXHAUSTED")
            ]
            quota = of_kind(log, "quota-exceeded")
            assert [(q["quota"], q["region"], q["zone"]) for q in quota] == [
                ("NVIDIA_T4_GPUS", "us-central1", "us-central1-b")
            ]
            # The quota is the region's: us-central1-c shares it and is not asked.
            asked = [
                b["machineType"].split("/")[1]
                for b in fake.inserted()
                if b["labels"]["transient-nb-role"] == "worker"
            ]
            assert asked == ["us-central1-a", "us-central1-b", "us-east1-b"]
            running = of_kind(log, "running", role="worker")
            assert [(e["gpu"], e["zone"]) for e in running] == [("t4", "us-east1-b")]
            assert fake.instance_names() == ["fall-ps-0", running[0]["instance"]]
        assert fake.instance_names() == []
        out = capsys.readouterr().out
        assert "NVIDIA_T4_GPUS" in out and "gcloud compute regions describe us-central1" in out
    finally:
        fake.close()


def test_a_global_gpu_quota_is_named_with_how_to_raise_it_and_is_not_a_stockout(
    fake: FakeGCE, capsys: pytest.CaptureFixture[str]
) -> None:
    # GPUS_ALL_REGIONS is 0 on every new project: the most common first error.
    fake.quota_exceeded("us-central1-a", how="operation")
    with TransientCluster(
        **options(fake, fallback_zones=["us-central1-b"], fallback_gpus=["v100"]), name="quota"
    ) as cluster:
        e = wait_for_sync(lambda: of_kind(events(cluster), "capacity-exhausted"), timeout=30)
        log = events(cluster)
        assert of_kind(log, "stockout") == []
        (q,) = of_kind(log, "quota-exceeded")
        assert (q["quota"], q["region"], q["limit"]) == ("GPUS_ALL_REGIONS", "global", 0)
        assert "GPUS_ALL_REGIONS" in e[0]["reason"]
        # A global quota: no other zone or GPU type is tried.
        assert [b["name"] for b in fake.inserted()] == ["quota-ps-0", "quota-w-0"]
        assert cluster.policy.stocked_out() == []
    out = capsys.readouterr().out
    assert "Quota GPUS_ALL_REGIONS (all regions) is used up" in out
    assert f"gcloud compute project-info describe --project {PROJECT}" in out
    assert "console.cloud.google.com/iam-admin/quotas" in out
    assert "no t4 capacity" not in out
    assert fake.instance_names() == []


def test_every_zone_exhausted_tells_the_user_and_leaves_nothing(
    fake: FakeGCE, capsys: pytest.CaptureFixture[str]
) -> None:
    for zone in fake.zones:
        fake.exhaust(zone, spot_only=True)
    with TransientCluster(
        **options(fake, fallback_zones=["us-central1-b"]), name="none-left"
    ) as cluster:
        wait_for_sync(lambda: of_kind(events(cluster), "capacity-exhausted"), timeout=30)
        assert [e["reason"] for e in of_kind(events(cluster), "stockout")] == [
            "ZONE_RESOURCE_POOL_EXHAUSTED"
        ] * 2
        assert fake.instance_names() == ["none-left-ps-0"]  # no worker VM, not even a stopped one
    assert "No capacity left for a worker" in capsys.readouterr().out
    assert fake.instance_names() == []
    # On-demand fallback: the same stock-out, and the worker comes on demand.
    with TransientCluster(**options(fake, on_demand_fallback=True), name="od") as cluster:
        e = wait_for_sync(lambda: of_kind(events(cluster), "running", role="worker"), timeout=30)
        assert e[0]["spot"] is False
        assert fake.instance(e[0]["instance"])["scheduling"]["provisioningModel"] == "STANDARD"
    assert fake.instance_names() == []


def test_repeated_preemptions_move_workers_to_the_next_zone(fake: FakeGCE) -> None:
    # No worker process runs (run_vms=False): the fallback signal (the VM's state) sees the stop.
    # The policy (not the backend) counts the preemption and tries the zone last.
    with (
        dask.config.set({"transient.replacement.preemption-limit": 1}),
        TransientCluster(
            **options(fake, fallback_zones=["us-central1-b"], join_timeout="1h"), name="again"
        ) as cluster,
    ):
        wait_for_sync(lambda: of_kind(events(cluster), "running", worker="w-0"), timeout=30)
        fake.preempt("again-w-0")
        e = wait_for_sync(
            lambda: of_kind(events(cluster), "running", role="worker", zone="us-central1-b"),
            timeout=30,
        )
        assert e[0]["worker"] == "w-1"  # straight to the next zone: no attempt in the avoided one
        log = events(cluster)
        assert of_kind(log, "preempted", worker="w-0")[0]["source"] == "lost"
        assert of_kind(log, "stockout") == []
        assert cluster.policy.preempting("t4", "us-central1-a")
        assert "again-w-0" not in fake.instance_names()


# -- preemption on demand ---------------------------------------------------------------------------
def test_preempt_uses_simulate_maintenance_event_or_deletes_without_notice(
    fake: FakeGCE,
) -> None:
    with TransientCluster(**options(fake, notice="1s"), name="manual") as cluster:
        wait_for_sync(lambda: of_kind(events(cluster), "running", worker="w-0"), timeout=30)
        cluster.preempt("w-0")
        wait_for_sync(lambda: of_kind(events(cluster), "running", worker="w-1"), timeout=30)
        assert fake.calls("/instances/manual-w-0/simulateMaintenanceEvent")
        assert of_kind(events(cluster), "preempted", worker="w-0")[0]["notice"] is True
        cluster.preempt("w-1", notice=False)
        wait_for_sync(lambda: of_kind(events(cluster), "preempted", worker="w-1"), timeout=30)
        assert not fake.calls("/instances/manual-w-1/simulateMaintenanceEvent")
        assert fake.calls("/instances/manual-w-1")[-1].startswith("DELETE ")
        assert "manual-w-1" not in fake.instance_names()


# -- money and time limits ----------------------------------------------------------------------------
def test_budget_and_deadline_stop_the_cluster(fake: FakeGCE) -> None:
    # One minute of minimum billing of the PS and a T4 worker is more than a tenth of a cent.
    with TransientCluster(**options(fake, budget=0.001), name="budget") as cluster:
        wait_for_sync(lambda: of_kind(events(cluster), "closed"), timeout=30)
        assert "budget" in of_kind(events(cluster), "limit-reached")[0]["reason"]
    assert fake.instance_names() == []
    with TransientCluster(**options(fake, deadline="1s"), name="deadline") as cluster:
        wait_for_sync(lambda: of_kind(events(cluster), "closed"), timeout=30)
        assert "deadline" in of_kind(events(cluster), "limit-reached")[0]["reason"]
    assert fake.instance_names() == []


# -- the metadata watcher inside the VM ----------------------------------------------------------------
def test_metadata_watcher_sees_notices_given_at_any_time(monkeypatch: pytest.MonkeyPatch) -> None:
    md = FakeMetadata({"name": "vm", "metadata": {"items": []}, "_zone": "z"}, PROJECT)
    monkeypatch.setenv("GCE_METADATA_HOST", md.host)

    async def notice_while_hanging() -> None:
        task = asyncio.ensure_future(wait_for_preemption())
        await wait_for(lambda: any("wait_for_change=true" in r for r in md.requests), 10)
        assert not task.done()
        md.preempt()
        await asyncio.wait_for(task, 10)

    async def notice_already_given() -> None:
        await asyncio.wait_for(wait_for_preemption(), 10)

    try:
        asyncio.run(notice_while_hanging())
        n = len(md.requests)
        asyncio.run(notice_already_given())
        assert len(md.requests) == n + 1  # one plain GET, no hanging one
    finally:
        md.close()


# -- cleanup: sweep, and a kernel that exits without closing its cluster -----------------------------
def _vm_body(name: str, zone: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "name": name,
        "machineType": f"zones/{zone}/machineTypes/n1-standard-4",
        "disks": [
            {
                "boot": True,
                "initializeParams": {
                    "sourceImage": f"projects/{PROJECT}/global/images/family/transient-nb"
                },
            }
        ],
        "labels": labels,
    }


def _labels(cluster: str, host: str, pid: int) -> dict[str, str]:
    return {
        "transient-nb": "true",
        "transient-nb-cluster": cluster,
        "transient-nb-host": host,
        "transient-nb-pid": str(pid),
    }


def test_sweep_deletes_the_vms_of_gone_clusters_only(
    fake: FakeGCE, capsys: pytest.CaptureFixture[str]
) -> None:
    api = ComputeAPI(PROJECT, api_endpoint=fake.url)
    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait()
    host = gce_mod.this_host()
    a, b = "us-central1-a", "us-central1-b"
    for name, zone, labels in [
        ("gone-w-0", a, _labels("gone", host, finished.pid)),
        ("gone-ps-0", b, _labels("gone", host, finished.pid)),
        ("live-w-0", a, _labels("live", host, os.getpid())),
        ("far-w-0", b, _labels("far", "another-host", 1)),
        ("not-ours", b, {"team": "data"}),
    ]:
        api.wait_zone_operation(zone, api.insert_instance(zone, _vm_body(name, zone, labels)))
    registry.register("live", {"backend": "gce"})
    desc = f"transient_nb cluster gone (host {host}, pid {finished.pid}): Dask ports"
    api.wait_global_operation(
        api.insert_firewall(
            {
                "name": "gone-dask",
                "description": desc,
                "network": f"projects/{PROJECT}/global/networks/default",
                "allowed": [{"IPProtocol": "tcp", "ports": ["41000-41199"]}],
            }
        )
    )
    found = sweep(PROJECT, [a, b], dry_run=True, api_endpoint=fake.url)
    out = capsys.readouterr().out
    assert "gone-w-0" in out and "would delete" in out and "keep" in out
    assert not any(f["deleted"] for f in found)
    assert len(fake.instance_names()) == 5
    found = sweep(PROJECT, [a, b], api_endpoint=fake.url)
    assert sorted(f["name"] for f in found if f["deleted"]) == [
        "gone-dask",
        "gone-ps-0",
        "gone-w-0",
    ]
    assert fake.instance_names() == ["far-w-0", "live-w-0", "not-ours"]
    assert fake.firewalls == {}
    # The CLI shows the list and deletes after a yes; --force takes VMs of other machines too.
    with dask.config.set({"transient.gce.api-endpoint": fake.url}):
        rc = cli_main(["sweep", "--project", PROJECT, "--zone", a, "--zone", b, "--force", "--yes"])
    assert rc == 0
    assert "far-w-0" in capsys.readouterr().out
    assert fake.instance_names() == ["live-w-0", "not-ours"]


@pytest.mark.slow
def test_a_kernel_that_exits_without_closing_deletes_its_vms(fake: FakeGCE, tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import sys, time
        from transient_nb import TransientCluster
        cluster = TransientCluster(
            backend="gce", project={PROJECT!r}, api_endpoint={fake.url!r},
            scheduler_host="127.0.0.1", python=sys.executable, poll_interval=0.1,
            workers=1, provisioning_delay=0, name="exiting",
        )
        deadline = time.monotonic() + 60
        while sum(e["kind"] == "running" for e in cluster.monitor.events) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        print("both VMs run; exiting without close()", flush=True)
        """
    )
    env = {
        **os.environ,
        "DASK_TRANSIENT__RUN_DIR": str(tmp_path / "runs"),
        "DASK_TRANSIENT__REGISTRY_DIR": str(tmp_path / "clusters"),
    }
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert "both VMs run" in out.stdout, out.stderr[-3000:]
    assert len(fake.inserted()) == 2
    wait_for_sync(lambda: fake.instance_names() == [], timeout=30)
    assert fake.firewalls == {}


# -- the whole path, for real -------------------------------------------------------------------------
@pytest.mark.slow
def test_end_to_end_notice_drain_and_replacement_in_the_next_zone(tmp_path: Path) -> None:
    from distributed import Client

    from transient_nb.agent import register_drain_hook

    fake = FakeGCE(str(tmp_path / "vms"), project=PROJECT, run_vms=True, notice_s=2.0)
    try:
        with TransientCluster(
            **options(fake, fallback_zones=["us-central1-b"]), name="e2e"
        ) as cluster:
            assert cluster.replace_at == "notice"  # GCE's default
            cluster.wait_for_workers(1, timeout=90)
            with Client(cluster) as client:
                # Every connection is TLS: the scheduler, both workers, this client.
                workers = client.scheduler_info()["workers"]
                assert cluster.scheduler_address.startswith("tls://")
                assert len(workers) == 2 and all(a.startswith("tls://") for a in workers)
                w0 = next(a for a, w in workers.items() if w["name"] == "w-0")
                # A drain hook in the worker, as the trainer registers one.
                client.run(register_drain_hook, print, workers=[w0])
                # GCE's preemption: the metadata turns TRUE, the VM stops 2 s later; the first
                # zone has no T4 left by then.
                fake.exhaust("us-central1-a", T4)
                fake.preempt("e2e-w-0")

                def replacement_joined() -> bool:
                    return bool(of_kind(events(cluster), "joined", worker="w-2"))

                wait_for_sync(replacement_joined, timeout=90)
                wait_for_sync(lambda: len(cluster.scheduler.workers) == 2, timeout=30)
                # A crash without any notice: the worker dies, the startup script powers the VM
                # off, the VM's state shows it, and the VM is replaced.
                script = fake.procs[("us-central1-b", "e2e-w-2")]
                for p in psutil.Process(script.pid).children(recursive=True):
                    p.kill()
                wait_for_sync(lambda: of_kind(events(cluster), "joined", worker="w-3"), timeout=90)
            log = events(cluster)
            notice = index_of(log, "notice", worker="w-0")
            assert log[notice]["source"] == "gce-metadata"
            asked = index_of(log, "replacement-requested", worker="w-0")
            stockout = index_of(log, "stockout", worker="w-1")
            requested = index_of(log, "requested", worker="w-2")
            preempted = index_of(log, "preempted", worker="w-0")
            # The replacement was asked for at the notice, before the VM was gone.
            assert 0 <= notice < asked < stockout < requested
            assert asked < preempted
            assert log[stockout]["zone"] == "us-central1-a"
            assert log[requested]["zone"] == "us-central1-b"
            drained = of_kind(log, "drained", worker="w-0")
            assert drained and drained[0]["hooks"] == 1 and not drained[0]["errors"]
            assert index_of(log, "left", worker="w-0") >= 0
            w0_kinds = kinds(log, "w-0")
            assert w0_kinds.index("drained") < w0_kinds.index("preempted")
            costs = cluster.cost().per_vm
            assert costs.loc["w-0", "zone"] == "us-central1-a" and costs.loc["w-0", "cost"] > 0
            assert costs.loc["w-1", "seconds"] == 0  # never ran: nothing to pay
            assert costs.loc["w-2", "zone"] == "us-central1-b"
            assert costs.loc["ps-0", "spot"] == False  # noqa: E712
            lost = of_kind(log, "preempted", worker="w-2")
            assert lost[0]["source"] == "lost" and lost[0]["notice"] is False
            assert of_kind(log, "requested", worker="w-3")[0]["zone"] == "us-central1-b"
            pids = fake.pids()
        assert fake.instance_names() == []
        assert fake.firewalls == {}
        wait_for_sync(lambda: not alive(pids), timeout=30)
    finally:
        fake.close()
