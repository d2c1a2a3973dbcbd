"""Labels and descriptions that mark GCE resources as a transient cluster's, and whose.

Every VM carries :data:`LABEL` (it is transient_nb's), the cluster's name, the VM's role, the
host and process that created it and, since a name may be reused (by a colleague, or by a new
cluster in a recycled pid), the cluster's unique id :data:`LABEL_ID`. Firewall rules have no
labels: the same facts are in their description (:func:`firewall_description`). Only what
carries the right id is ever deleted or adopted.
"""

from __future__ import annotations

import re
import socket
from typing import Any

#: Labels that mark a VM as transient_nb's (``sweep`` looks for them).
LABEL = "transient-nb"
LABEL_CLUSTER = "transient-nb-cluster"
LABEL_ROLE = "transient-nb-role"
LABEL_HOST = "transient-nb-host"
LABEL_PID = "transient-nb-pid"
#: The per-cluster unique id: close() and sweep delete only what carries the right one.
LABEL_ID = "transient-nb-id"
#: On VMs a detached cluster's head VM created: that head's instance name.
LABEL_HEAD = "transient-nb-head"


def label_value(value: str) -> str:
    # Label values: at most 63 lowercase letters, digits, "-" and "_".
    return re.sub(r"[^a-z0-9_-]", "-", value.lower())[:63]


def this_host() -> str:
    """This machine's name as a label value (the owner of the VMs it creates)."""
    return label_value(socket.gethostname()) or "unknown"


_FIREWALL_DESC = re.compile(
    r"transient_nb cluster (\S+) \(host (\S+), pid (\d+)(?:, id ([0-9a-f]+))?\)"
)


def firewall_description(
    cluster: str,
    host: str,
    pid: int,
    cluster_id: str,
    what: str = "Dask worker and nanny ports between the cluster's VMs",
) -> str:
    """The description that marks a firewall rule as cluster ``cluster``'s (id ``cluster_id``)."""
    return f"transient_nb cluster {cluster} (host {host}, pid {pid}, id {cluster_id}): {what}"


def firewall_owner(rule: dict[str, Any]) -> dict[str, str] | None:
    """The owner labels written in a firewall rule's description, or None if not ours."""
    m = _FIREWALL_DESC.match(str(rule.get("description", "")))
    if not m:
        return None
    owner = {LABEL_CLUSTER: label_value(m[1]), LABEL_HOST: m[2], LABEL_PID: m[3]}
    if m[4]:
        owner[LABEL_ID] = m[4]
    return owner


def firewall_id(rule: dict[str, Any]) -> str | None:
    """The cluster id written in a firewall rule's description."""
    owner = firewall_owner(rule)
    return None if owner is None else owner.get(LABEL_ID)
