"""What every view shows, folded from a run's event log: VM table, run progress and ETA, costs, summary.

The event log (:mod:`transient_nb.eventlog.vocabulary`) is the single source of truth of a run. The notebook
panel, the JupyterLab panel, the CLI, the HTML report and remote handles all show the same derived
figures, so they all compute them here, with one set of constants (:data:`MAX_GONE_ROWS`,
:data:`PACE_WINDOW_S`).

The run's progress (:mod:`transient_nb.eventlog.progress`) and its summary and training curve
(:mod:`transient_nb.eventlog.summary`) are folds of their own, which :class:`ClusterState` keeps
and this module still names.

Every fold is incremental: :meth:`ClusterState.feed` takes only the events not seen yet, and the
cost of one event does not grow with the length of the run. Queries (rows, costs) cost at most
one pass over the VMs that still run, plus the bounded number of gone ones shown.

Examples
--------
>>> from transient_nb.eventlog.vocabulary import make_event
>>> state = ClusterState()
>>> state.feed([make_event("started", workers=2, time_scale=1.0)])
1
>>> state.target_workers, state.rows(), state.cost().total
(2, [], 0.0)
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from transient_nb._moved import renamed
from transient_nb.catalog.prices import BILLING_MINIMUM_S
from transient_nb.eventlog.bill import Bill as Bill
from transient_nb.eventlog.bill import CostReport
from transient_nb.eventlog.progress import PACE_WINDOW_S as PACE_WINDOW_S
from transient_nb.eventlog.progress import RunProgress, RunTracker
from transient_nb.eventlog.progress import eval_metrics as eval_metrics
from transient_nb.eventlog.progress import int_or_none as _int_or_none
from transient_nb.eventlog.summary import CURVE_COLUMNS as CURVE_COLUMNS
from transient_nb.eventlog.summary import RunSummary
from transient_nb.eventlog.summary import summarize as summarize
from transient_nb.eventlog.summary import training_curve as training_curve
from transient_nb.eventlog.vocabulary import BILLING_ENDS, LIFECYCLE

Event = Mapping[str, Any]

#: How many gone VMs (preempted, deleted) the VM table keeps: enough to see the last
#: preemptions, bounded for long runs. The notebook and the JupyterLab panel show the same.
MAX_GONE_ROWS = 8
#: Lifecycle states after which a VM is gone (kept in the table, greyed, for a while).
GONE_STATES = BILLING_ENDS
#: Fields of a lifecycle event that describe its VM (the table keeps the latest known value).
VM_FIELDS = ("role", "gpu", "zone", "spot", "machine", "price", "price_on_demand", "address")

_LIFECYCLE = frozenset(LIFECYCLE)
#: What the views show of a policy's last decision (``policy-decision`` fields, and its time).
POLICY_DECISION_FIELDS = (
    "time",
    "reason",
    "acted",
    "feasible",
    "eta_s",
    "expected_cost",
    "mix",
    "on_demand",
    "p_lose_1h",
    "ps_capacity",
    "ps_bottleneck",
    "ps_zone",
)


def worker_key(name: str) -> tuple[int, int, str]:
    """Sort key of VM names: PS hosts first, then workers by number (``w-2`` before ``w-10``).

    Examples
    --------
    >>> sorted(["w-10", "w-2", "ps-0"], key=worker_key)
    ['ps-0', 'w-2', 'w-10']
    """
    role = 0 if name.startswith("ps-") else 1
    try:
        number = int(name.rsplit("-", 1)[1])
    except (IndexError, ValueError):
        number = 0
    return role, number, name


# -- the whole cluster -------------------------------------------------------------------------------
@dataclass
class ClusterState:
    """Everything a view shows about a cluster and its (latest or given) training run.

    Feed it the event log as it grows (:meth:`feed`); ask it for the VM table (:meth:`rows`), the
    bill (:meth:`cost`), the run's progress (:attr:`progress`) and summary (:meth:`summary`).

    Parameters
    ----------
    run_id
        The training run to follow; by default the latest one in the log.
    minimum_s
        Minimum billed seconds per VM (the price catalog's).

    Examples
    --------
    >>> state = ClusterState(minimum_s=60)
    >>> state.feed([{"kind": "requested", "time": 0.0, "worker": "w-0", "price": 0.5}])
    1
    >>> [r["state"] for r in state.rows(now=1.0)]
    ['requested']
    """

    run_id: str | None = None
    minimum_s: float = BILLING_MINIMUM_S
    #: Events read so far (the index of the next one in the log).
    n_events: int = 0
    #: The first ``started`` event ({} before it).
    started: dict[str, Any] = field(default_factory=dict)
    #: GPU workers the cluster is asked to keep (``started``, then each ``scale``).
    target_workers: int | None = None
    #: GPU type -> workers the cluster is asked to keep (``started``'s and each ``scale``'s mix).
    target_mix: dict[str, int] | None = None
    #: Preemptions of any VM (``preempted`` events).
    preemptions: int = 0
    #: The last answer to a control request (``control`` event).
    last_control: dict[str, Any] | None = None
    #: The transient-aware policy that is on: its goal and limit (``policy`` event), and its
    #: last decision (``policy-decision``); None while none is on.
    policy: dict[str, Any] | None = None
    #: Time of the last event read (None before any).
    last_time: float | None = None

    def __post_init__(self) -> None:
        self.bill = Bill(self.minimum_s)
        self.tracker = RunTracker(self.run_id)
        self.summary_fold = RunSummary(bill=self.bill)
        self._vms: dict[str, dict[str, Any]] = {}
        self._live: set[str] = set()
        # Gone VMs in the order they went (re-inserted when one goes again): the table shows the
        # last MAX_GONE_ROWS without sorting them all.
        self._gone: dict[str, None] = {}

    # -- reading -----------------------------------------------------------------------------------
    def feed(self, new: Iterable[Event]) -> int:
        """Read events not seen yet (in log order); returns how many."""
        n = 0
        for e in new:
            self._feed_one(e)
            n += 1
        self.n_events += n
        return n

    def follow(self, log: Sequence[Event]) -> list[Event]:
        """Read what ``log`` (the whole, append-only event list) has beyond what was read.

        Returns the new events.
        """
        end = len(log)
        new = list(log[self.n_events : end])
        self.feed(new)
        return new

    def _feed_one(self, e: Event) -> None:
        kind = e.get("kind")
        self.last_time = float(e["time"])
        self.bill.feed(e)
        self.tracker.feed_one(e)
        if self.run_id is None or e.get("run") in (None, self.run_id):
            self.summary_fold.feed_one(e)
        if kind in _LIFECYCLE:
            self._lifecycle(e)
            if kind == "preempted":
                self.preemptions += 1
        elif kind == "started":
            if not self.started:
                self.started = dict(e)
            self.target_workers = _int_or_none(e.get("workers"))
            self.target_mix = _mix_or_none(e)
        elif kind == "scale":
            self.target_workers = _int_or_none(e.get("workers"))
            self.target_mix = _mix_or_none(e)
        elif kind == "control":
            self.last_control = dict(e)
        elif kind == "policy":
            goal = e.get("goal")
            self.policy = (
                None
                if goal is None
                else {
                    "goal": goal,
                    "deadline_s": e.get("deadline_s"),
                    "budget": e.get("budget"),
                    "remembered_h": e.get("remembered_h"),
                    "decision": None,
                }
            )
        elif kind == "policy-decision" and self.policy is not None:
            self.policy["decision"] = {k: e.get(k) for k in POLICY_DECISION_FIELDS}

    def _lifecycle(self, e: Event) -> None:
        name = e.get("worker")
        if not name:
            return
        kind = str(e["kind"])
        vm = self._vms.setdefault(name, {"name": name})
        for key in VM_FIELDS:
            if e.get(key) is not None:
                vm[key] = e[key]
        # A late "left" after the VM was already preempted or deleted does not revive it.
        if vm.get("state") in GONE_STATES and kind == "left":
            return
        vm["state"] = kind
        vm["since"] = float(e["time"])
        if kind in GONE_STATES:
            self._live.discard(name)
            self._gone.pop(name, None)
            self._gone[name] = None
        else:
            self._gone.pop(name, None)
            self._live.add(name)

    # -- what the views show ----------------------------------------------------------------------
    @property
    def progress(self) -> RunProgress | None:
        """The followed run's progress (None before its ``train-started``)."""
        return self.tracker.progress

    @property
    def closed(self) -> bool:
        """True once a ``closed`` event was read."""
        return self.bill.closed_at is not None

    def _row(self, vm: Mapping[str, Any], now: float) -> dict[str, Any]:
        name = vm["name"]
        spot = vm.get("spot")
        return {
            "name": name,
            "role": vm.get("role") or "worker",
            "state": vm["state"],
            "gpu": vm.get("gpu"),
            "zone": vm.get("zone"),
            "spot": None if spot is None else bool(spot),
            "price": vm.get("price"),
            "since": vm["since"],
            "seconds_in_state": now - vm["since"],
            "cost": self.bill.vm_cost(name, self._bill_now(now)),
            "gone": vm["state"] in GONE_STATES,
        }

    def rows(self, now: float | None = None) -> list[dict[str, Any]]:
        """The VM table: every VM that is not gone (PS first, then by number), then the last
        :data:`MAX_GONE_ROWS` gone ones, the latest first.

        Each row: ``name``, ``role``, ``state``, ``gpu``, ``zone``, ``spot``, ``price`` ($/h),
        ``since``, ``seconds_in_state``, ``cost`` ($ so far), ``gone``.
        """
        now = self._now(now)
        live = [self._row(self._vms[n], now) for n in sorted(self._live, key=worker_key)]
        gone_names = list(self._gone)[-MAX_GONE_ROWS:][::-1]
        return live + [self._row(self._vms[n], now) for n in gone_names]

    def gone(self, now: float | None = None) -> dict[str, Any]:
        """Every VM gone so far, not only the rows shown: ``preempted`` and ``given_back``
        (deleted) counts and their ``cost`` in dollars (the line the tables fold them into)."""
        now = self._bill_now(self._now(now))
        states = [self._vms[n]["state"] for n in self._gone]
        return {
            "preempted": states.count("preempted"),
            "given_back": len(states) - states.count("preempted"),
            "cost": sum(self.bill.vm_cost(n, now) for n in self._gone),
        }

    def counts(self) -> dict[str, int]:
        """GPU workers (not gone) per lifecycle state."""
        out: dict[str, int] = {}
        for name in self._live:
            vm = self._vms[name]
            if (vm.get("role") or "worker") == "worker":
                out[vm["state"]] = out.get(vm["state"], 0) + 1
        return out

    def vms_frame(self, now: float | None = None) -> pd.DataFrame:
        """Every VM (gone ones too) as :func:`transient_nb.eventlog.vocabulary.vm_states` returns them."""
        now = time.time() if now is None else now
        df = pd.DataFrame(list(self._vms.values()))
        if df.empty:
            return pd.DataFrame(
                columns=[
                    "role",
                    "gpu",
                    "zone",
                    "spot",
                    "price",
                    "state",
                    "since",
                    "seconds_in_state",
                ]
            )
        df["seconds_in_state"] = now - df["since"]
        return df.set_index("name")

    def cost(self, now: float | None = None) -> CostReport:
        """The bill at ``now`` (default: now); a closed cluster's bill stops at its close."""
        return self.bill.report(self._bill_now(now))

    def cost_totals(self, now: float | None = None) -> dict[str, float]:
        """The bill's totals only, as :meth:`CostReport.to_dict
        <transient_nb.eventlog.bill.CostReport.to_dict>` has them (no per-VM frame: cheap to poll)."""
        total, total_od, rate, rate_od = self.bill.totals(self._bill_now(now))
        saved = total_od - total
        return {
            "cost": total,
            "cost_on_demand": total_od,
            "saved": saved,
            "saved_fraction": saved / total_od if total_od > 0 else 0.0,
            "rate_per_hour": rate,
            "rate_on_demand_per_hour": rate_od,
        }

    def summary(self) -> dict[str, Any]:
        """The run's summary (see :func:`summarize`)."""
        return self.summary_fold.result()

    def _now(self, now: float | None) -> float:
        return time.time() if now is None else now

    def _bill_now(self, now: float | None) -> float | None:
        # A closed cluster's VMs stopped costing money when it closed, whatever the clock says.
        return self.bill.closed_at if self.bill.closed_at is not None else now


def _mix_or_none(e: Event) -> dict[str, int] | None:
    """The GPU mix an event asks for; a record from before mixes: its one type and count."""
    mix = e.get("mix")
    if isinstance(mix, Mapping):
        return {str(g): int(n) for g, n in mix.items()}
    n, gpu = _int_or_none(e.get("workers")), e.get("gpu")
    return {str(gpu): n} if n is not None and gpu else None


def vm_states(events: Iterable[Mapping[str, Any]], now: float | None = None) -> pd.DataFrame:
    """The current lifecycle state of every VM of a run, computed from its events.

    Returns a DataFrame indexed by VM name with its role, GPU, zone, spot flag, hourly price,
    lifecycle ``state``, ``since`` (UNIX seconds) and ``seconds_in_state`` (wall-clock).
    """
    state = ClusterState()
    state.feed(events)
    return state.vms_frame(now)


def event_log(cluster: Any) -> Sequence[Event]:
    """The live, append-only event list of ``cluster``: the one way in-process readers (views,
    the policy, run handles) read events; only its owner (the cluster's scheduler plugin, or a
    remote handle's mirror) touches ``monitor.events`` itself.

    A :class:`~transient_nb.TransientCluster` keeps the log in its scheduler plugin (appended on
    the cluster's event loop, where the views' periodic callbacks run too). A
    :class:`~transient_nb.deploy.remote.RemoteCluster` keeps a copy that it extends through the
    scheduler's documented ``transient_events`` RPC (see :mod:`transient_nb.eventlog.vocabulary`).
    """
    return cluster.monitor.events


def is_closed(cluster: Any, events: Sequence[Event]) -> bool:
    """True once ``cluster`` is closed (by its status, or a ``closed`` event in its log)."""
    status = getattr(getattr(cluster, "status", None), "name", "running")
    if status in ("closed", "closing", "failed"):
        return True
    return bool(events) and events[-1].get("kind") == "closed"


def minimum_s_of(cluster: Any) -> float:
    """Minimum billed seconds of ``cluster``'s price catalog (60 without one)."""
    return float(getattr(getattr(cluster, "catalog", None), "minimum_s", BILLING_MINIMUM_S))


# The names before 0.2 of training_curve and CURVE_COLUMNS, for one release.
__getattr__ = renamed(__name__, {"history": "training_curve", "HISTORY_COLUMNS": "CURVE_COLUMNS"})
