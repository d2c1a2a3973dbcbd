"""Tests for transient_nb.deploy.sweep: what is deleted, and what never is."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import dask.config
import pytest

from tests.backends.gce.fake_gce import FakeGCE
from tests.backends.gce.gce_helpers import PROJECT, new_fake, owner_labels, vm_body
from transient_nb.backends.gce.api import ComputeAPI
from transient_nb.backends.gce.labels import this_host
from transient_nb.cli.commands import main as cli_main
from transient_nb.deploy import registry
from transient_nb.deploy.sweep import sweep


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeGCE]:
    f = new_fake(tmp_path)
    yield f
    f.close()


def test_sweep_deletes_the_vms_of_gone_clusters_only(
    fake: FakeGCE, capsys: pytest.CaptureFixture[str]
) -> None:
    api = ComputeAPI(PROJECT, api_endpoint=fake.url)
    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait()
    host = this_host()
    a, b = "us-central1-a", "us-central1-b"
    for name, zone, labels in [
        ("gone-w-0", a, owner_labels("gone", host, finished.pid)),
        ("gone-ps-0", b, owner_labels("gone", host, finished.pid)),
        ("live-w-0", a, owner_labels("live", host, os.getpid())),
        ("far-w-0", b, owner_labels("far", "another-host", 1)),
        ("not-ours", b, {"team": "data"}),
    ]:
        api.wait_zone_operation(zone, api.insert_instance(zone, vm_body(name, zone, labels)))
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


def test_sweep_matches_firewall_rules_by_cluster_id_not_by_name(fake: FakeGCE) -> None:
    api = ComputeAPI(PROJECT, api_endpoint=fake.url)
    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait()
    host = this_host()
    labels = {**owner_labels("demo", host, finished.pid), "transient-nb-id": "aaaaaaaaaaaa"}
    zone = "us-central1-a"
    api.wait_zone_operation(zone, api.insert_instance(zone, vm_body("demo-w-0", zone, labels)))
    # Same cluster name, another owner (another host, another id): not swept with ours.
    desc = "transient_nb cluster demo (host far-away, pid 7, id bbbbbbbbbbbb): Dask ports"
    fake.add_foreign_firewall("demo-dask", desc)
    found = sweep(PROJECT, [zone], api_endpoint=fake.url, quiet=True)
    assert [f["name"] for f in found if f["deleted"]] == ["demo-w-0"]
    assert "demo-dask" in fake.firewalls
