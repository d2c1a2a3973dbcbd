"""``connect(NAME)``: a handle on a running transient cluster, from any kernel or process.

The cluster itself when this process owns it; else a :class:`~transient_nb.deploy.remote.
RemoteCluster` that reaches its scheduler through the registry's entry.
"""

from __future__ import annotations

from typing import Any

from distributed.core import Status
from distributed.deploy.spec import SpecCluster

from transient_nb.backends.gce.head import head_gone
from transient_nb.deploy import registry
from transient_nb.deploy.cluster import TransientCluster
from transient_nb.deploy.remote import RemoteCluster

__all__ = ["RemoteCluster", "connect"]


def connect(name: str, *, timeout: float = 10.0, prefer_local: bool = True) -> Any:
    """A handle on the running transient cluster called ``name``, from any kernel.

    Parameters
    ----------
    name
        The cluster's name (``%transient_cluster list`` or ``registry.entries()`` shows them).
    timeout
        Seconds to wait for its scheduler.
    prefer_local
        When this process owns the cluster, return the :class:`~transient_nb.TransientCluster`
        itself rather than a remote handle.

    Returns
    -------
    The :class:`~transient_nb.TransientCluster` (owned here) or a :class:`RemoteCluster`.

    Raises
    ------
    ValueError
        No running cluster has that name, or its owning process is gone.

    Examples
    --------
    >>> from transient_nb import connect
    >>> cluster = connect("demo")  # doctest: +SKIP
    >>> cluster.scale(6)  # doctest: +SKIP
    """
    if prefer_local:
        for c in list(SpecCluster._instances):
            if isinstance(c, TransientCluster) and c.name == name and c.status == Status.running:
                return c
    try:
        entry = registry.lookup(name)
    except KeyError as e:
        raise ValueError(e.args[0]) from None
    if entry.get("head_vm") and head_gone(entry):
        registry.forget(entry)
        head = entry["head_vm"]
        raise ValueError(
            f"Cluster {name!r} is gone: its head VM {head['instance']} no longer runs (in "
            f"{head['zone']}). `transient-nb sweep` deletes what it may have left; start a "
            "new one with `%transient_cluster up`."
        )
    if entry.get("stale"):
        raise ValueError(
            f"Cluster {name!r} is stale: the process that owned it (pid {entry.get('pid')}) is "
            "gone. Start a new one with `%transient_cluster up`."
        )
    if not entry.get("scheduler_address"):
        raise ValueError(f"Cluster {name!r} is still starting; try again in a moment.")
    return RemoteCluster(entry, timeout=timeout)
