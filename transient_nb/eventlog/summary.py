"""The summary and the training curve of a run, folded from its event log.

:func:`summarize` (a :class:`RunSummary` fed event by event) is the table every surface shows at
a run's end; :func:`training_curve` is its training curve, with the money spent at each point
(what ``run.history`` shows). Before 0.2 they were ``history`` and ``HISTORY_COLUMNS``; those
names still work for one release, with a ``DeprecationWarning``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from transient_nb._moved import renamed
from transient_nb.catalog.prices import BILLING_MINIMUM_S
from transient_nb.eventlog.bill import Bill
from transient_nb.eventlog.progress import eval_metrics

Event = Mapping[str, Any]


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


#: Columns of :func:`training_curve` (and so of ``run.history``).
CURVE_COLUMNS = [
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


def training_curve(
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
    A DataFrame with :data:`CURVE_COLUMNS`: step, time (s since ``t0``), loss, test accuracy
    (last evaluation), active workers, staleness, img/s, lr, cost and on-demand cost so far;
    then one column per further metric of the run (a user's ``metrics=``: its last
    evaluation's value, empty before the first). Linear in the number of events (the bill is
    kept incrementally).

    Examples
    --------
    >>> training_curve([], t0=0.0).empty
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
    return pd.DataFrame(rows, columns=[*CURVE_COLUMNS, *more])


# The names before 0.2, for one release ("history" is a run's curve as users see it, run.history,
# and the policy's memory was a history too).
__getattr__ = renamed(__name__, {"history": "training_curve", "HISTORY_COLUMNS": "CURVE_COLUMNS"})
