"""The progress of a training run, folded from the event log: its step, pace, ETA and metrics.

:class:`RunTracker` follows one run (or the latest) event by event; its :class:`RunProgress` is
what every view shows of a run that goes on (:mod:`transient_nb.eventlog.folds` keeps one for the
cluster's views).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from transient_nb.eventlog.bill import CostReport

Event = Mapping[str, Any]

#: Window over which the training pace (and so the ETA) is measured, in wall-clock seconds: long
#: enough to smooth the PS's metric intervals, short enough to follow a preemption's slowdown.
PACE_WINDOW_S = 60.0


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
                    parameters=int_or_none(e.get("parameters")),
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


def int_or_none(value: Any) -> int | None:
    """``value`` as an int; None where it is None or not a number."""
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None
