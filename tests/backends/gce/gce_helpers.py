"""Shared helpers of the GCE tests: the fake Compute Engine fixture and cluster options."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from tests.backends.gce.fake_gce import FakeGCE
from transient_nb import TransientCluster

PROJECT = "test-project"
T4 = "nvidia-tesla-t4"


def new_fake(tmp_path: Path, **kw: Any) -> FakeGCE:
    """A fake Compute Engine for one test (close it when done: ``fake`` fixtures do)."""
    return FakeGCE(str(tmp_path / "vms"), project=PROJECT, **kw)


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
        # Attached: the scheduler in the test process (GCE's default is a head VM).
        "detached": False,
    }
    opts.update(kw)
    return opts


def events(cluster: TransientCluster) -> list[dict[str, Any]]:
    return list(cluster.monitor.events)


def metadata_items(body: dict[str, Any]) -> dict[str, str]:
    return {i["key"]: i["value"] for i in body["metadata"]["items"]}


def vm_body(name: str, zone: str, labels: dict[str, str]) -> dict[str, Any]:
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


def owner_labels(cluster: str, host: str, pid: int) -> dict[str, str]:
    return {
        "transient-nb": "true",
        "transient-nb-cluster": cluster,
        "transient-nb-host": host,
        "transient-nb-pid": str(pid),
    }
