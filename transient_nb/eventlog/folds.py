"""What every view shows, folded from a run's event log: VM table, run progress and ETA, costs, summary.

The event log (:mod:`transient_nb.eventlog.vocabulary`) is the single source of truth of a run. The notebook
panel, the JupyterLab panel, the CLI, the HTML report and remote handles all show the same derived
figures, so they all compute them here, with one set of constants (:data:`MAX_GONE_ROWS`,
:data:`PACE_WINDOW_S`).

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
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from transient_nb.catalog.prices import BILLING_MINIMUM_S
from transient_nb.eventlog.bill import Bill, CostReport
from transient_nb.eventlog.vocabulary import BILLING_ENDS, LIFECYCLE

Event = Mapping[str, Any]

#: How many gone VMs (preempted, deleted) the VM table keeps: enough to see the last
#: preemptions, bounded for long runs. The notebook and the JupyterLab panel show the same.
MAX_GONE_ROWS = 8
#: Window over which the training pace (and so the ETA) is measured, in wall-clock seconds: long
#: enough to smooth the PS's metric intervals, short enough to follow a preemption's slowdown.
PACE_WINDOW_S = 60.0
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


# -- training progress -----------------------------------------------------------------------------
@dataclass
class RunProgress:
    """Where a training run stands, computed from the event log alone.

    Attributes
    ----------
    run
        Run id (``run-...``).
    target
        Global steps the run trains for.
    step
        Global steps reached (last ``metrics``, or the final step once finished).
    accuracy
        Test accuracy of the last evaluation (0..1), if any.
    loss, img_per_s, active_workers
        Of the last ``metrics`` (loss, images per second of the whole cluster, active trainers).
    steps_per_s
        Global steps per wall second over the last :data:`PACE_WINDOW_S`.
    eta_s
        Wall seconds to the target at that pace (0 once finished).
    state
        ``"running"``, the reason it finished (``steps``, ``accuracy``, ``stopped``, ...) or
        ``"error"``/``"trainer-failed"`` (``error`` says why).
    preemptions
        Worker preemptions since the run started.
    trainer_failures, trainer_restarts
        Trainers that failed, and restarts of them (``trainer-failed``, ``trainer-restarted``).
    model, data, started, updated
        What is trained, on what, since when, and the time of the last ``metrics`` event.
    parameters
        The model's trainable parameters (what the PS holds), once the run has started.
    metrics
        Every metric of the last evaluation (accuracy among them where it is one).
    """

    run: str
    target: int
    step: int = 0
    accuracy: float | None = None
    loss: float | None = None
    img_per_s: float | None = None
    active_workers: int | None = None
    steps_per_s: float | None = None
    eta_s: float | None = None
    state: str = "running"
    error: str | None = None
    preemptions: int = 0
    trainer_failures: int = 0
    trainer_restarts: int = 0
    model: str = ""
    data: str = ""
    started: float = 0.0
    updated: float = 0.0
    parameters: int | None = None
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        """True once the run ended, for whatever reason."""
        return self.state != "running"

    def projected_cost(self, cost: CostReport) -> float | None:
        """Dollars when the target is reached at the current pace and spending rate."""
        if self.state != "running":
            return cost.total
        if self.eta_s is None:
            return None
        # The rate is per simulated hour; wall seconds become simulated ones through time_scale.
        return cost.total + cost.rate * self.eta_s * cost.time_scale / 3600.0


class RunTracker:
    """Follows one training run (or, without ``run_id``, the latest one) through the event log.

    Examples
    --------
    >>> t = RunTracker()
    >>> t.feed([{"kind": "train-started", "time": 0.0, "run": "r", "steps": 10}])
    >>> t.progress.target
    10
    """

    def __init__(self, run_id: str | None = None, pace_window_s: float = PACE_WINDOW_S):
        self.run_id = run_id
        self.pace_window_s = pace_window_s
        self.progress: RunProgress | None = None
        self._pace: deque[tuple[float, int]] = deque()

    def feed(self, new: Iterable[Event]) -> None:
        """Read events not seen before."""
        for e in new:
            self.feed_one(e)

    def feed_one(self, e: Event) -> None:
        """Read one event not seen before."""
        kind = e.get("kind")
        if kind == "train-started":
            if self.run_id is None or e.get("run") == self.run_id:
                t = float(e["time"])
                self.progress = RunProgress(
                    run=str(e.get("run")),
                    target=int(e.get("steps") or 0),
                    model=str(e.get("model", "")),
                    data=str(e.get("data", "")),
                    started=t,
                    updated=t,
                    parameters=_int_or_none(e.get("parameters")),
                )
                self._pace.clear()
            return
        p = self.progress
        if p is None:
            return
        if kind == "preempted" and e.get("role") == "worker":
            p.preemptions += 1
            return
        if e.get("run") != p.run:
            return
        if kind == "metrics":
            self._metrics(p, e)
        elif kind == "eval":
            p.accuracy = e.get("accuracy")
            p.metrics = eval_metrics(e)
        elif kind == "trainer-failed":
            p.trainer_failures += 1
        elif kind == "trainer-restarted":
            p.trainer_restarts += 1
        elif kind == "train-finished":
            p.state = str(e.get("reason") or "finished")
            p.step = int(e.get("step") or p.step)
            if e.get("error") is not None:
                p.error = str(e["error"])
            if e.get("accuracy") is not None:
                p.accuracy = e.get("accuracy")
            p.eta_s = 0.0

    def _metrics(self, p: RunProgress, e: Event) -> None:
        p.step = int(e.get("step", p.step))
        p.img_per_s = e.get("img_per_s")
        p.loss = e.get("loss")
        p.active_workers = e.get("active_workers")
        t = float(e["time"])
        p.updated = t
        self._pace.append((t, p.step))
        # Keep two points at least: a pace needs a start and an end.
        while len(self._pace) > 2 and t - self._pace[0][0] > self.pace_window_s:
            self._pace.popleft()
        (t0, s0) = self._pace[0]
        if t > t0 and p.step > s0 and p.target:
            p.steps_per_s = (p.step - s0) / (t - t0)
            p.eta_s = max(0, p.target - p.step) / p.steps_per_s


# -- the summary of a run ------------------------------------------------------------------------
class RunSummary:
    """Folds events into the summary of a run (what :func:`summarize` returns).

    Counts that depend on the run's time window (preemptions, replacements, PS recoveries) keep
    the times of those rare events only; the bill is a :class:`Bill`.
    """

    def __init__(self, minimum_s: float = BILLING_MINIMUM_S, bill: Bill | None = None):
        self.bill = bill if bill is not None else Bill(minimum_s)
        self._own_bill = bill is None
        self.started: Event | None = None
        self.finished: Event | None = None
        self.first_time: float | None = None
        self.last_time: float | None = None
        self.accuracy: Any = None
        self.metrics: dict[str, float] = {}
        self.last_metrics_step: Any = None
        self._preempted: list[float] = []
        self._replacements: list[float] = []
        self._recoveries: list[tuple[float, int]] = []
        self._trainer_failures: list[float] = []
        self._rates: list[float] = []
        self._devices: dict[str, str] = {}  # worker -> the device its trainer reported
        self._paced: dict[str, Event] = {}  # worker or PS host -> its emulation-paced event
        self._behind: dict[str, float] = {}  # ... -> the lowest achieved/target ratio seen
        self._gpu: dict[str, str] = {}  # worker VM -> its GPU type (from its request)
        self._local_steps: dict[str, int] = {}  # worker -> its trainer's steps, last reported

    def feed_one(self, e: Event) -> None:
        """Read one event not seen before."""
        if self._own_bill:
            self.bill.feed(e)
        t = float(e["time"])
        if self.first_time is None:
            self.first_time = t
        self.last_time = t
        kind = e.get("kind")
        tw = float(e.get("time", 0))
        if kind == "train-started" and self.started is None:
            self.started = e
        elif kind == "train-finished":
            self.finished = e
        elif kind == "eval":
            self.accuracy = e["accuracy"]
            self.metrics = eval_metrics(e)
        elif kind == "preempted" and e.get("role") == "worker":
            self._preempted.append(tw)
        elif kind in ("replacement-requested", "spare-requested") and e.get("role") != "ps":
            # A spare asked for ahead of a revocation replaces the worker as well.
            self._replacements.append(tw)
        elif kind == "ps-recovered":
            self._recoveries.append((tw, int(e.get("steps_lost", 0))))
        elif kind == "trainer-failed":
            self._trainer_failures.append(tw)
        elif kind == "requested" and e.get("role") == "worker":
            self._gpu[str(e.get("worker"))] = str(e.get("gpu") or "none")
        if kind == "worker-metrics":
            name = str(e.get("worker"))
            local = int(e.get("local_step") or 0)
            self._local_steps[name] = max(local, self._local_steps.get(name, 0))
        if kind == "worker-metrics" and e.get("img_per_s"):
            self._rates.append(e["img_per_s"])
            self._devices[str(e.get("worker"))] = str(e.get("device", "unknown"))
        elif kind == "metrics":
            self.last_metrics_step = e["step"]
        elif kind == "emulation-paced":
            self._paced[f"{e.get('role')}:{e.get('worker')}"] = e
        elif kind == "emulation-behind":
            key = f"{e.get('role')}:{e.get('worker')}"
            target = float(e.get("target_steps_per_s") or 0.0)
            ratio = float(e.get("achieved_steps_per_s") or 0.0) / target if target > 0 else 0.0
            self._behind[key] = min(ratio, self._behind.get(key, ratio))

    def _emulation_note(self) -> str:
        """What was emulated, and whether the host kept the pace (a sentence for views)."""
        if not self._paced:
            return "not emulated: every rate is this host's own"
        unpaced = sorted(
            str(e.get("worker"))
            for e in self._paced.values()
            if e.get("role") == "worker" and e.get("wall_steps_per_s") is None
        )
        parts = []
        if self._behind:
            worst = min(self._behind.values())
            parts.append(
                f"the host could NOT keep the emulated pace on {len(self._behind)} of "
                f"{len(self._paced)} paced processes (its own work as slow as {worst:.0%} of the "
                "pace): the emulated figures are too slow; use a smaller time_scale or model"
            )
        else:
            parts.append("the host kept the emulated pace of every paced process")
        own = any(e.get("basis") for e in self._paced.values())
        if unpaced and own:
            # A user's model: the paper's ResNet-32 rates say nothing of it.
            parts.append(
                f"no step rate measured for this model on the GPU type of {', '.join(unpaced)}: "
                "not paced (give one, e.g. emulate='paper,t4=STEPS_PER_S')"
            )
        elif unpaced:
            parts.append(f"no step rate for the GPU type of {', '.join(unpaced)}: not paced")
        return "; ".join(parts)

    def result(self) -> dict[str, Any]:
        """The summary: the same dict as :func:`summarize`."""
        started, finished = self.started, self.finished
        t0 = started["time"] if started else (self.first_time or 0.0)
        t1 = finished["time"] if finished else (self.last_time or 0.0)

        def within(times: Iterable[float]) -> list[float]:
            return [t for t in times if t0 <= t <= t1]

        recoveries = [lost for t, lost in self._recoveries if t0 <= t <= t1]
        total, total_od, _, _ = self.bill.totals(now=t1)
        wall = max(0.0, t1 - t0)
        if finished:
            steps = int(finished["step"])
        else:
            steps = self.last_metrics_step if self.last_metrics_step is not None else 0
        batch = int(started["batch_size"]) if started else 0
        cluster_rate = steps * batch / wall if wall > 0 else 0.0
        speedup, note = self._speedup(cluster_rate)
        saved = total_od - total
        return {
            "run": started.get("run") if started else None,
            "model": started.get("model") if started else None,
            "data": started.get("data") if started else None,
            "reason": finished.get("reason") if finished else None,
            "error": finished.get("error") if finished else None,
            "trainer_failures": len(within(self._trainer_failures)),
            "steps": steps,
            "wall_s": wall,
            "accuracy": self.accuracy,
            "metrics": dict(self.metrics),
            "parameters": started.get("parameters") if started else None,
            "preemptions": len(within(self._preempted)),
            "replacements": len(within(self._replacements)),
            "ps_recoveries": len(recoveries),
            "steps_lost": sum(recoveries),
            "lost_in_flight": finished.get("lost_in_flight") if finished else None,
            "cost": total,
            "cost_on_demand": total_od,
            "saved": saved,
            "saved_fraction": saved / total_od if total_od > 0 else 0.0,
            "img_per_s": cluster_rate,
            "speedup_over_one_worker": speedup,
            "speedup_note": note,
            "emulated": bool(self._paced),
            "emulation_behind": len(self._behind),
            "emulation_note": self._emulation_note(),
            "by_gpu": self._by_gpu(wall),
        }

    def _by_gpu(self, wall: float) -> dict[str, dict[str, Any]]:
        """Per GPU type: trainers, their steps (as last reported) and steps per wall second.

        A mixed cluster's throughput per type: each worker's own steps, from its trainer's
        ``worker-metrics`` (posted every few seconds, so the last seconds may be missing).
        """
        out: dict[str, dict[str, Any]] = {}
        for name, steps in self._local_steps.items():
            row = out.setdefault(self._gpu.get(name, "none"), {"workers": 0, "steps": 0})
            row["workers"] += 1
            row["steps"] += steps
        for row in out.values():
            row["steps_per_s"] = row["steps"] / wall if wall > 0 else 0.0
        return out

    def _speedup(self, cluster_rate: float) -> tuple[float | None, str]:
        """The cluster's rate over one worker's, only where one worker's rate was measured alone.

        A trainer's own rate is one worker's rate only when it had its device to itself: each
        trainer on a GPU of its own (distinct device ids). Workers that share CPU cores or a GPU
        slow each other down, so their rates say nothing about one worker alone: no figure then.
        """
        devices = list(self._devices.values())
        if not self._rates or not devices:
            return None, "no trainer reported its rate"
        if not all(d.startswith("cuda:") and d != "cuda:" for d in devices):
            return None, "workers share the host's CPU cores: no one-worker baseline was measured"
        if len(set(devices)) < len(devices):
            return None, "workers share a GPU: no one-worker baseline was measured"
        one_worker = float(np.median(self._rates))
        if not one_worker > 0:
            return None, "no trainer reported its rate"
        return cluster_rate / one_worker, "over the median rate of trainers on GPUs of their own"


def summarize(events: Iterable[Event], minimum_s: float = BILLING_MINIMUM_S) -> dict[str, Any]:
    """The summary of a run, from its event log alone (a run record will do).

    Keys: run, model, data, reason, error,
    trainer_failures, steps, wall_s, accuracy, metrics (every metric of the last evaluation),
    parameters (the model's trainable ones), preemptions, replacements, ps_recoveries, steps_lost, lost_in_flight, cost,
    cost_on_demand, saved, saved_fraction, img_per_s, speedup_over_one_worker (None where no
    one-worker rate was measured alone: see ``speedup_note``), speedup_note, emulated (paced
    GPU or PS emulation, :mod:`transient_nb.training.emulation`), emulation_behind (paced processes whose
    host could not keep the pace), emulation_note, by_gpu (GPU type -> trainers, their steps and
    steps per wall second: a mixed cluster's throughput per type).

    Examples
    --------
    >>> summarize([])["steps"]
    0
    """
    fold = RunSummary(minimum_s)
    for e in events:
        fold.feed_one(e)
    return fold.result()


#: Columns of :func:`history`.
HISTORY_COLUMNS = [
    "step",
    "time",
    "loss",
    "accuracy",
    "active_workers",
    "staleness",
    "img_per_s",
    "lr",
    "cost",
    "cost_on_demand",
]


def history(
    events: Iterable[Event], t0: float, minimum_s: float = BILLING_MINIMUM_S
) -> pd.DataFrame:
    """One row per ``metrics`` event: the training curve with the money spent at each point.

    Parameters
    ----------
    events
        The run's events, in order.
    t0
        Wall time (UNIX seconds) that ``time`` counts from (the run's start).
    minimum_s
        Minimum billed seconds per VM.

    Returns
    -------
    A DataFrame with :data:`HISTORY_COLUMNS`: step, time (s since ``t0``), loss, test accuracy
    (last evaluation), active workers, staleness, img/s, lr, cost and on-demand cost so far;
    then one column per further metric of the run (a user's ``metrics=``: its last
    evaluation's value, empty before the first). Linear in the number of events (the bill is
    kept incrementally).

    Examples
    --------
    >>> history([], t0=0.0).empty
    True
    """
    bill_ = Bill(minimum_s)
    rows = []
    acc = None
    more: dict[str, float] = {}  # the metrics beside accuracy, as last evaluated
    for e in events:
        bill_.feed(e)
        kind = e.get("kind")
        if kind == "eval":
            acc = e["accuracy"]
            more.update({k: v for k, v in eval_metrics(e).items() if k != "accuracy"})
        if kind != "metrics":
            continue
        total, total_od, _, _ = bill_.totals(now=e["time"])
        rows.append(
            {
                **more,
                "step": e["step"],
                "time": e["time"] - t0,
                "loss": e["loss"],
                "accuracy": acc,
                "active_workers": e["active_workers"],
                "staleness": e["staleness"],
                "img_per_s": e["img_per_s"],
                "lr": e["lr"],
                "cost": total,
                "cost_on_demand": total_od,
            }
        )
    return pd.DataFrame(rows, columns=[*HISTORY_COLUMNS, *more])


def eval_metrics(e: Event) -> dict[str, float]:
    """Every metric of an ``eval`` event: its ``metrics`` (a user's workload), else accuracy.

    Examples
    --------
    >>> eval_metrics({"kind": "eval", "accuracy": 0.9}), eval_metrics({"metrics": {"mae": 0.2}})
    ({'accuracy': 0.9}, {'mae': 0.2})
    """
    metrics = e.get("metrics")
    if isinstance(metrics, Mapping):
        return {str(k): v for k, v in metrics.items()}
    return {} if e.get("accuracy") is None else {"accuracy": e["accuracy"]}


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


def _int_or_none(value: Any) -> int | None:
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None


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
