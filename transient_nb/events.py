"""The vocabulary of a run's event log, and readers of run records.

Every event is a flat, msgpack-serialisable dict with at least ``kind`` and ``time`` (wall-clock
UNIX seconds, set by whoever posts it). Events travel on the scheduler under the topic
:data:`TOPIC`; the :class:`~transient_nb.monitor.TransientMonitor` writes them, one JSON object a
line, to the run record.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd

#: Topic under which every transient_nb event is logged on the scheduler.
TOPIC = "transient"
#: Topic of control requests (scale, preempt, stop) sent to the cluster that owns a scheduler.
CONTROL_TOPIC = "transient-control"

#: Lifecycle of a VM (worker or PS host), in the order it normally happens.
LIFECYCLE = (
    "requested",  # the backend asked the provider for a VM
    "provisioning",  # the provider accepted; the VM is being placed (not billed)
    "running",  # the VM runs (billing starts)
    "joined",  # its Dask worker registered with the scheduler
    "notice",  # the provider announced a preemption
    "left",  # its Dask worker left the scheduler
    "preempted",  # the provider stopped the VM (billing ends)
    "deleted",  # we deleted the VM: scale-down or close (billing ends)
)
#: Cluster-level events.
CLUSTER_EVENTS = (
    "started",
    "replacement-requested",
    "stockout",
    "capacity-exhausted",
    "closed",
)
#: Events posted by workers and by the training run (same topic, same log):
#:
#: - ``drained``: a worker finished its drain hooks after a notice (``hooks``, ``seconds``, ``errors``)
#: - ``train-started``: ``run``, ``model``, ``data``, ``steps`` (target), ``batch_size``, ``workers``
#: - ``metrics``: ``run``, ``step`` (global), ``loss``, ``lr``, ``active_workers``, ``staleness``,
#:   ``img_per_s`` (whole cluster), ``updates`` (accepted since the last one)
#: - ``worker-metrics``: ``run``, ``worker``, ``step``, ``img_per_s`` (that worker's throughput)
#: - ``eval``: ``run``, ``step``, ``accuracy`` (0..1), ``test_loss``
#: - ``checkpoint``: ``run``, ``step``, ``path``
#: - ``ps-lost`` / ``ps-recovered``: ``run``, ``step``, ``steps_lost``
#: - ``train-finished``: ``run``, ``reason`` (steps|accuracy|budget|deadline|stopped|error), ``step``,
#:   ``accuracy``, ``wall_s``
#: - ``control``: the owning cluster's answer to a control request (``action``, ``ok``, ``error``)
TRAINING_EVENTS = (
    "train-started",
    "metrics",
    "worker-metrics",
    "eval",
    "checkpoint",
    "ps-lost",
    "ps-recovered",
    "train-finished",
)

#: Events after which a VM no longer costs money.
BILLING_ENDS = ("preempted", "deleted")


def make_event(kind: str, **fields: Any) -> dict[str, Any]:
    """An event dict with its ``kind`` and the current wall-clock ``time``.

    Examples
    --------
    >>> e = make_event("notice", worker="w-1")
    >>> e["kind"], e["worker"]
    ('notice', 'w-1')
    """
    event: dict[str, Any] = {"kind": kind, "time": time.time()}
    event.update(fields)
    return event


def events_frame(events: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """Events as a DataFrame, one row each, in the order they were recorded.

    ``time`` stays UNIX seconds; ``timestamp`` is the same instant as a pandas Timestamp (UTC).
    """
    rows = list(events)
    df = pd.DataFrame(rows)
    if df.empty:
        return pd.DataFrame(columns=["time", "timestamp", "kind", "worker"])
    if "worker" not in df:
        df["worker"] = None
    df.insert(0, "timestamp", pd.to_datetime(df["time"], unit="s", utc=True))
    front = ["time", "timestamp", "kind", "worker"]
    return df[front + [c for c in df.columns if c not in front]]


def read_run_record(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read a run record (JSON lines) written by the monitor.

    A line cut short by a crash at the end of the file is skipped, since everything before it is
    intact.
    """
    out: list[dict[str, Any]] = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


def vm_states(events: Iterable[Mapping[str, Any]], now: float | None = None) -> pd.DataFrame:
    """The current lifecycle state of every VM of a run, computed from its events.

    Returns a DataFrame indexed by VM name with its role, GPU, zone, spot flag, hourly price,
    lifecycle ``state``, ``since`` (UNIX seconds) and ``seconds_in_state`` (wall-clock).
    """
    now = time.time() if now is None else now
    vms: dict[str, dict[str, Any]] = {}
    for e in events:
        kind = e.get("kind")
        name = e.get("worker")
        if kind not in LIFECYCLE or not name:
            continue
        vm = vms.setdefault(name, {"name": name})
        for key in (
            "role",
            "gpu",
            "zone",
            "spot",
            "machine",
            "price",
            "price_on_demand",
            "address",
        ):
            if e.get(key) is not None:
                vm[key] = e[key]
        # A late "left" after the VM was already preempted or deleted does not revive it.
        if vm.get("state") in BILLING_ENDS and kind == "left":
            continue
        vm["state"] = kind
        vm["since"] = e["time"]
    df = pd.DataFrame(list(vms.values()))
    if df.empty:
        return pd.DataFrame(
            columns=["role", "gpu", "zone", "spot", "price", "state", "since", "seconds_in_state"]
        )
    df["seconds_in_state"] = now - df["since"]
    return df.set_index("name")
