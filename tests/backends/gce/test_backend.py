"""Tests for the GCE backend and its VMs (gce.py, gce_vm.py), against a fake Compute Engine
(tests/backends/gce/fake_gce.py).

The real google-cloud-compute client talks to the fake REST server over HTTP; nothing of the SDK
is monkeypatched. Most tests keep VMs as API records only (``run_vms=False``: quick); the
end-to-end test boots them for real: the fake runs each VM's generated startup script, whose
``dask worker`` joins the scheduler over TLS and whose metadata server announces preemptions.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import dask.config
import psutil
import pytest
from distributed.core import Status

from tests.backends.gce.fake_gce import DEFAULT_ZONES, FakeGCE
from tests.backends.gce.gce_helpers import (
    PROJECT,
    T4,
    events,
    metadata_items,
    options,
)
from tests.conftest import alive, index_of, kinds, of_kind, wait_for_sync
from transient_nb import TransientCluster
from transient_nb.backends import get_backend
from transient_nb.backends.gce.api import ComputeAPI
from transient_nb.backends.gce.backend import GCEBackend
from transient_nb.deploy import registry


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
        assert "transient_nb.backends.gce.enroll" in script and "body-w-0" in script
        assert "--resources gpu=1" in script and "--name w-0" in script
        assert '"gpu": "t4"' in script and '"zone": "us-central1-a"' in script
        assert f"dask worker {cluster.scheduler_address}" in script
        assert cluster.scheduler_address.startswith("tls://")
        assert "pip install" not in script and "apt-get" not in script  # baked image
        # No private key anywhere the Compute API can read: the CA's certificate only (public);
        # the VM makes its own key and asks for a certificate at boot.
        assert set(items) == {"startup-script", "transient-nb-tls-ca", "enable-guest-attributes"}
        assert not any("PRIVATE KEY" in v for v in items.values())
        assert "BEGIN CERTIFICATE" in items["transient-nb-tls-ca"]
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
        # The firewall rule: the cluster's tag only, the Dask worker and nanny ports and the PS's
        # data plane only.
        rule = fake.firewalls["body-dask"]
        assert rule["targetTags"] == ["body-vm"] and rule["sourceTags"] == ["body-vm"]
        assert rule["allowed"] == [
            {"IPProtocol": "tcp", "ports": ["41000-41099", "41100-41199", "41200-41299"]}
        ]
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
    from transient_nb.catalog.prices import Price

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
        # Every type of a mix must attach to the machine type and be offered in a zone.
        ({"workers": {"t4": 1, "l4": 1}}, r"'l4'.*g2 machine type"),
        ({"workers": {"t4": 1, "v100": 1}, "zone": "us-central1-b"}, r"'v100'.*not offered"),
    ],
)
def test_bad_settings_are_named_with_how_to_list_valid_ones(
    fake: FakeGCE, kw: dict[str, Any], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        TransientCluster(**options(fake, **kw), name="bad")
    assert fake.inserted() == [] and fake.firewalls == {}


# -- mixed GPU types -----------------------------------------------------------------------------
def test_a_mixed_cluster_asks_gce_for_each_type_and_scales_one(fake: FakeGCE) -> None:
    def accelerators() -> dict[str, str]:
        return {
            b["name"]: b["guestAccelerators"][0]["acceleratorType"].rsplit("/", 1)[1]
            for b in fake.inserted()
            if b["labels"]["transient-nb-role"] == "worker"
        }

    mix = {"t4": 1, "v100": 1}
    with TransientCluster(**options(fake, workers=mix), name="mixed") as cluster:
        wait_for_sync(lambda: len(of_kind(events(cluster), "running")) == 3, timeout=30)
        assert accelerators() == {"mixed-w-0": T4, "mixed-w-1": "nvidia-tesla-v100"}
        cluster.scale(2, gpu="v100")  # only that type grows
        wait_for_sync(lambda: len(of_kind(events(cluster), "running")) == 4, timeout=30)
        assert accelerators()["mixed-w-2"] == "nvidia-tesla-v100"
        assert sorted(accelerators().values()).count(T4) == 1
        by_gpu = cluster.cost().by_gpu
        assert by_gpu.loc["v100", "vms"] == 2 and by_gpu.loc["t4", "vms"] == 1
    assert fake.instance_names() == []


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
        assert cluster.placement.stocked_out() == []
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
        assert cluster.placement.preempting("t4", "us-central1-a")
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
        # The replacement is asked for at the notice: it may run before w-0 is gone.
        gone = wait_for_sync(
            lambda: of_kind(events(cluster), "preempted", worker="w-0"), timeout=30
        )
        assert gone[0]["notice"] is True
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


# -- cleanup: a kernel that exits without closing its cluster -----------------------------------------
@pytest.mark.slow
def test_a_kernel_that_exits_without_closing_deletes_its_vms(fake: FakeGCE, tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import sys, time
        from transient_nb import TransientCluster
        cluster = TransientCluster(
            backend="gce", project={PROJECT!r}, api_endpoint={fake.url!r},
            scheduler_host="127.0.0.1", python=sys.executable, poll_interval=0.1,
            workers=1, provisioning_delay=0, name="exiting", detached=False,
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

    from transient_nb.worker.drain import register_drain_hook

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


# -- issue 11: ownership ------------------------------------------------------------------------------
@pytest.mark.slow
def test_the_ps_data_plane_is_mutual_tls_with_the_clusters_certificates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On GCE the gradients cross hosts: the PS's data plane is TLS with the cluster's
    certificates on the firewall's data ports; a trainer uses it, an outsider is refused."""
    from tests.conftest import endless_run
    from tests.training.wire.outsiders import assert_only_members_admitted

    # The fake's VMs are processes of this machine: its disk is shared by every one of them, a
    # bucket in all but name. train() refuses host-local storage on a cloud backend (tested in
    # tests/training/test_checkpoint.py); this test is about the data plane, so it lets it be.
    monkeypatch.setattr("transient_nb.training.run.check_checkpoint_url", lambda url, backend: None)
    fake = FakeGCE(str(tmp_path / "vms"), project=PROJECT, run_vms=True)
    (tmp_path / "ckpt").mkdir()  # a "bucket" that exists
    try:
        with TransientCluster(**options(fake), name="dp") as cluster:
            cluster.wait_for_workers(1, timeout=90)
            run = endless_run(cluster, checkpoint_url=f"file://{tmp_path}/ckpt")
            try:
                wait_for_sync(lambda: run.step >= 5, timeout=180)
                endpoint = run._ps[0].data_endpoint().result(timeout=30)
                # TLS only (the VMs are other hosts), on a port the firewall rule opens.
                assert "unix" not in endpoint
                assert 41200 <= endpoint["tls"][1] <= 41299
                assert_only_members_admitted(endpoint, cluster.backend.ca, str(tmp_path), "dp-w-0")
                step = run.step
                wait_for_sync(lambda: run.step >= step + 3, timeout=60)  # trains on
            finally:
                run.stop(wait=True, timeout=60)
            finished = of_kind(run.events(), "train-finished")[-1]
            assert {t["data_plane"] for t in json.loads(finished["trainers"])} == {"tls"}
    finally:
        fake.close()


def test_a_name_clash_never_deletes_someone_elses_vm_or_firewall(fake: FakeGCE) -> None:
    # A colleague's cluster "demo" already runs in the project.
    fake.add_foreign_instance("us-central1-a", "demo-ps-0", {"team": "colleague"})
    with pytest.raises(RuntimeError, match=r"demo-ps-0 already exists.*pick another cluster name"):
        TransientCluster(**options(fake), name="demo")
    assert fake.instance_names() == ["demo-ps-0"]  # still there
    assert not [c for c in fake.calls("/instances/demo-ps-0") if c.startswith("DELETE")]
    assert fake.firewalls == {}  # ours went with the refused start
    # A rule of the same name that does not carry our id is neither adopted nor deleted.
    fake.add_foreign_firewall("other-dask")
    with pytest.raises(RuntimeError, match=r"Firewall rule other-dask already exists"):
        TransientCluster(**options(fake), name="other")
    assert "other-dask" in fake.firewalls
    # Nothing of the refused cluster is left: no scheduler running here, no registry entry.
    assert [e["name"] for e in registry.entries()] == []
    assert not [
        c for c in TransientCluster._instances if c.name == "other" and c.status == Status.running
    ]
    assert not fake.calls("/global/firewalls/other-dask") or all(
        not c.startswith("DELETE") for c in fake.calls("/global/firewalls/other-dask")
    )
    assert fake.instance_names() == ["demo-ps-0"]


def test_every_resource_carries_the_clusters_unique_id(fake: FakeGCE) -> None:
    with TransientCluster(**options(fake), name="ids") as cluster:
        wait_for_sync(lambda: len(of_kind(events(cluster), "running")) == 2, timeout=30)
        assert {b["labels"]["transient-nb-id"] for b in fake.inserted()} == {cluster.cluster_id}
        assert f"id {cluster.cluster_id}" in fake.firewalls["ids-dask"]["description"]
        assert len(cluster.cluster_id) == 12
        # A worker name someone else took meanwhile: refused without a DELETE, and replaced
        # under the next name.
        fake.add_foreign_instance("us-central1-a", "ids-w-1", {"team": "colleague"})
        cluster.preempt("w-0", notice=False)
        wait_for_sync(lambda: of_kind(events(cluster), "running", worker="w-2"), timeout=30)
        assert of_kind(events(cluster), "provision-failed", worker="w-1")
        assert not [c for c in fake.calls("/instances/ids-w-1") if c.startswith("DELETE")]
    assert fake.instance_names() == ["ids-w-1"]  # close() deleted ours only


# -- issue 11: provisioning failures --------------------------------------------------------------------
def test_transient_errors_are_retried_with_backoff_and_are_not_stockouts(fake: FakeGCE) -> None:
    # A 503 backendError and a 429 rateLimitExceeded on the insert, a 503 on a read: each
    # goes away when asked again.
    fake.fail("POST", r"/zones/us-central1-a/instances$", 503)
    fake.fail("POST", r"/zones/us-central1-a/instances$", 429)
    fake.fail("GET", r"/operations/", 503, times=2)
    with TransientCluster(
        **options(fake, fallback_zones=["us-central1-b"], retry_backoff=0.01), name="retry"
    ) as cluster:
        wait_for_sync(lambda: len(of_kind(events(cluster), "running")) == 2, timeout=30)
        log = events(cluster)
        assert of_kind(log, "stockout") == [] and of_kind(log, "provision-failed") == []
        assert [e["zone"] for e in of_kind(log, "running")] == ["us-central1-a"] * 2
        assert cluster.placement.stocked_out() == []  # us-central1-a is not avoided
        retried = cluster.backend.api.retried
        assert any("backendError" in r for r in retried)
        assert any("rateLimitExceeded" in r for r in retried)
    assert fake.instance_names() == []


def test_a_failed_request_releases_its_slot_and_is_asked_again(fake: FakeGCE) -> None:
    with (
        dask.config.set({"transient.replacement.crash-backoff": "0.2s"}),
        TransientCluster(**options(fake, retries=1, retry_backoff=0.01), name="slot") as cluster,
    ):
        wait_for_sync(lambda: of_kind(events(cluster), "running", worker="w-0"), timeout=30)
        # More 503s than the API retries (1): the next insert fails for good.
        fake.fail("POST", r"/zones/us-central1-a/instances$", 503, times=2)
        cluster.scale(2)
        wait_for_sync(lambda: of_kind(events(cluster), "provision-failed"), timeout=30)
        # The slot was released and asked for again after the backoff: two workers in the end.
        wait_for_sync(lambda: len(of_kind(events(cluster), "running", role="worker")) == 2, 30)
        log = events(cluster)
        assert of_kind(log, "stockout") == []
        assert "backendError" in of_kind(log, "provision-failed")[0]["error"] or (
            "injected" in of_kind(log, "provision-failed")[0]["error"]
        )
        workers = {e["worker"] for e in of_kind(log, "running", role="worker")}
        assert set(cluster._slots.values()) == workers
    assert fake.instance_names() == []


def test_a_vm_whose_worker_never_joins_is_deleted_and_replaced_with_its_cost_shown(
    fake: FakeGCE, capsys: pytest.CaptureFixture[str]
) -> None:
    # run_vms=False: the VMs run (for GCE) but no worker ever joins.
    with (
        dask.config.set({"transient.replacement.crash-backoff": "0.1s"}),
        TransientCluster(**options(fake, join_timeout="1s"), name="nojoin") as cluster,
    ):
        e = wait_for_sync(
            lambda: of_kind(events(cluster), "join-timeout", worker="w-0"), timeout=30
        )
        assert e[0]["cost"] > 0 and e[0]["waited_s"] >= 1
        wait_for_sync(lambda: "nojoin-w-0" not in fake.instance_names(), timeout=30)
        wait_for_sync(
            lambda: of_kind(events(cluster), "requested", role="worker", worker="w-1"), 30
        )
    out = capsys.readouterr().out
    assert "without its worker joining" in out and "$" in out
    assert fake.instance_names() == []


@pytest.mark.slow
def test_workers_that_crash_on_start_back_off_and_the_user_is_told(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # An image whose Python is broken: every VM's worker exits at once, the script powers off.
    fake = FakeGCE(str(tmp_path / "vms"), project=PROJECT, run_vms=True)
    try:
        with (
            dask.config.set({"transient.replacement.crash-backoff": "0.5s"}),
            TransientCluster(**options(fake, python="/bin/false"), name="crash") as cluster,
        ):
            loops = wait_for_sync(
                lambda: [e for e in of_kind(events(cluster), "crash-loop") if e["failures"] >= 3],
                timeout=60,
            )
            delays = [e["delay_s"] for e in of_kind(events(cluster), "crash-loop")]
            assert delays == sorted(delays) and delays[-1] > delays[0]  # backs off
            assert loops[0]["reason"] == "worker crashed on start"
        assert "failed (worker crashed on start); the next attempt is in" in capsys.readouterr().out
        wait_for_sync(lambda: fake.instance_names() == [], timeout=30)
    finally:
        fake.close()


# -- issue 11: PS placement --------------------------------------------------------------------------
def test_the_ps_host_uses_the_fallback_zones(fake: FakeGCE) -> None:
    fake.exhaust("us-central1-a", "cpu")  # no room for the (GPU-less) PS host
    with TransientCluster(**options(fake, fallback_zones=["us-central1-b"]), name="psz") as c:
        e = wait_for_sync(lambda: of_kind(events(c), "running", role="ps"), timeout=30)
        assert e[0]["zone"] == "us-central1-b"
        assert c.placement.ps_zone == "us-central1-b"  # workers' fallbacks near it come first
        (s,) = of_kind(events(c), "stockout")
        assert s["worker"] == "ps-0" and s["gpu"] is None
    assert fake.instance_names() == []


def test_a_cluster_whose_ps_cannot_be_placed_refuses_to_start_and_leaves_nothing(
    fake: FakeGCE,
) -> None:
    for zone in ("us-central1-a", "us-central1-b"):
        fake.exhaust(zone, "cpu")
    with pytest.raises(RuntimeError, match=r"no zone could place its PS host.*n1-standard-4"):
        TransientCluster(**options(fake, fallback_zones=["us-central1-b"]), name="nops")
    assert fake.instance_names() == [] and fake.firewalls == {}
    assert registry.entries() == [] or all(e["name"] != "nops" for e in registry.entries())


# -- issue 11: input checked before spend --------------------------------------------------------------
def test_time_scale_is_refused_on_gce_before_anything_is_created(fake: FakeGCE) -> None:
    with pytest.raises(ValueError, match=r"time_scale=120 is only for the local backend"):
        TransientCluster(**options(fake, time_scale=120), name="scaled")
    assert fake.requests == []


def test_worker_count_and_hourly_cost_limits_are_refused_before_anything_is_created(
    fake: FakeGCE,
) -> None:
    with pytest.raises(ValueError, match=r"65 workers is above max_workers=64"):
        TransientCluster(**options(fake, workers=65), name="big")
    with pytest.raises(ValueError, match=r"above max_hourly_cost=\$0.50/h: ask for at most"):
        TransientCluster(**options(fake, workers=4, max_hourly_cost=0.5), name="dear")
    assert fake.requests == []


# -- issue 11: keys ------------------------------------------------------------------------------------
def _ca_only(ca: str) -> Any:
    import ssl

    ctx = ssl.create_default_context(cadata=ca)
    ctx.check_hostname = False  # as Dask's own TLS contexts: the CA is what is checked
    return ctx


def _connects(address: str, security: Any) -> bool:
    """Whether a client with ``security`` gets an answer from the scheduler at ``address``."""
    from distributed.core import rpc

    async def identity() -> None:
        args = security if isinstance(security, dict) else security.get_connection_args("client")
        async with rpc(address, connection_args=args, timeout=5) as scheduler:
            await asyncio.wait_for(scheduler.identity(), 5)

    try:
        asyncio.run(identity())
        return True
    except (OSError, asyncio.TimeoutError, ValueError, TypeError) as e:
        # TypeError: Dask cannot even build a TLS context without a client certificate.
        print("refused:", repr(e)[:200])
        return False


def test_what_instances_get_returns_cannot_connect_to_the_scheduler(fake: FakeGCE) -> None:
    from distributed.security import Security

    from transient_nb.backends.tls import ClusterCA, common_name, make_csr

    with TransientCluster(**options(fake, join_timeout="1h"), name="keys") as cluster:
        wait_for_sync(lambda: len(of_kind(events(cluster), "running")) == 2, timeout=30)
        # Two VMs publish certificate requests as guest attributes (as gce_enroll does): w-0
        # for its own name, ps-0 for the client's. Only the first is signed.
        _, csr = make_csr("keys-w-0")
        _, bad_csr = make_csr("transient-client")
        with fake.lock:
            fake.instance("keys-w-0").setdefault("_guest", {})["transient-nb/csr"] = csr
            fake.instance("keys-ps-0").setdefault("_guest", {})["transient-nb/csr"] = bad_csr
        api = ComputeAPI(PROJECT, api_endpoint=fake.url)

        def signed() -> dict[str, str]:
            inst = api.get_instance("us-central1-a", "keys-w-0")
            return metadata_items(inst) if "transient-nb-tls-cert" in metadata_items(inst) else {}

        items = wait_for_sync(signed, timeout=30)
        assert common_name(items["transient-nb-tls-cert"]) == "keys-w-0"
        refused = wait_for_sync(
            lambda: of_kind(events(cluster), "control-refused", action="sign-certificate"), 30
        )
        assert refused[0]["vm"] == "ps-0" and refused[0]["sender"] == "keys-ps-0"
        ps_items = metadata_items(api.get_instance("us-central1-a", "keys-ps-0"))
        assert "transient-nb-tls-cert" not in ps_items
        # Everything instances.get returns: no private key, in any field.
        for name in ("keys-w-0", "keys-ps-0"):
            assert "PRIVATE KEY" not in json.dumps(api.get_instance("us-central1-a", name))
        ca, worker_cert = items["transient-nb-tls-ca"], items["transient-nb-tls-cert"]
        address = cluster.scheduler_address
        # A reader of the metadata: the CA's and a worker's certificates, and its own keys.
        own = ClusterCA.create("attacker")
        own_cert, own_key = own.issue("transient-client", role="client")
        attempts = {
            "no client certificate": {"ssl_context": _ca_only(ca), "require_encryption": True},
            "a certificate of another CA": Security(
                require_encryption=True,
                tls_ca_file=ca,
                tls_client_cert=own_cert,
                tls_client_key=own_key,
            ),
            "the worker's certificate with another key": Security(
                require_encryption=True,
                tls_ca_file=ca,
                tls_client_cert=worker_cert,
                tls_client_key=own_key,
            ),
        }
        for what, security in attempts.items():
            assert not _connects(address, security), what
        # The cluster's own client connects (its own certificate, not the scheduler's).
        assert cluster.security.tls_client_cert != cluster.security.tls_scheduler_cert
        assert _connects(address, cluster.security)


def test_a_gpu_gce_does_not_offer_in_a_zone_is_never_asked_for_there(fake: FakeGCE) -> None:
    """The backend describes what GCE offers; the replacement policy, not the backend, decides
    to skip the rest: a V100 in us-central1-b (not offered there) is never a placement, so when
    every offered one is stocked out the stock-outs are the real ones only."""
    for zone in fake.zones:
        fake.exhaust(zone, spot_only=True)
    with TransientCluster(
        **options(fake, fallback_zones=["us-central1-b"], fallback_gpus=["v100"]),
        name="offered",
    ) as cluster:
        assert ("v100", "us-central1-b") in cluster.placement.not_offered
        assert [(p.gpu, p.zone) for p in cluster.placement.placements("t4")] == [
            ("t4", "us-central1-a"),
            ("t4", "us-central1-b"),
            ("v100", "us-central1-a"),
        ]
        wait_for_sync(lambda: of_kind(events(cluster), "capacity-exhausted"), timeout=30)
        tried = [(e["gpu"], e["zone"], e["reason"]) for e in of_kind(events(cluster), "stockout")]
        assert tried == [
            ("t4", "us-central1-a", "ZONE_RESOURCE_POOL_EXHAUSTED"),
            ("t4", "us-central1-b", "ZONE_RESOURCE_POOL_EXHAUSTED"),
            ("v100", "us-central1-a", "ZONE_RESOURCE_POOL_EXHAUSTED"),
        ]
    assert fake.instance_names() == []


# -- issue 30: a worker VM's own key is not a client's ------------------------------------------------
@pytest.mark.slow
def test_root_on_a_worker_vm_cannot_use_its_key_as_a_client(tmp_path: Path) -> None:
    """The worker VM's key and certificate, as root there reads them from the enrolment folder,
    connect (they must: the worker joins with them) but run nothing on the scheduler, submit
    nothing and post no control request; the cluster's client does all three. Once the VM is
    gone, its certificate is refused outright."""
    import glob

    from distributed.comm import connect
    from distributed.core import rpc
    from distributed.protocol import pickle
    from distributed.security import Security

    from transient_nb.eventlog.vocabulary import CONTROL_TOPIC

    fake = FakeGCE(str(tmp_path / "vms"), project=PROJECT, run_vms=True, notice_s=2.0)
    try:
        with TransientCluster(**options(fake), name="rootw") as cluster:
            cluster.wait_for_workers(1, timeout=90)
            (folder,) = glob.glob(os.path.join(fake.workdir, "rootw-w-0", "tmp", "tmp.*"))
            stolen = Security(
                require_encryption=True,
                tls_ca_file=os.path.join(folder, "ca.pem"),
                tls_client_cert=os.path.join(folder, "cert.pem"),
                tls_client_key=os.path.join(folder, "key.pem"),
            )
            function = pickle.dumps(os.getpid)

            async def ask(security: Security, op: str, **kwargs: Any) -> Any:
                args = security.get_connection_args("client")
                async with rpc(cluster.scheduler_address, connection_args=args, timeout=10) as r:
                    return await asyncio.wait_for(getattr(r, op)(**kwargs), 10)

            async def register_client(security: Security) -> Any:
                comm = await connect(
                    cluster.scheduler_address, **security.get_connection_args("client")
                )
                try:
                    # A stream that may submit graphs: what Client() opens first.
                    await comm.write({"op": "register-client", "client": "x", "versions": {}})
                    await comm.write({"op": "update-graph", "client": "x", "keys": []})
                    return await asyncio.wait_for(comm.read(), 10)
                finally:
                    comm.abort()

            with pytest.raises(PermissionError, match="'run_function' from a worker"):
                cluster.sync(ask, stolen, "run_function", function=function)
            for op in ("register_scheduler_plugin", "broadcast"):
                with pytest.raises(PermissionError, match=f"'{op}' from a worker"):
                    cluster.sync(ask, stolen, op, msg={}, plugin=b"", name="x")
            cluster.sync(ask, stolen, "log_event", topic=CONTROL_TOPIC, msg={"action": "stop"})
            cluster.sync(register_client, stolen)
            refused = {
                (e["action"], e["sender"]) for e in of_kind(events(cluster), "control-refused")
            }
            assert {
                ("run_function", "rootw-w-0"),
                ("stop", "rootw-w-0"),
                ("update-graph", "rootw-w-0"),
            } <= refused
            assert cluster.status.name == "running"
            # The cluster's own client runs a function on the scheduler.
            answer = cluster.sync(ask, cluster.security, "run_function", function=function)
            assert answer == {"status": "OK", "result": os.getpid()}
            # The VM goes: its certificate with it.
            cluster.preempt("w-0", notice=False)
            wait_for_sync(lambda: of_kind(events(cluster), "preempted", worker="w-0"), 60)
            with pytest.raises(PermissionError, match="revoked"):
                cluster.sync(ask, stolen, "identity")
    finally:
        fake.close()


# -- issue 30: a running cluster renews its lease -----------------------------------------------------
def test_a_running_cluster_renews_the_lease_of_its_vms_and_rule(fake: FakeGCE) -> None:
    from transient_nb.backends.gce.labels import firewall_owner, lease_of, owner_label

    with (
        dask.config.set(
            {"transient.gce.lease-interval": "0.2s", "transient.gce.lease-duration": "1s"}
        ),
        TransientCluster(
            **options(fake, join_timeout="1h"), name="lease", owner="a@b.c"
        ) as cluster,
    ):
        wait_for_sync(lambda: len(of_kind(events(cluster), "running")) == 2, timeout=30)

        def leases() -> dict[str, float]:
            out = {
                n: lease_of(fake.instance(n)["labels"]["transient-nb-lease"])
                for n in ("lease-ps-0", "lease-w-0")
            }
            out["rule"] = lease_of(
                firewall_owner(fake.firewalls["lease-dask"])["transient-nb-lease"]
            )  # type: ignore[index]
            return out  # type: ignore[return-value]

        first = leases()
        wait_for_sync(lambda: all(leases()[k] > first[k] for k in first), timeout=30)
        assert fake.instance("lease-w-0")["labels"]["transient-nb-owner"] == owner_label("a@b.c")
        assert cluster.backend.owner == owner_label("a@b.c")  # type: ignore[attr-defined]
    assert fake.instance_names() == []
