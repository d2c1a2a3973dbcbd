"""Tests for transient_nb.backends.gce.api against the fake, which behaves like the REST reference."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.backends.gce.fake_gce import FakeGCE
from tests.backends.gce.gce_helpers import PROJECT, new_fake, vm_body
from transient_nb.backends.gce.api import ComputeAPI, GCEError


def test_the_fake_pages_lists_and_operations_take_several_polls(fake: FakeGCE) -> None:
    api = ComputeAPI(PROJECT, api_endpoint=fake.url)
    zone = "us-central1-a"
    ops = [
        api.insert_instance(zone, vm_body(f"page-{i}", zone, {"transient-nb": "true"}))
        for i in range(5)
    ]
    for op in ops:
        api.wait_zone_operation(zone, op)
    names = [i["name"] for i in api.list_instances(zone, 'labels.transient-nb = "true"')]
    assert names == [f"page-{i}" for i in range(5)]  # 3 pages of 2
    assert len(fake.calls("/zones/us-central1-a/instances")) >= 5 + 3
    polls = [c for c in fake.calls("/wait") if ops[0] in c]
    assert len(polls) >= 3  # PENDING -> RUNNING -> DONE
    inst = api.get_instance(zone, "page-0")
    assert inst is not None and inst["machineType"].startswith("https://")
    # A repeated insert with the same requestId gets the first one's operation, no 409.
    body = vm_body("page-x", zone, {})
    assert api.insert_instance(zone, body, "req-1") == api.insert_instance(zone, body, "req-1")
    with pytest.raises(GCEError) as e:
        api.get_zone("us-central1-x")
    assert e.value.status == 400


def test_a_late_staging_timer_never_sets_a_booted_vm_back(tmp_path: Path) -> None:
    # The fake's STAGING and boot timers are two threads; on a loaded CI machine the STAGING one
    # fired after the boot, the VM stayed STAGING and its cluster never saw it run.
    fake = new_fake(tmp_path, boot_s=3600)  # no timer fires during the test: we fire them
    try:
        api = ComputeAPI(PROJECT, api_endpoint=fake.url)
        zone = "us-central1-a"
        api.wait_zone_operation(zone, api.insert_instance(zone, vm_body("late", zone, {})))
        assert api.get_instance(zone, "late")["status"] == "PROVISIONING"
        fake._boot((zone, "late"))
        fake._set_status((zone, "late"), "STAGING")  # the STAGING timer, late
        assert api.get_instance(zone, "late")["status"] == "RUNNING"
    finally:
        fake.close()
