"""Tests for transient_nb.deploy.sweep: what is deleted (the provably dead), and what never is."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import dask.config
import pytest

from tests.backends.gce.fake_gce import FakeGCE
from tests.backends.gce.gce_helpers import PROJECT, new_fake, options, owner_labels, vm_body
from tests.conftest import of_kind, wait_for_sync
from transient_nb import TransientCluster
from transient_nb.backends.gce.api import ComputeAPI
from transient_nb.backends.gce.labels import firewall_description, owner_label, this_host
from transient_nb.cli.commands import main as cli_main
from transient_nb.deploy.sweep import sweep

A, B = "us-central1-a", "us-central1-b"


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeGCE]:
    f = new_fake(tmp_path)
    yield f
    f.close()


def leased(cluster: str, cid: str, lease: float | None, owner: str = "alice@example.com") -> dict:
    """Labels of a VM of cluster ``cluster``, made on this very host, with a lease until ``lease``."""
    labels = {
        **owner_labels(cluster, this_host(), os.getpid()),  # same host, a live pid: no clue
        "transient-nb-id": cid,
        "transient-nb-owner": owner_label(owner),
    }
    if lease is not None:
        labels["transient-nb-lease"] = str(int(lease))
    return labels


def test_only_what_is_provably_dead_is_deleted_and_force_takes_named_ids_only(
    fake: FakeGCE, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    api = ComputeAPI(PROJECT, api_endpoint=fake.url)
    now = time.time()
    for name, zone, labels in [
        ("dead-w-0", A, leased("dead", "dddddddddddd", now - 3600)),
        ("dead-ps-0", B, leased("dead", "dddddddddddd", now - 3600)),
        ("live-w-0", A, leased("live", "aaaaaaaaaaaa", now + 300)),
        # Ran out a moment ago: within the margin (a late renewal, another machine's clock).
        ("late-w-0", A, leased("late", "bbbbbbbbbbbb", now - 30)),
        ("old-w-0", B, leased("old", "cccccccccccc", None)),  # an older version: no lease
        ("not-ours", B, {"team": "data"}),
    ]:
        api.wait_zone_operation(zone, api.insert_instance(zone, vm_body(name, zone, labels)))
    for cluster, cid, lease in (
        ("dead", "dddddddddddd", now - 3600),
        ("live", "aaaaaaaaaaaa", now),
    ):
        desc = firewall_description(cluster, this_host(), os.getpid(), cid, lease=str(int(lease)))
        fake.add_foreign_firewall(f"{cluster}-dask", desc)
    found = sweep(PROJECT, [A, B], dry_run=True, api_endpoint=fake.url, margin="10 minutes")
    out = capsys.readouterr().out
    assert "would delete" in out and "dead-w-0" in out
    assert owner_label("alice@example.com") in out  # the owner, and the lease, are shown
    assert re.search(r"dead-w-0 .* -360\d s ", out)
    by_name = {f["name"]: f for f in found}
    assert [by_name[n]["alive"] for n in ("dead-w-0", "live-w-0", "late-w-0", "old-w-0")] == [
        False,
        True,
        True,
        None,
    ]
    assert by_name["live-dask"]["alive"] is True and by_name["dead-dask"]["alive"] is False
    assert len(fake.instance_names()) == 6 and not any(f["deleted"] for f in found)
    found = sweep(PROJECT, [A, B], api_endpoint=fake.url, quiet=True, margin="10 minutes")
    assert sorted(f["name"] for f in found if f["deleted"]) == [
        "dead-dask",
        "dead-ps-0",
        "dead-w-0",
    ]
    wait_for_sync(lambda: "dead-w-0" not in fake.instance_names(), timeout=30)
    assert sorted(fake.firewalls) == ["live-dask"]
    # force: without ids, refused; the CLI shows what cannot be proven and deletes only the ids
    # typed (a live cluster's id typed too is still kept: it holds its lease).
    with pytest.raises(ValueError, match="ids="):
        sweep(PROJECT, [A, B], api_endpoint=fake.url, force=True)
    monkeypatch.setattr("builtins.input", lambda prompt: "cccccccccccc aaaaaaaaaaaa")
    with dask.config.set({"transient.gce.api-endpoint": fake.url}):
        rc = cli_main(["sweep", "--project", PROJECT, "--zone", A, "--zone", B, "--force", "--yes"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "These cannot be proven dead:" in out and "old-w-0" in out
    wait_for_sync(lambda: "old-w-0" not in fake.instance_names(), timeout=30)
    assert sorted(fake.instance_names()) == ["late-w-0", "live-w-0", "not-ours"]


def test_firewall_rules_are_matched_by_cluster_id_not_by_name(fake: FakeGCE) -> None:
    api = ComputeAPI(PROJECT, api_endpoint=fake.url)
    api.wait_zone_operation(
        A, api.insert_instance(A, vm_body("demo-w-0", A, leased("demo", "aaaaaaaaaaaa", 1.0)))
    )
    # Same cluster name, another owner (another id, a lease that holds): not swept with ours.
    desc = firewall_description("demo", "far-away", 7, "bbbbbbbbbbbb", lease=str(2**31))
    fake.add_foreign_firewall("demo-dask", desc)
    found = sweep(PROJECT, [A], api_endpoint=fake.url, quiet=True)
    assert [f["name"] for f in found if f["deleted"]] == ["demo-w-0"]
    assert "demo-dask" in fake.firewalls


LEASE = {
    "transient.gce.lease-interval": "0.3s",
    "transient.gce.lease-duration": "1.5s",
}


@pytest.mark.slow
def test_two_users_of_one_host_one_live_one_killed_only_the_killed_one_goes(
    fake: FakeGCE, tmp_path: Path
) -> None:
    """Alice's cluster runs here; Bob's ran in a kernel (same host name) that was killed. Bob's
    lease runs out, Alice's is renewed: Carol, whose registry knows neither, sweeps only Bob's."""
    script = textwrap.dedent(
        f"""
        import sys, time
        import dask
        from transient_nb import TransientCluster
        dask.config.set({LEASE!r})
        cluster = TransientCluster(
            backend="gce", project={PROJECT!r}, api_endpoint={fake.url!r},
            scheduler_host="127.0.0.1", python=sys.executable, poll_interval=0.1,
            workers=1, provisioning_delay=0, name="bob", detached=False, join_timeout="1h",
            owner="bob@example.com",
        )
        deadline = time.monotonic() + 60
        while sum(e["kind"] == "running" for e in cluster.monitor.events) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        print("bob's VMs run", flush=True)
        time.sleep(600)
        """
    )
    env = {
        **os.environ,
        "DASK_TRANSIENT__RUN_DIR": str(tmp_path / "bob" / "runs"),
        "DASK_TRANSIENT__REGISTRY_DIR": str(tmp_path / "bob" / "clusters"),
    }
    bob = subprocess.Popen(
        [sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert bob.stdout is not None
        for line in bob.stdout:  # its log, then the line that says its VMs run
            if "bob's VMs run" in line:
                break
        else:
            raise AssertionError(f"bob's kernel ended first ({bob.wait()})")
        with (
            dask.config.set(LEASE),
            TransientCluster(
                **options(fake, join_timeout="1h"), name="alice", owner="alice@example.com"
            ) as alice,
        ):
            wait_for_sync(lambda: len(of_kind(list(alice.monitor.events), "running")) == 2, 30)
            os.kill(bob.pid, signal.SIGKILL)  # no close(), no exit hook: its VMs stay behind
            bob.wait()
            carol = str(tmp_path / "carol" / "clusters")  # knows neither cluster

            def bob_is_dead() -> bool:
                found = sweep(
                    PROJECT, [A], dry_run=True, api_endpoint=fake.url, quiet=True,
                    registry_path=carol, margin="1s",
                )  # fmt: skip
                dead = [f["name"] for f in found if f["cluster"] == "bob" and f["alive"] is False]
                # Each VM and the firewall rule carry a lease of their own, renewed one after
                # the other: they run out at moments apart (seen: only bob-ps-0 proven yet).
                return sorted(dead) == ["bob-dask", "bob-ps-0", "bob-w-0"]

            wait_for_sync(bob_is_dead, timeout=30)
            found = sweep(
                PROJECT, [A], api_endpoint=fake.url, quiet=True, registry_path=carol, margin="1s"
            )
            deleted = sorted(f["name"] for f in found if f["deleted"])
            assert deleted == ["bob-dask", "bob-ps-0", "bob-w-0"], found
            alices = [f for f in found if f["cluster"] == "alice"]
            assert alices and all(f["alive"] and not f["deleted"] for f in alices)
            assert {f["owner"] for f in found} == {
                owner_label("alice@example.com"),
                owner_label("bob@example.com"),
            }
            wait_for_sync(lambda: not [n for n in fake.instance_names() if "bob" in n], 30)
            assert sorted(fake.instance_names()) == ["alice-ps-0", "alice-w-0"]
            assert sorted(fake.firewalls) == ["alice-dask"]
            assert alice.status.name == "running"
        assert fake.instance_names() == []
    finally:
        if bob.poll() is None:
            bob.kill()
            bob.wait()
