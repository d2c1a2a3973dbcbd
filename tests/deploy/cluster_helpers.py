"""Helpers of the tests of a TransientCluster's parts (tests/deploy/test_*.py): its event log read
as stories (a preemption and its replacement), VM states, and bills done by hand.

Cluster tests are plain synchronous tests with Dask's ``cleanup`` fixture (it checks that no
thread, loop or instance leaks), except the trace replay, which runs the cluster asynchronously
under ``gen_test``. Every cluster starts its VMs at once (``provisioning_delay=0``) with short
notices so that the suite stays fast."""

from __future__ import annotations

import json
from typing import Any

from tests.conftest import (
    index_of,
    of_kind,
)
from transient_nb import TransientCluster
from transient_nb.eventlog.folds import vm_states

Events = list[dict[str, Any]]


# -- helpers ------------------------------------------------------------------------------------
def local_cluster(name: str, **kwargs: Any) -> TransientCluster:
    """A cluster called ``name`` whose VMs start at once (``provisioning_delay=0``), as these
    tests' clusters do; ``kwargs`` are its other options."""
    return TransientCluster(name=name, provisioning_delay=0, **kwargs)


def snapshot(cluster: TransientCluster) -> Events:
    return list(cluster.monitor.events)


def as_json(events: Events) -> Events:
    """Events as the run record stores them."""
    return json.loads(json.dumps(events, default=str))


def replacement_of(events: Events, name: str) -> tuple[str | None, int]:
    """The VM requested to replace ``name`` (same slot, after its replacement-requested)."""
    i = index_of(events, "replacement-requested", worker=name)
    if i < 0:
        return None, -1
    j = index_of(events, "requested", i + 1, slot=events[i]["slot"], role="worker")
    return (events[j]["worker"], j) if j >= 0 else (None, -1)


def replaced(events: Events, name: str) -> bool:
    """``name`` was preempted, then a replacement was asked for, then the replacement joined.

    A replacement can itself be preempted before it joins (lifetimes start when a VM runs); its
    own replacement then stands in for both.
    """
    i_pre = index_of(events, "preempted", worker=name)
    i_rr = index_of(events, "replacement-requested", max(i_pre, 0), worker=name)
    new, i_req = replacement_of(events, name)
    if new is None or not 0 <= i_pre < i_rr < i_req:
        return False
    if index_of(events, "joined", i_req, worker=new) > i_req:
        return True
    return index_of(events, "preempted", i_req, worker=new) > i_req and replaced(events, new)


def preempted_workers(events: Events) -> list[str]:
    return [e["worker"] for e in of_kind(events, "preempted", role="worker")]


def worker_states(cluster: TransientCluster) -> dict[str, str]:
    """Lifecycle state of every GPU worker VM that is not gone."""
    df = vm_states(snapshot(cluster))
    if df.empty:
        return {}
    df = df[(df["role"] == "worker") & ~df["state"].isin(["preempted", "deleted"])]
    return dict(df["state"])


def n_joined(cluster: TransientCluster) -> int:
    return sum(1 for s in worker_states(cluster).values() if s == "joined")


def recompute_costs(events: Events, time_scale: float, minimum_s: float = 60.0) -> tuple:
    """Per-second billing, done by hand: running until preempted/deleted (else closed)."""
    closed = of_kind(events, "closed")[-1]["time"]
    total = total_od = 0.0
    seconds: dict[str, float] = {}
    for req in of_kind(events, "requested"):
        name = req["worker"]
        i_run = index_of(events, "running", worker=name)
        if i_run < 0:
            continue
        ends = [
            i
            for i in range(i_run, len(events))
            if events[i].get("worker") == name and events[i]["kind"] in ("preempted", "deleted")
        ]
        end = events[ends[0]]["time"] if ends else closed
        s = (end - events[i_run]["time"]) * time_scale
        seconds[name] = s
        total += max(minimum_s, s) * req["price"] / 3600
        total_od += max(minimum_s, s) * req["price_on_demand"] / 3600
    return total, total_od, seconds
