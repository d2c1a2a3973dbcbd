"""Sweep: find and delete what transient clusters that are gone left on GCE.

It weighs the provider's resources (GCE labels) against this machine's registry of clusters:
the deploy layer's, so it lives here rather than in the GCE backend.

A VM is transient_nb's when it has the ``transient-nb`` label; its cluster is gone when the
process that created it (labels ``transient-nb-host``, ``-pid`` and the cluster's unique id)
no longer runs that cluster on this machine. A detached cluster's head VM (role ``head``) owns
its cluster instead: while it runs, it and every VM and rule with its cluster id are kept (end
it with ``transient-nb down NAME``); once it has stopped (a crashed head powers itself off),
they all go. Firewall rules go with their cluster's VMs, matched by the cluster's id, never by
name.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

from transient_nb import config
from transient_nb.backends.gce.api import ComputeAPI, GCEError, default_project
from transient_nb.backends.gce.head import HEAD_ALIVE_STATES
from transient_nb.backends.gce.labels import (
    LABEL,
    LABEL_CLUSTER,
    LABEL_HEAD,
    LABEL_HOST,
    LABEL_ID,
    LABEL_PID,
    LABEL_ROLE,
    firewall_owner,
    label_value,
    this_host,
)
from transient_nb.deploy import registry


def _owner_alive(labels: dict[str, str], registry_path: str | None) -> tuple[bool | None, str]:
    """Whether the owning cluster still runs (None: cannot tell from here), and why."""
    if labels.get(LABEL_HOST) != this_host():
        return None, f"created on host {labels.get(LABEL_HOST)!r}: cannot check it from here"
    try:
        pid = int(labels.get(LABEL_PID, "-1"))
    except ValueError:
        pid = -1
    cluster = labels.get(LABEL_CLUSTER)
    cid = labels.get(LABEL_ID)
    for entry in registry.entries(registry_path):
        if (
            label_value(str(entry["name"])) == cluster
            and int(entry.get("pid") or -2) == pid
            and not entry["stale"]
            # A new cluster of the same name in a recycled pid is not the owner.
            and (cid is None or entry.get("cluster_id") in (None, cid))
        ):
            return True, f"cluster {cluster} is running (pid {pid})"
    return False, f"cluster {cluster} is gone (pid {pid})"


def _head_alive(inst: dict[str, Any]) -> tuple[bool, str]:
    """Whether a head VM still owns its cluster, and why (its state is the whole answer)."""
    labels = inst.get("labels") or {}
    cluster, status = labels.get(LABEL_CLUSTER), inst.get("status")
    if status in HEAD_ALIVE_STATES:
        return True, f"head of cluster {cluster} is {status} (`transient-nb down {cluster}`)"
    return False, f"head of cluster {cluster} is {status}: its cluster is gone"


def sweep(
    project: str | None = None,
    zones: Sequence[str] | None = None,
    dry_run: bool = False,
    *,
    force: bool = False,
    confirm: Callable[[list[dict[str, Any]]], bool] | None = None,
    quiet: bool = False,
    api_endpoint: str | None = None,
    credentials: Any = None,
    registry_path: str | None = None,
) -> list[dict[str, Any]]:
    """Find VMs (and firewall rules) of transient clusters that are gone, show them, delete them.

    A VM is transient_nb's when it has the ``transient-nb`` label; its cluster is gone when the
    process that created it (labels ``transient-nb-host`` and ``transient-nb-pid``) no longer runs
    that cluster on this machine. VMs created from another machine are listed but only deleted
    with ``force=True``.

    Parameters
    ----------
    project
        Project ID (default: ``transient.gce.project``, else the application-default one).
    zones
        Zones to look in (default: every zone of the price catalog).
    dry_run
        Only show what would be deleted.
    force
        Also delete VMs whose owner cannot be checked from here (created on another machine).
    confirm
        Called with the list before anything is deleted; deletion goes on only if it returns True.
    quiet
        Do not print the list.
    api_endpoint, credentials
        As for the backend (tests point them at a fake server).
    registry_path
        Cluster registry folder (default: ``transient.registry-dir``).

    Returns
    -------
    One dict per VM or firewall rule found: ``kind``, ``name``, ``zone``, ``cluster``,
    ``status``, ``alive`` (True, False, or None: cannot tell), ``reason``, ``deleted``.

    Examples
    --------
    >>> from transient_nb.deploy.sweep import sweep
    >>> sweep("my-project", ["us-central1-a"], dry_run=True)  # doctest: +SKIP
    """
    from transient_nb.catalog.prices import PriceCatalog

    project = config.get("gce.project", override_with=project)
    if project is None:
        project = default_project(credentials)
    api_endpoint = config.get("gce.api-endpoint", override_with=api_endpoint)
    api = ComputeAPI(str(project), api_endpoint=api_endpoint, credentials=credentials)
    every_zone = not zones
    zones = list(zones) if zones else PriceCatalog.load().zones()
    found: list[dict[str, Any]] = []
    listed: list[tuple[str, dict[str, Any]]] = []
    for zone in zones:
        try:
            instances = api.list_instances(zone, filter=f'labels.{LABEL} = "true"')
        except GCEError as e:
            if e.not_found or e.status == 400:
                raise ValueError(
                    f"Zone {zone!r} or project {project!r} does not exist ({e}); list zones with "
                    "`gcloud compute zones list`."
                ) from e
            raise
        listed += [(zone, i) for i in instances if (i.get("labels") or {}).get(LABEL) == "true"]
    # Head VMs first: a detached cluster's VMs and rules belong to its head, wherever it runs.
    heads = {
        str(i["labels"].get(LABEL_ID)): _head_alive(i)
        for _, i in listed
        if i["labels"].get(LABEL_ROLE) == "head" and i["labels"].get(LABEL_ID)
    }
    for zone, inst in listed:
        labels = inst.get("labels") or {}
        if labels.get(LABEL_ROLE) == "head":
            alive, reason = _head_alive(inst)
        elif labels.get(LABEL_ID) in heads:
            alive, reason = heads[str(labels[LABEL_ID])]
        elif labels.get(LABEL_HEAD):
            # Created by a head VM that was not found: gone if every zone was looked at; a head
            # in a zone left out may still run.
            if every_zone:
                alive, reason = False, f"its head VM {labels[LABEL_HEAD]} is gone"
            else:
                alive, reason = None, f"its head VM {labels[LABEL_HEAD]} is not in these zones"
        else:
            alive, reason = _owner_alive(labels, registry_path)
        found.append(
            {
                "kind": "instance",
                "name": inst["name"],
                "zone": zone,
                "cluster": labels.get(LABEL_CLUSTER),
                "id": labels.get(LABEL_ID),
                "status": inst.get("status"),
                "alive": alive,
                "reason": reason,
                "deleted": False,
            }
        )
    # A rule goes with the VMs of its cluster: matched by the cluster's unique id, never by name
    # (another owner's cluster may have the same name).
    gone_ids = {f["id"] for f in found if f["alive"] is False and f["id"]}
    for rule in api.list_firewalls(filter='name eq ".*-dask(-client)?"'):
        owner = firewall_owner(rule)
        if owner is None:
            continue
        rule_id = owner.get(LABEL_ID)
        if rule_id in heads:
            alive, reason = heads[str(rule_id)]
        else:
            alive, reason = _owner_alive(owner, registry_path)
        if rule_id and rule_id in gone_ids:
            alive, reason = False, f"its cluster's VMs are being swept (id {rule_id})"
        found.append(
            {
                "kind": "firewall",
                "name": rule["name"],
                "zone": "global",
                "cluster": owner[LABEL_CLUSTER],
                "id": rule_id,
                "status": "",
                "alive": alive,
                "reason": reason,
                "deleted": False,
            }
        )
    doomed = [f for f in found if f["alive"] is False or (f["alive"] is None and force)]
    if not quiet:
        _print_sweep(found, doomed, dry_run)
    if dry_run or not doomed or (confirm is not None and not confirm(doomed)):
        _forget_gone_heads(str(project), zones, found, dry_run, registry_path)
        return found
    pending = []
    for f in doomed:
        try:
            if f["kind"] == "instance":
                op = api.delete_instance(f["zone"], f["name"])
                if op is not None:
                    pending.append((f, op))
            f["deleted"] = True
        except GCEError as e:
            f["reason"] = f"delete failed: {e}"
    for f, op in pending:
        try:
            api.wait_zone_operation(f["zone"], op)
        except GCEError as e:
            f["deleted"] = False
            f["reason"] = f"delete failed: {e}"
    # Firewall rules last: a VM being deleted still uses its cluster's rule.
    for f in doomed:
        if f["kind"] == "firewall":
            try:
                op = api.delete_firewall(f["name"])
                if op is not None:
                    api.wait_global_operation(op)
                f["deleted"] = True
            except GCEError as e:
                f["deleted"] = False
                f["reason"] = f"delete failed: {e}"
    if not quiet:
        n = sum(1 for f in doomed if f["deleted"])
        print(f"Deleted {n} of {len(doomed)}.", file=sys.stdout)
    _forget_gone_heads(str(project), zones, found, dry_run, registry_path)
    return found


def _forget_gone_heads(
    project: str,
    zones: Sequence[str],
    found: list[dict[str, Any]],
    dry_run: bool,
    registry_path: str | None,
) -> None:
    """Remove the local registry entries of detached clusters whose head VM is gone.

    Only for heads in the zones looked at: a head elsewhere was not seen, not found gone.
    """
    if dry_run:
        return
    for entry in registry.entries(registry_path):
        head = entry.get("head_vm") or {}
        if head.get("project") != project or head.get("zone") not in zones:
            continue
        if not any(
            f["kind"] == "instance" and f["name"] == head.get("instance") and f["alive"]
            for f in found
        ):
            registry.forget(entry, registry_path)


def _print_sweep(found: list[dict[str, Any]], doomed: list[dict[str, Any]], dry_run: bool) -> None:
    if not found:
        print("No transient_nb VMs or firewall rules found.")
        return
    verb = "would delete" if dry_run else "delete"
    print(f"{'':<2}{'kind':<9}{'name':<40}{'zone':<16}{'status':<12}action")
    for f in found:
        action = f"{verb} ({f['reason']})" if f in doomed else f"keep ({f['reason']})"
        print(f"  {f['kind']:<9}{f['name']:<40}{f['zone']:<16}{f['status'] or '':<12}{action}")
