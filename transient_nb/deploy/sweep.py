"""Sweep: find and delete what transient clusters that are gone left on GCE.

A resource is deleted only when its cluster is provably dead, never on a guess:

- a VM carries a lease (:data:`~transient_nb.backends.gce.labels.LABEL_LEASE`), renewed every
  ``gce.lease-interval`` by the process that runs its cluster (a kernel, or a head VM); a lease
  that ran out more than ``gce.lease-margin`` ago means nothing renews it any more;
- a detached cluster's head VM is its own lease: while it runs, it and every VM and rule with its
  cluster id are kept (end it with ``transient-nb down NAME``); once it has stopped (a crashed
  head powers itself off), they all go;
- firewall rules carry the same lease in their description, and go with their cluster's id,
  never matched by name.

The host name and pid labels, and this machine's registry, decide nothing: two users of one
JupyterHub host, or two laptops of one name, sharing a project never sweep each other's live
clusters. What cannot be proven (no lease: made by an older version; a head in a zone not looked
at) is kept, and listed; ``force`` deletes it only for the cluster ids the user names.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any

from dask.utils import parse_timedelta

from transient_nb import config
from transient_nb.backends.gce.api import ComputeAPI, GCEError, default_project
from transient_nb.backends.gce.head import HEAD_ALIVE_STATES
from transient_nb.backends.gce.labels import (
    LABEL,
    LABEL_CLUSTER,
    LABEL_HEAD,
    LABEL_ID,
    LABEL_LEASE,
    LABEL_OWNER,
    LABEL_ROLE,
    firewall_owner,
    lease_of,
)
from transient_nb.deploy import registry


def _lease_alive(labels: dict[str, str], now: float, margin_s: float) -> tuple[bool | None, str]:
    """Whether a resource's lease says its cluster lives (None: it has none), and why."""
    lease = lease_of(labels.get(LABEL_LEASE))
    cluster = labels.get(LABEL_CLUSTER)
    if lease is None:
        return None, f"cluster {cluster} has no lease (an older version?): cannot tell"
    if now <= lease:
        return True, f"cluster {cluster} holds its lease for {lease - now:.0f} s more"
    if now <= lease + margin_s:
        return (
            True,
            f"cluster {cluster}'s lease ran out {now - lease:.0f} s ago (within the margin)",
        )
    return False, f"cluster {cluster}'s lease ran out {now - lease:.0f} s ago: nothing renews it"


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
    ids: Collection[str] | None = None,
    choose: Callable[[list[dict[str, Any]]], Collection[str]] | None = None,
    confirm: Callable[[list[dict[str, Any]]], bool] | None = None,
    quiet: bool = False,
    api_endpoint: str | None = None,
    credentials: Any = None,
    registry_path: str | None = None,
    margin: str | float | None = None,
) -> list[dict[str, Any]]:
    """Find VMs (and firewall rules) of transient clusters that are gone, show them, delete them.

    A resource goes only when its cluster is provably dead: its lease ran out more than
    ``margin`` ago, or its head VM has stopped (the module's docstring). Neither the host it was
    created on nor this machine's registry is asked.

    Parameters
    ----------
    project
        Project ID (default: ``transient.gce.project``, else the application-default one).
    zones
        Zones to look in (default: every zone of the price catalog).
    dry_run
        Only show what would be deleted.
    force
        Also delete what cannot be proven dead (no lease; a head VM in a zone not looked at),
        but only for the cluster ids in ``ids``, or those ``choose`` returns when shown them
        (the CLI asks for them). Nothing that holds its lease is ever deleted.
    ids, choose
        The cluster ids ``force`` deletes; or a callable that is shown what cannot be proven
        dead (owner and lease included) and returns the ids to delete.
    confirm
        Called with the list before anything is deleted; deletion goes on only if it returns True.
    quiet
        Do not print the list.
    api_endpoint, credentials
        As for the backend (tests point them at a fake server).
    registry_path
        Cluster registry folder (default: ``transient.registry-dir``): entries of heads found
        gone are forgotten there. It decides nothing.
    margin
        How long past its end a lease must be (default ``gce.lease-margin``).

    Returns
    -------
    One dict per VM or firewall rule found: ``kind``, ``name``, ``zone``, ``cluster``, ``id``,
    ``owner`` (hashed), ``lease`` (epoch seconds, or None), ``status``, ``alive`` (True, False, or
    None: cannot tell), ``reason``, ``deleted``.

    Examples
    --------
    >>> from transient_nb.deploy.sweep import sweep
    >>> sweep("my-project", ["us-central1-a"], dry_run=True)  # doctest: +SKIP
    """
    if force and ids is None and choose is None and not dry_run:
        raise ValueError(
            "sweep(force=True) deletes what cannot be proven dead only for the clusters you "
            "name: pass ids=['<cluster id>', ...] (a dry run shows them; the CLI asks for them)."
        )
    margin_s = float(
        parse_timedelta(config.get("gce.lease-margin", override_with=margin), default="seconds")
    )
    from transient_nb.catalog.prices import PriceCatalog

    project = config.get("gce.project", override_with=project)
    if project is None:
        project = default_project(credentials)
    api_endpoint = config.get("gce.api-endpoint", override_with=api_endpoint)
    api = ComputeAPI(str(project), api_endpoint=api_endpoint, credentials=credentials)
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
    now = time.time()
    alive: bool | None
    for zone, inst in listed:
        labels = inst.get("labels") or {}
        if labels.get(LABEL_ROLE) == "head":
            alive, reason = _head_alive(inst)
        elif labels.get(LABEL_ID) in heads:
            alive, reason = heads[str(labels[LABEL_ID])]
        else:
            alive, reason = _lease_alive(labels, now, margin_s)
            if alive is None and labels.get(LABEL_HEAD):
                # Made by a head VM that was not found (and carrying no lease to judge by).
                reason = f"its head VM {labels[LABEL_HEAD]} was not found in these zones"
        found.append(
            {
                "kind": "instance",
                "name": inst["name"],
                "zone": zone,
                "cluster": labels.get(LABEL_CLUSTER),
                "id": labels.get(LABEL_ID),
                "owner": labels.get(LABEL_OWNER),
                "lease": lease_of(labels.get(LABEL_LEASE)),
                "status": inst.get("status"),
                "alive": alive,
                "reason": reason,
                "deleted": False,
            }
        )
    # A rule goes with its cluster: judged by its own lease, or its head; matched by the
    # cluster's unique id, never by name (another owner's cluster may have the same name).
    gone_ids = {f["id"] for f in found if f["alive"] is False and f["id"]}
    live_ids = {f["id"] for f in found if f["alive"] and f["id"]}
    for rule in api.list_firewalls(filter='name eq ".*-dask(-client)?"'):
        owner = firewall_owner(rule)
        if owner is None:
            continue
        rule_id = owner.get(LABEL_ID)
        if rule_id in heads:
            alive, reason = heads[str(rule_id)]
        else:
            alive, reason = _lease_alive(owner, now, margin_s)
            if rule_id in live_ids:
                alive, reason = True, f"its cluster's VMs live (id {rule_id})"
            elif alive is None and rule_id and rule_id in gone_ids:
                alive, reason = False, f"its cluster's VMs are being swept (id {rule_id})"
        found.append(
            {
                "kind": "firewall",
                "name": rule["name"],
                "zone": "global",
                "cluster": owner[LABEL_CLUSTER],
                "id": rule_id,
                "owner": owner.get(LABEL_OWNER),
                "lease": lease_of(owner.get(LABEL_LEASE)),
                "status": "",
                "alive": alive,
                "reason": reason,
                "deleted": False,
            }
        )
    doomed = [f for f in found if f["alive"] is False]
    unknown = [f for f in found if f["alive"] is None]
    if force and unknown and not dry_run:
        if not quiet:
            _print_sweep(unknown, [], dry_run, title="These cannot be proven dead:")
        named = set(ids) if ids is not None else set(choose(unknown) if choose else ())
        for f in unknown:
            if f["id"] and f["id"] in named:
                f["reason"] = f"forced (cluster id {f['id']} named): {f['reason']}"
                doomed.append(f)
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


def _print_sweep(
    found: list[dict[str, Any]], doomed: list[dict[str, Any]], dry_run: bool, title: str = ""
) -> None:
    if not found:
        print("No transient_nb VMs or firewall rules found.")
        return
    if title:
        print(title)
    verb = "would delete" if dry_run else "delete"
    now = time.time()
    print(
        f"{'':<2}{'kind':<9}{'name':<34}{'zone':<15}{'cluster id':<14}{'owner':<18}"
        f"{'lease':<12}{'status':<12}action"
    )
    for f in found:
        action = f"{verb} ({f['reason']})" if f in doomed else f"keep ({f['reason']})"
        lease = f.get("lease")
        left = "none" if lease is None else f"{lease - now:+.0f} s"
        print(
            f"  {f['kind']:<9}{f['name']:<34}{f['zone']:<15}{f['id'] or '-':<14}"
            f"{f.get('owner') or '-':<18}{left:<12}{f['status'] or '':<12}{action}"
        )
