"""The JSON model of one cluster that the JupyterLab panel shows, folded from its event log.

:func:`make_cluster_model` turns a cluster's registry entry and its
:class:`~transient_nb.eventlog.folds.ClusterState` (the notebook panel's fold, so both panels
show the same figures) into plain JSON values; :func:`fingerprint` tells when what the panel
shows changed. :class:`~transient_nb.server.manager.ClusterManager` keeps one model per cluster.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

from transient_nb.catalog.prices import BILLING_MINIMUM_S, PriceCatalog
from transient_nb.eventlog.folds import GONE_STATES, MAX_GONE_ROWS, ClusterState, RunProgress
from transient_nb.eventlog.format import cost_text, gone_text, money, policy_text, training_text
from transient_nb.eventlog.vocabulary import ClusterStart

__all__ = ["MAX_GONE_ROWS", "connect_code", "fingerprint", "make_cluster_model", "training_model"]


def _plain(value: Any) -> Any:
    """A JSON-safe copy of a scalar: numpy numbers to Python ones, NaN and missing to None."""
    if value is None:
        return None
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()  # numpy scalar
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def _plain_deep(value: Any) -> Any:
    """:func:`_plain` through dicts and lists (a policy's decision: its mix and odds)."""
    if isinstance(value, Mapping):
        return {str(k): _plain_deep(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain_deep(v) for v in value]
    return _plain(value)


def connect_code(name: str, scheduler_address: str | None = None) -> str:
    """The code a notebook runs to connect to cluster ``name`` (:func:`transient_nb.connect`
    returns the cluster object with its events and costs).

    Examples
    --------
    >>> print(connect_code("demo", "tcp://127.0.0.1:8786"))
    from transient_nb import connect
    cluster = connect("demo")
    """
    return f'from transient_nb import connect\ncluster = connect("{name}")'


def training_model(p: RunProgress | None) -> dict[str, Any] | None:
    """Step, accuracy and ETA of a run's progress (from :mod:`transient_nb.eventlog.folds`), and
    its line as the panel shows it (``text``, :func:`~transient_nb.eventlog.format.training_text`);
    None without one."""
    if p is None:
        return None
    model = {
        "run": _plain(p.run),
        "model": _plain(p.model),
        "parameters": _plain(p.parameters),
        "metrics": {str(k): _plain(v) for k, v in p.metrics.items()},
        "step": p.step,
        "steps": _plain(p.target or None),
        "accuracy": _plain(p.accuracy),
        "loss": _plain(p.loss),
        "img_per_s": _plain(p.img_per_s),
        "active_workers": _plain(p.active_workers),
        "eta_s": _plain(p.eta_s),
        "finished": p.finished,
        "reason": _plain(p.state) if p.finished else None,
        "error": _plain(p.error),
        "preemptions": p.preemptions,
        "updated": _plain(p.updated),
    }
    return {**model, "text": training_text(model)}


def make_cluster_model(
    entry: Mapping[str, Any],
    events: Sequence[Mapping[str, Any]],
    *,
    status: str = "running",
    owner: str = "kernel",
    now: float | None = None,
    minimum_s: float = BILLING_MINIMUM_S,
    state: ClusterState | None = None,
) -> dict[str, Any]:
    """The JSON model of one cluster that the panel shows.

    Parameters
    ----------
    entry
        The cluster's registry entry (``name``, ``backend``, ``scheduler_address``,
        ``dashboard_link``, ``pid``, ``gpu``, ``zone``, ``spot``...).
    events
        The cluster's event log so far, in order.
    status
        ``"starting"``, ``"running"``, ``"unreachable"`` (its scheduler did not answer),
        ``"stale"`` (its owning process is gone) or ``"closed"``.
    owner
        ``"panel"`` for clusters this server started, ``"kernel"`` otherwise.
    now
        Wall-clock time of the model (costs are billed up to it); defaults to now, or to the last
        event for stale and closed clusters, whose VMs stopped costing money when they died.
    minimum_s
        The price catalog's minimum billed seconds per VM.
    state
        The :class:`~transient_nb.eventlog.folds.ClusterState` already fed with ``events`` (the manager
        keeps one per cluster, so that a refresh reads only the new events); by default one is
        folded from ``events`` here.

    Returns
    -------
    A dict of plain JSON values: identity and links, ``workers`` (one row per VM, the gone ones
    last and at most :data:`MAX_GONE_ROWS` of them), ``counts`` (GPU workers per lifecycle state),
    ``cost`` (spent, on-demand counterfactual, saved, $/h now; ``cost["text"]`` has each written
    by :func:`~transient_nb.eventlog.format.cost_text`), ``preemptions``, ``training`` (None
    without a training run; its line in ``training["text"]``) and ``connect_code``. The panel
    shows the ``text`` strings as they are: money, durations and shares are written in one place,
    :mod:`transient_nb.eventlog.format`.

    Examples
    --------
    >>> from transient_nb.eventlog.vocabulary import make_event
    >>> m = make_cluster_model({"name": "demo"}, [make_event("started", workers=2)])
    >>> m["name"], m["target_workers"], m["workers"]
    ('demo', 2, [])
    """
    if now is None:
        # A stale or closed cluster's VMs stopped costing money with its last event.
        now = float(events[-1]["time"]) if status in ("stale", "closed") and events else time.time()
    if state is None:
        state = ClusterState(minimum_s=minimum_s)
        state.feed(events)
    started: Mapping[str, Any] = state.started
    if status == "running" and state.closed:
        status = "closed"
    # The same rows, in the same order, as the notebook panel's.
    rows = [{k: _plain(v) for k, v in r.items()} for r in state.rows(now)]
    counts = state.counts()
    cost = state.cost_totals(now)
    control = state.last_control
    time_scale = started.get("time_scale")
    name = str(entry.get("name", started.get("cluster", "")))
    address = entry.get("scheduler_address") or started.get("scheduler_address")
    return {
        "name": name,
        "status": status,
        "owner": owner,
        "pid": _plain(entry.get("pid")),
        "backend": _plain(entry.get("backend", started.get("backend"))),
        "scheduler_address": _plain(address),
        "dashboard_link": _plain(entry.get("dashboard_link")),
        "run_record": _plain(entry.get("run_record", started.get("run_record"))),
        "gpu": _plain(entry.get("gpu", started.get("gpu"))),
        "zone": _plain(entry.get("zone", started.get("zone"))),
        # The zones it may use (its own, then its fallbacks) and where its PS runs now.
        "zones": ClusterStart(started).zones,
        "ps_zone": next(
            (r["zone"] for r in rows if r["role"] == "ps" and r["state"] not in GONE_STATES),
            None,
        ),
        "spot": _plain(entry.get("spot", started.get("spot"))),
        "preemption": _plain(started.get("preemption")),
        "time_scale": _plain(time_scale),
        "catalog": _plain(started.get("catalog")),
        "started": _plain(started.get("time")),
        "target_workers": _plain(state.target_workers),
        "mix": state.target_mix,
        "workers": rows,
        # Every VM gone so far (not only the rows shown), as the panels fold them into one line.
        "gone": _gone(state, now),
        "cost_by_gpu": _cost_by_gpu(state, now),
        "counts": counts,
        # The figures, and each written as people read it (the panel has no formatting of its own).
        "cost": {**{k: _plain(v) for k, v in cost.items()}, "text": cost_text(cost)},
        "preemptions": state.preemptions,
        "training": training_model(state.progress),
        "last_control": (
            {k: _plain(control.get(k)) for k in ("action", "ok", "error", "request", "time")}
            if control
            else None
        ),
        "policy": (
            {**_plain_deep(state.policy), "text": policy_text(state.policy)}
            if state.policy
            else None
        ),
        "n_events": len(events),
        "updated": now,
        "connect_code": connect_code(name, address),
    }


def _gone(state: ClusterState, now: float) -> dict[str, Any] | None:
    """The gone VMs' counts, cost and line (:func:`~transient_nb.eventlog.format.gone_text`);
    None while none is gone."""
    gone = state.gone(now)
    text = gone_text(gone)
    return {**{k: _plain(v) for k, v in gone.items()}, "text": text} if text else None


def _cost_by_gpu(state: ClusterState, now: float) -> dict[str, dict[str, Any]]:
    """Dollars per GPU type (the PS host as ``"ps"``), for a mixed cluster's panel."""
    frame = state.cost(now).by_gpu
    return {
        str(g): {"vms": int(r["vms"]), "cost": _plain(r["cost"]), "text": money(_plain(r["cost"]))}
        for g, r in frame.iterrows()
    }


def fingerprint(models: Sequence[Mapping[str, Any]]) -> str:
    """A short hash of what the panel shows, blind to clocks ticking.

    Two lists of models get the same fingerprint unless something a user would see changed: a
    cluster, its status, an event, or money spent at the cent. The panel's long poll returns as
    soon as it changes.
    """
    shown = [
        (
            m["name"],
            m["status"],
            m["n_events"],
            round(m["cost"]["cost"] or 0.0, 2),
            round(m["cost"]["cost_on_demand"] or 0.0, 2),
        )
        for m in models
    ]
    return hashlib.sha1(json.dumps(shown).encode()).hexdigest()[:16]


@functools.lru_cache(maxsize=16)
def _catalog_minimum_s(name: str) -> float:
    try:
        return PriceCatalog.load(name).minimum_s
    except (ValueError, OSError):
        return BILLING_MINIMUM_S


def billing_minimum_s(entry: Mapping[str, Any], events: Sequence[Mapping[str, Any]]) -> float:
    """Minimum billed seconds of the cluster's price catalog (60 if it cannot be loaded)."""
    name = ClusterStart.of(events).catalog
    return _catalog_minimum_s(name) if name else BILLING_MINIMUM_S
