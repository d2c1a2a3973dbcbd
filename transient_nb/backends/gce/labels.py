"""Labels and descriptions that mark GCE resources as a transient cluster's, whose, and whether
their cluster still lives.

Every VM carries :data:`LABEL` (it is transient_nb's), the cluster's name, the VM's role, the
cluster's unique id :data:`LABEL_ID` (only what carries the right id is ever deleted or adopted),
its owner :data:`LABEL_OWNER` (the credentials' account, hashed to fit a label: two users of one
host, or two laptops of one name, are told apart) and a lease :data:`LABEL_LEASE`: the time until
which the cluster is known to live, renewed every ``gce.lease-interval`` by the process that runs
the cluster (a kernel, or a head VM). ``sweep`` judges a VM by its lease, never by the host or
registry it was made from; the host and pid labels are shown, as a hint for people. Firewall
rules have no labels: the same facts are in their description (:func:`firewall_description`),
whose lease is renewed too.
"""

from __future__ import annotations

import getpass
import hashlib
import re
import socket
import time
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
#: Who made the cluster: its credentials' account, hashed (:func:`owner_label`).
LABEL_OWNER = "transient-nb-owner"
#: Until when (epoch seconds) the cluster is known to live: renewed while it runs.
LABEL_LEASE = "transient-nb-lease"
_OWNER_RE = re.compile(r"[0-9a-f]{16}\Z")


def label_value(value: str) -> str:
    # Label values: at most 63 lowercase letters, digits, "-" and "_".
    return re.sub(r"[^a-z0-9_-]", "-", value.lower())[:63]


def this_host() -> str:
    """This machine's name as a label value (the owner of the VMs it creates)."""
    return label_value(socket.gethostname()) or "unknown"


def owner_label(identity: str) -> str:
    """An owner's identity (an account's e-mail) as a label value: 16 hex digits of its SHA-256.

    A label value is at most 63 lowercase characters, and need not show the address; a value
    that already is such a hash (a head VM passing on its client's) stays as it is.

    Examples
    --------
    >>> owner_label("alice@example.com")
    'ff8d9819fc0e12bf'
    >>> owner_label("ff8d9819fc0e12bf")
    'ff8d9819fc0e12bf'
    """
    if _OWNER_RE.match(identity):
        return identity
    return hashlib.sha256(identity.strip().lower().encode()).hexdigest()[:16]


def account_of(credentials: Any) -> str | None:
    """The account ``credentials`` act for (a service account's or a user's e-mail), if they say.

    ``None`` credentials are the application-default ones, looked up here.
    """
    if credentials is None:
        try:
            import google.auth

            credentials, _ = google.auth.default()
        except Exception:  # no credentials here (a fake server in tests): no account to say
            return None
    for attribute in ("service_account_email", "account", "signer_email"):
        value = getattr(credentials, attribute, None)
        if isinstance(value, str) and "@" in value:
            return value
    return None


def owner_identity(given: str | None, credentials: Any) -> str:
    """Who owns what this process creates: ``given`` (``gce.owner``), else the credentials'
    account, else this user on this host (``user@host``: what is left to tell people apart)."""
    if given:
        return str(given)
    account = account_of(credentials)
    if account:
        return account
    return f"{getpass.getuser()}@{socket.gethostname()}"


def lease_until(duration_s: float, now: float | None = None) -> str:
    """A lease label value: ``duration_s`` from ``now``, in whole epoch seconds.

    Examples
    --------
    >>> lease_until(300, now=1000.4)
    '1300'
    """
    return str(int((time.time() if now is None else now) + duration_s))


def lease_of(value: Any) -> float | None:
    """A lease label's (or description's) epoch seconds; None when there is none to read."""
    try:
        return float(int(str(value)))
    except (TypeError, ValueError):
        return None


_FIREWALL_DESC = re.compile(
    r"transient_nb cluster (\S+) \(host (\S+), pid (\d+)(?:, id ([0-9a-f]+))?"
    r"(?:, owner ([0-9a-f]+))?(?:, lease (\d+))?\)"
)


def firewall_description(
    cluster: str,
    host: str,
    pid: int,
    cluster_id: str,
    what: str = "Dask worker and nanny ports between the cluster's VMs",
    owner: str | None = None,
    lease: str | None = None,
) -> str:
    """The description that marks a firewall rule as cluster ``cluster``'s (id ``cluster_id``),
    with its owner's label and lease when given."""
    extra = "".join(f", {k} {v}" for k, v in (("owner", owner), ("lease", lease)) if v is not None)
    return (
        f"transient_nb cluster {cluster} (host {host}, pid {pid}, id {cluster_id}{extra}): {what}"
    )


def firewall_owner(rule: dict[str, Any]) -> dict[str, str] | None:
    """The owner labels written in a firewall rule's description, or None if not ours."""
    m = _FIREWALL_DESC.match(str(rule.get("description", "")))
    if not m:
        return None
    owner = {LABEL_CLUSTER: label_value(m[1]), LABEL_HOST: m[2], LABEL_PID: m[3]}
    for key, value in ((LABEL_ID, m[4]), (LABEL_OWNER, m[5]), (LABEL_LEASE, m[6])):
        if value:
            owner[key] = value
    return owner


def renewed_description(description: str, lease: str) -> str:
    """A firewall rule's description with its lease renewed (added if it had none).

    Examples
    --------
    >>> d = firewall_description("demo", "h", 7, "ab12", what="ports", lease="100")
    >>> renewed_description(d, "200")
    'transient_nb cluster demo (host h, pid 7, id ab12, lease 200): ports'
    """
    if re.search(r", lease \d+\)", description):
        return re.sub(r", lease \d+\)", f", lease {lease})", description, count=1)
    return description.replace("):", f", lease {lease}):", 1)


def firewall_id(rule: dict[str, Any]) -> str | None:
    """The cluster id written in a firewall rule's description."""
    owner = firewall_owner(rule)
    return None if owner is None else owner.get(LABEL_ID)
