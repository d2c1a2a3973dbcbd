"""Tests for transient_nb.backends.gce.bodies: the instance and firewall bodies sent to GCE."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.backends.gce.test_options import backend
from transient_nb.backends.base import VMSpec
from transient_nb.backends.gce.bodies import accelerator_type, bundled_gpu_family
from transient_nb.catalog.prices import PriceCatalog


def test_gpu_names_map_to_gce_accelerators_and_bundled_families() -> None:
    assert accelerator_type("t4") == "nvidia-tesla-t4"
    assert accelerator_type("a100-40gb") == "nvidia-tesla-a100"
    with pytest.raises(ValueError, match="Unknown GPU type 'x9'"):
        accelerator_type("x9")
    assert bundled_gpu_family("a2-highgpu-1g") == "a2-"
    assert bundled_gpu_family("n1-standard-8") is None


def test_a_spot_gpu_workers_body(tmp_path: Path) -> None:
    b = backend(tmp_path)
    b.cluster_name, b.cluster_id = "demo", "abc123"
    price = PriceCatalog.load().worker_price("t4", "n1-standard-8", "us-central1-a")
    spec = VMSpec(
        "w-1", "worker", "t4", "us-central1-a", True, "n1-standard-8", price, 1, {"gpu": 1}
    )
    body = b.instance_body(spec, "tls://10.0.0.2:8786")
    assert body["name"] == "demo-w-1" and body["labels"]["transient-nb-id"] == "abc123"
    assert body["scheduling"]["provisioningModel"] == "SPOT"
    assert body["scheduling"]["instanceTerminationAction"] == "DELETE"
    (acc,) = body["guestAccelerators"]
    assert acc["acceleratorType"].endswith("/nvidia-tesla-t4") and acc["acceleratorCount"] == 1
    assert b.tag in body["tags"]["items"]
    keys = {i["key"] for i in body["metadata"]["items"]}
    assert "startup-script" in keys
    # No private key in metadata, ever: only certificates and the startup script.
    assert not any("PRIVATE KEY" in str(i["value"]) for i in body["metadata"]["items"])


def test_the_firewall_rule_opens_only_the_dask_ports_to_the_clusters_tag(tmp_path: Path) -> None:
    b = backend(tmp_path, worker_ports="41000:41099", nanny_ports="41100:41199")
    b.cluster_name, b.cluster_id = "demo", "abc123"
    rule = b.firewall_body("tls://10.0.0.2:8786")
    assert rule["targetTags"] == [b.tag]
    ports = sorted(p for allowed in rule["allowed"] for p in allowed["ports"])
    assert ports == ["41000-41099", "41100-41199", "41200-41299"]
