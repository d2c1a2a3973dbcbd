"""What a transient-aware policy knows and learns: its settings, and what it reads from the event log.

What it learns (:meth:`PolicyLearning.observe`):

- each GPU type's step rate, from the trainers' ``worker-metrics`` (local steps over time);
- each GPU type's and zone's revocations (``preempted`` events of Spot workers) and exposure
  (hours its workers ran), which update the paper's prior hazard;
- the run's progress and target (``train-started`` and ``metrics``) and the money spent;
- the PS's service rate (shard 0's ``metrics``: global steps/s against the workers pushing):
  where it serves clearly fewer steps than fewer workers did, grown in proportion (or, before
  that was seen, than their GPUs' rates), the PS is the bottleneck, its capacity is what it
  serves, and the workers' rates of that moment are not their GPUs'
  (:meth:`~transient_nb.policy.planner.Planner.observe_ps`).

What it decides with that is :class:`~transient_nb.policy.adaptive.TransientPolicy`'s."""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import dask.config
from dask.utils import parse_timedelta

from transient_nb import config
from transient_nb.catalog.lifetimes import HOUR
from transient_nb.policy.goals import check_goal
from transient_nb.policy.memory import Observations, PolicyMemory
from transient_nb.policy.planner import (
    SATURATED,
    Plan,
    Planner,
    kinds_from_catalog,
)

#: PS shards the policy may grow a run's PS to (the paper measured two: 1.75x one PS).
DEFAULT_MAX_SHARDS = 2

#: Fraction of the time or money left that a deadline or a budget keeps in reserve.
DEFAULT_MARGIN = 0.1
#: The memory file of ``memory=True`` where the configuration names none. Its name is that of
#: the files earlier versions wrote (when the policy's memory was called its "history"): a
#: user's existing file is still found.
DEFAULT_MEMORY = "~/.transient_nb/policy-history.json"
#: The shipped defaults of the configuration keys that were ``policy.history`` and
#: ``policy.history-half-life``: a user's dask config folder may hold a copy of them, which is
#: not a choice of theirs.
_OLD_DEFAULTS = {"history": None, "history-half-life": "1 day"}

#: Start-ups after a PS move before the policy weighs another: the workers already asked for
#: land where they were asked for, and their successors go near the new PS, within about one;
#: judged sooner, a cluster in transit looked better served by the PS where it came from, and
#: the PS moved back and forth three times in a run (round eleven).
PS_MOVE_SETTLE = 2.0

#: A worker whose last ``worker-metrics`` is older than this (wall seconds) is not counted as
#: pushing to the PS (trainers report every 2 s).
REPORTING_S = 10.0

#: A trainer's first ``worker-metrics`` comes this long (wall seconds) after it started training:
#: a worker's start-up is from its request to then, less this.
FIRST_REPORT_S = 2.0

#: Global steps the PS must have served, with the same workers pushing, before the policy judges
#: whether it is the bottleneck.
PS_SPAN_UPDATES = 40

#: Workers' reported rates kept while they wait for the PS's verdict on their span.
PENDING_RATES = 500

logger = logging.getLogger(__name__)


def _configured(key: str) -> Any:
    """``policy.<key>`` of the configuration; where only the key's old name (``memory`` was
    ``history``) was set, that one's value, with a ``DeprecationWarning`` naming the new key."""
    value = config.get(f"policy.{key}")
    old = key.replace("memory", "history")
    was = dask.config.get(f"transient.policy.{old}", None)
    if was is None or was == _OLD_DEFAULTS[old]:
        return value
    warnings.warn(
        f"The configuration key transient.policy.{old} is now transient.policy.{key}; set that "
        "one (the old key is read for one more release).",
        DeprecationWarning,
        stacklevel=5,
    )
    return value if value != config.defaults["transient"]["policy"][key] else was


def _memory(cluster: Any, memory: str | os.PathLike[str] | bool | None) -> PolicyMemory | None:
    """The policy's memory file: ``memory`` (a path; True: the configured one, else
    :data:`DEFAULT_MEMORY`; False: none), else ``policy.memory`` from the configuration (null:
    none), kept for the cluster's backend."""
    configured = _configured("memory")
    if memory is None:
        memory = configured
    if memory is None or memory is False:
        return None
    if memory is True:
        memory = configured or DEFAULT_MEMORY
    if not isinstance(memory, (str, os.PathLike)) or not os.fspath(memory).strip():
        raise ValueError(
            f"memory={memory!r}: give the path of the policy's memory file, True for "
            f"{DEFAULT_MEMORY}, or False for none."
        )
    half_life = parse_timedelta(_configured("memory-half-life"), default="seconds")
    backend = getattr(getattr(cluster, "backend", None), "name", None) or "local"
    return PolicyMemory(memory, str(backend), float(half_life or 86400.0))


def _renamed(old: str, new: str) -> None:
    warnings.warn(
        f"A policy's {old} is now its {new}; use that name (the old one goes in the next release).",
        DeprecationWarning,
        stacklevel=3,
    )


def _add_place(
    totals: tuple[float, float] | None, held_from: float, trained_from: float | None, end: float
) -> tuple[float, float]:
    """(held, trained) seconds of a kind's places, with one more place held from ``held_from``
    and trained from ``trained_from`` (None: never) until ``end``."""
    held, trained = totals or (0.0, 0.0)
    return (
        held + max(0.0, end - held_from),
        trained + (0.0 if trained_from is None else max(0.0, end - trained_from)),
    )


def _finite(x: float) -> float | None:
    return round(x, 2) if math.isfinite(x) else None


def _step_scale(hparams: Any) -> float:
    """``emulate_step_scale`` of a ``train-started`` event's hparams (a JSON text), else 1."""
    import json

    try:
        value = float(
            (json.loads(hparams) if isinstance(hparams, str) else hparams or {}).get(
                "emulate_step_scale", 1.0
            )
        )
    except (TypeError, ValueError, AttributeError):
        return 1.0
    return value if value > 0 and math.isfinite(value) else 1.0


class PolicyLearning:
    """The settings of a :class:`~transient_nb.policy.adaptive.TransientPolicy` and what it learns from the event log."""

    def __init__(
        self,
        cluster: Any,
        goal: str,
        *,
        deadline: str | float | None = None,
        budget: float | None = None,
        gpus: Sequence[str] | None = None,
        max_workers: int | None = None,
        max_shards: int | None = None,
        interval: str | float = "30s",
        hysteresis: float = 0.1,
        margin: float = DEFAULT_MARGIN,
        on_demand: bool = True,
        planner: Planner | None = None,
        memory: str | os.PathLike[str] | bool | None = None,
        history: str | os.PathLike[str] | bool | None = None,
    ):
        if history is not None:
            # The keyword's name before 0.2, for one release.
            warnings.warn(
                "history= is now memory= (the file of what earlier runs saw); pass memory= "
                "(history= goes in the next release).",
                DeprecationWarning,
                stacklevel=3,
            )
            if memory is not None:
                raise ValueError("Give memory= alone (history= is its old name).")
            memory = history
        self.deadline_s, budget = check_goal(goal, deadline, budget)
        self.cluster = cluster
        self.goal = goal
        self.budget = budget
        limit = getattr(getattr(cluster, "limits", None), "max_workers", None)
        self.max_workers = int(max_workers or limit or 8)
        if self.max_workers < 1:
            raise ValueError(f"max_workers={max_workers!r} must be at least 1.")
        self.max_shards = DEFAULT_MAX_SHARDS if max_shards is None else max_shards
        if isinstance(self.max_shards, bool) or not isinstance(self.max_shards, int):
            raise ValueError(f"max_shards={max_shards!r} must be a whole number of at least 1.")
        if self.max_shards < 1:
            raise ValueError(f"max_shards={max_shards!r} must be a whole number of at least 1.")
        self.interval_s = float(parse_timedelta(interval, default="seconds") or 30.0)
        self.hysteresis = float(hysteresis)
        if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0 <= margin < 1:
            raise ValueError(
                f"margin={margin!r} must be a fraction from 0 to below 1 (e.g. 0.1: plan to meet "
                "the goal with 10% of the time or money to spare)."
            )
        self.margin = float(margin)
        if planner is None:
            # Default: the types the cluster has (all of a mix) and its fallbacks.
            gpus = list(
                gpus
                or dict.fromkeys(
                    [
                        *dict(getattr(cluster, "mix", None) or {}),
                        cluster.gpu,
                        *getattr(cluster.placement, "fallback_gpus", []),
                    ]
                )
            )
            # Every zone the cluster may place workers in (its own, then its fallbacks): the
            # planner weighs each zone's price, the revocations observed there, and its
            # distance from the PS (the PS hosts run in the cluster's zone: a worker in another
            # region steps slower).
            zones = list(
                dict.fromkeys([cluster.zone, *getattr(cluster.placement, "fallback_zones", [])])
            )
            kinds = kinds_from_catalog(
                cluster.catalog, gpus, zones, cluster.machine_type, spot=cluster.spot
            )
            if cluster.spot and on_demand and kinds:
                kinds += kinds_from_catalog(
                    cluster.catalog, gpus, zones, cluster.machine_type, spot=False
                )
            if not kinds:
                raise ValueError(
                    f"None of the GPU types {gpus} is priced in {cluster.zone} by the catalog: "
                    "give gpus= types the catalog knows."
                )
            ps_hourly = float(
                cluster.catalog.machine_price(cluster.ps_machine_type, cluster.zone).rate(False)
            )
            planner = Planner(kinds, ps_hourly, ps_zone=cluster.zone)
        self.planner = planner
        # What earlier runs saw, read (and a file that is not a policy memory refused) before the
        # policy changes anything.
        self.memory = _memory(cluster, memory)
        self._remembered = Observations() if self.memory is None else self.memory.load()
        self.planner.remember(self._remembered)
        self.started_at = time.time()
        self.last: Plan | None = None
        self._seen = 0
        self._local: dict[str, tuple[float, int]] = {}  # worker -> (time, local_step) last seen
        self._vm: dict[str, dict[str, Any]] = {}
        # Worker -> (gpu, zone, spot) of those not gone.
        self._live: dict[str, tuple[str, str, bool]] = {}
        self._running_since: dict[str, float] = {}
        self._requested_at: dict[str, float] = {}
        # Workers asked for before the run started: when, and when they joined (their start-up
        # less the time they waited for the run is the first evidence of what a change costs).
        self._asked_before: dict[str, float] = {}
        self._joined_at: dict[str, float] = {}
        self._train_started_at: float | None = None
        self._acted_at: float | None = None
        # Spot workers' places (planner.observe_availability): replacements asked for and not
        # yet matched with their VM's request; worker -> when its place is held from (a
        # replacement's request, another's first training) and when it trained from; and the
        # (gpu, zone) totals of the workers gone, in wall seconds.
        self._replacing = 0
        self._held_from: dict[str, float] = {}
        self._trained_from: dict[str, float] = {}
        self._held_gone: dict[tuple[str, str], tuple[float, float]] = {}
        self._steps: int | None = None
        self._step = 0
        self._elastic = False  # the run follows new PS hosts (started without shards=)
        self._run_shards = 1  # the run's PS shards (train-started, then ps-resharded)
        # Worker -> the steps/s it said it pushed between its last two reports.
        self._pushing: dict[str, float] = {}
        # Steps, wall seconds and workers pushing of the PS windows not judged yet.
        self._span: tuple[int, float, int] = (0, 0.0, 0)
        # Workers' rates (gpu, steps/s, zone) until the PS's next verdict judges them.
        self._pending_rates: list[tuple[str, float, Any]] = []
        # (shards, workers pushing) -> global steps/s the PS served in windows with that many.
        self._served: dict[tuple[int, int], list[float]] = {}
        self._ps_bottleneck = False  # the last verdict: the PS served less than was pushed
        self._ps_zone_before: str | None = None  # where the PS was before a move under way
        self._ps_moved_at: float | None = None  # when the PS was last asked to move
        self._task: asyncio.Task[None] | None = None
        self._posted_eta: float | None = None
        # Simulated seconds per wall second (the local backend's time_scale; 1 on a cloud), and
        # emulated steps per global step (from the run's hparams; 1 unless the run is paced).
        self.time_scale = float(getattr(cluster, "time_scale", 1.0) or 1.0)
        self.step_scale = 1.0

    # -- what it learns ------------------------------------------------------------------------------
    def observe(self, events: Iterable[Mapping[str, Any]]) -> None:
        """Feed events (the cluster's log, in order; already-seen ones are skipped by index)."""
        events = list(events)
        for e in events[self._seen :]:
            self._observe_one(e)
        self._seen = len(events)

    def _observe_one(self, e: Mapping[str, Any]) -> None:
        kind, name = e.get("kind"), e.get("worker")
        t = float(e.get("time", time.time()))
        if kind == "running" and e.get("role") == "ps" and name == "ps-0" and e.get("zone"):
            # Where the PS runs (its host may have fallen back to another zone).
            self.planner.ps_zone = str(e["zone"])
        elif kind == "ps-move" and e.get("zone"):
            # Planned from the move on (the run follows within a PS host's start-up).
            self._ps_zone_before = self.planner.ps_zone
            self.planner.ps_zone = str(e["zone"])
            self._ps_moved_at = t
        elif kind == "ps-move-failed" and self._ps_zone_before is not None:
            self.planner.ps_zone = self._ps_zone_before
        if kind == "replacement-requested" and e.get("role") == "worker":
            self._replacing += 1
        if kind in ("requested", "running") and name and e.get("role") == "worker":
            if kind == "requested" and self._replacing > 0:
                self._replacing -= 1
                if bool(e.get("spot", True)):
                    self._held_from[str(name)] = t
            self._vm[str(name)] = dict(e)
            self._live[str(name)] = (
                str(e.get("gpu")),
                str(e.get("zone")),
                bool(e.get("spot", True)),
            )
            if kind == "running":
                self._running_since[str(name)] = t
            elif self._steps is not None:
                self._requested_at[str(name)] = t  # asked for while a run trains
            else:
                self._asked_before[str(name)] = t
        elif kind == "joined" and name and e.get("role", "worker") == "worker":
            self._joined_at.setdefault(str(name), t)
        elif kind in ("preempted", "deleted") and name in self._vm:
            self._live.pop(str(name), None)
            vm = self._vm[str(name)]
            started = self._running_since.pop(str(name), None)
            hours = 0.0 if started is None else max(0.0, t - started) * self.time_scale / HOUR
            spot = bool(vm.get("spot", True))
            revoked = int(kind == "preempted" and spot)
            if spot:
                # An on-demand worker's hours are no Spot exposure: counted, they made a stormy
                # Spot kind look calm once the policy ran its workers on demand (round twelve).
                self.planner.observe_exposure(
                    str(vm.get("gpu")), str(vm.get("zone")), hours, revoked
                )
            self._close_place(str(name), vm, t, revoked=bool(revoked))
        elif kind == "worker-metrics" and name:
            if str(name) not in self._trained_from and str(name) in self._live:
                training = t - FIRST_REPORT_S
                self._held_from.setdefault(str(name), training)
                self._trained_from[str(name)] = max(training, self._held_from[str(name)])
            asked = self._requested_at.pop(str(name), None)
            if asked is not None:
                # How long a worker takes from being asked for to training, on this cluster:
                # what every revocation costs, and what the planner's availability needs. Its
                # trainer's first report, not its joining: loading the data and the model and
                # registering with the PS came to a third of the start-up here (round ten).
                # The part after its VM ran is lived out of the VM's lifetime.
                self._observe_startup(str(name), t - FIRST_REPORT_S, asked)
            else:
                self._observe_first_startup(str(name), t - FIRST_REPORT_S)
            local = int(e.get("local_step", 0))
            before = self._local.get(str(name))
            self._local[str(name)] = (t, local)
            vm = self._vm.get(str(name), {})
            gpu = vm.get("gpu")
            if before is not None and t > before[0] and local >= before[1]:
                self._pushing[str(name)] = (
                    (local - before[1]) / (t - before[0]) * self.step_scale / self.time_scale
                )
            if before is not None and gpu and t > before[0] and local > before[1]:
                wall_rate = (local - before[1]) / (t - before[0])
                # Held until the PS's next window says whether it kept up: a worker that waited
                # on the PS pushed the PS's share, not its GPU's rate.
                self._pending_rates.append(
                    (str(gpu), wall_rate * self.step_scale / self.time_scale, vm.get("zone"))
                )
        elif kind == "train-started":
            if e.get("flops_per_sample") is not None:  # a user's model, not ResNet-32
                self._use_model(e)
            self._train_started_at = t
            self._steps = int(e.get("steps") or 0) or None
            self._step = int(e.get("resumed_step") or 0)
            self.step_scale = _step_scale(e.get("hparams"))
            self._elastic = bool(e.get("elastic_shards"))
            self._run_shards = int(e.get("shards") or 1)
        elif kind == "ps-resharded":
            self._run_shards = int(e.get("shards") or self._run_shards)
        elif kind == "metrics":
            self._step = max(self._step, int(e.get("step", 0)))
            self._observe_ps(e, t)

    def _use_model(self, e: Mapping[str, Any]) -> None:
        """The run trains a user's model: its size and FLOPs, not ResNet-32's, are the
        planner's priors (the PS's capacity, the rate of each GPU type it may buy)."""
        # Imported here: a policy of the built-in runs never pays for torch's counters.
        from transient_nb.training.estimate import worker_rate

        flops = float(e["flops_per_sample"])
        batch = int(e.get("batch_size") or 128)
        operators = int(e.get("operators") or 0)
        rates = {}
        for kind in self.planner.kinds:
            rate, _ = worker_rate(self.cluster.catalog, kind.gpu.lower(), flops, batch, operators)
            if rate is not None:
                rates[kind.gpu.lower()] = rate
        self.planner.use_model(int(e.get("parameters") or 0), rates)

    def _observe_first_startup(self, name: str, training: float) -> None:
        """The start-up of a worker asked for before the run: from its request to its training,
        less the time it waited, joined, for the run to start. Until a change's own workers
        train, the paper's prior (108 s, 19 s of them loading: a warm restart) was all the
        policy knew, and three changes were planned on it where a worker took 221 s here
        (123 s loading): a calm budget ran 10% over (round eleven)."""
        asked = self._asked_before.pop(name, None)
        joined, started = self._joined_at.get(name), self._train_started_at
        if asked is None or joined is None or started is None or training < started:
            return
        self._observe_startup(name, training, asked, idle=max(0.0, started - joined), first=True)

    def _observe_startup(
        self, name: str, training: float, asked: float, idle: float = 0.0, first: bool = False
    ) -> None:
        """``name`` was asked for at ``asked`` and trained from ``training`` (wall seconds),
        ``idle`` of them waiting for the run: its start-up, and the part of it after its VM
        ran (lived out of the VM's lifetime), to the planner in simulated seconds."""
        waited = max(0.0, training - asked - idle)
        ran = self._running_since.get(name)
        load = None if ran is None else min(waited, max(0.0, training - ran - idle))
        self.planner.observe_startup(
            waited * self.time_scale,
            None if load is None else load * self.time_scale,
            first=first,
        )

    def _close_place(self, name: str, vm: Mapping[str, Any], t: float, revoked: bool) -> None:
        """A Spot worker's place is over (its worker revoked or given back): into the totals.
        One given back before it trained is left out (it had no chance to)."""
        held_from = self._held_from.pop(name, None)
        trained_from = self._trained_from.pop(name, None)
        if held_from is None or not bool(vm.get("spot", True)):
            return
        if trained_from is None and not revoked:
            return
        key = (str(vm.get("gpu")).lower(), str(vm.get("zone")))
        self._held_gone[key] = _add_place(self._held_gone.get(key), held_from, trained_from, t)

    def observe_places(self, now: float | None = None) -> None:
        """Tell the planner how much of their places' time the Spot workers of each kind
        trained so far, the places still held counted to ``now``."""
        now = time.time() if now is None else now
        totals = dict(self._held_gone)
        for name, held_from in self._held_from.items():
            vm = self._vm.get(name, {})
            if name not in self._live or not bool(vm.get("spot", True)):
                continue
            key = (str(vm.get("gpu")).lower(), str(vm.get("zone")))
            totals[key] = _add_place(totals.get(key), held_from, self._trained_from.get(name), now)
        for (gpu, zone), (held, trained) in totals.items():
            self.planner.observe_availability(
                gpu, zone, held * self.time_scale / HOUR, trained * self.time_scale / HOUR
            )

    def _observe_ps(self, e: Mapping[str, Any], t: float) -> None:
        """The PS's service rate against what its workers would push (shard 0's window of
        ``metrics``): the planner learns the PS's capacity, and whether the workers' own rates
        are their GPUs' or the PS's.

        The workers counted are those pushing: reported within ``REPORTING_S`` (a trainer's
        first report comes after 2 s of steps, longer than a PS window; one still loading has
        none, and would look like demand the PS failed to serve). What they would push is,
        where the run was seen with fewer of them, that rate grown in proportion (the issue's
        test: where adding workers stops adding steps, the PS is the bottleneck); before that,
        the sum of their GPUs' rates.
        """
        served = e.get("steps_per_s")
        if int(e.get("shard") or 0) != 0 or served is None:
            return
        updates = int(e.get("updates") or 0)
        if updates <= 0 or float(served) <= 0:
            return
        if not self._judge_ps(updates, updates / float(served), t):
            # No verdict yet: the rates wait for one (the newest few hundred).
            self._pending_rates = self._pending_rates[-PENDING_RATES:]
            return
        pending, self._pending_rates = self._pending_rates, []
        if not self._ps_bottleneck:
            for gpu, rate, zone in pending:
                self.planner.observe_rate(gpu, rate, zone)

    def _judge_ps(self, updates: int, seconds: float, t: float) -> bool:
        """Add a window to the span; judge the span once it is long enough. Returns whether
        it judged (``_ps_bottleneck`` is then the verdict)."""
        kinds = {(k.gpu, k.zone): k for k in self.planner.kinds}
        rates, pushed = [], 0.0
        for worker, (seen, _) in self._local.items():
            vm = self._vm.get(worker)
            if vm is None or worker not in self._live or t - seen > REPORTING_S:
                continue
            kind = kinds.get((str(vm.get("gpu")), str(vm.get("zone"))))
            rates.append(
                self.planner.kind_rate(kind) if kind else self.planner.rate(str(vm.get("gpu")))
            )
            pushed += self._pushing.get(worker, 0.0)
        if not rates:
            return False
        # A verdict per PS_SPAN_UPDATES steps with the same workers pushing, not per window: a
        # window holds a handful of steps at an emulated pace (8 at 3 P100, time scale 40),
        # and one step more or less in it read as a bottleneck that was not there.
        n = len(rates)
        count, span, workers = self._span
        count, span = (count + updates, span + seconds) if workers == n else (updates, seconds)
        self._span = (count, span, n)
        if count < PS_SPAN_UPDATES:
            return False
        self._span = (0, 0.0, n)
        rate = count / span * self.step_scale / self.time_scale
        if rate * SATURATED > pushed:
            # More served than the workers counted say they pushed: some push that have not
            # reported yet. Neither a verdict nor a sample (it would make the next count look
            # short).
            return False
        fewer = [m for (sh, m) in self._served if sh == self._run_shards and m < n]
        if fewer:
            m = max(fewer)
            seen_at_m = sorted(self._served[(self._run_shards, m)])
            demand = seen_at_m[len(seen_at_m) // 2] * n / m
        else:
            demand = sum(rates)
        self._served.setdefault((self._run_shards, n), []).append(rate)
        self._ps_bottleneck = self.planner.observe_ps(self._run_shards, rate, demand)
        return True

    @property
    def remembered_h(self) -> float:
        """Hours of Spot workers' places the memory gave the planner (aged): 0 without one."""
        return float(sum(r[2] for r in self._remembered.kinds.values()))

    def observations(self, now: float | None = None) -> Observations:
        """What this run saw (the planner's, see :meth:`Planner.observations`), the hours of
        the Spot workers still running counted to ``now``: what the next run starts from."""
        now = time.time() if now is None else now
        self.observe_places(now)
        seen = self.planner.observations()
        hours: dict[tuple[str, str], float] = {}
        for name, since in self._running_since.items():
            gpu, zone, spot = self._live.get(name, ("", "", False))
            if spot:
                key = (gpu.lower(), zone)
                hours[key] = hours.get(key, 0.0) + max(0.0, now - since) * self.time_scale / HOUR
        return seen + Observations({k: (0.0, h, 0.0, 0.0) for k, h in hours.items()})

    def save_memory(self, now: float | None = None) -> None:
        """Keep what this run saw in the policy's memory file (when it has one)."""
        if self.memory is None:
            return
        seen = self.observations(now)
        if seen:
            try:
                self.memory.save(seen, now)
            except OSError:  # a full disk must not stop the policy: the next round tries again
                logger.warning("Could not save the policy's memory to %s", self.memory.path)

    # The names of memory and save_memory before 0.2, for one release.
    @property
    def history(self) -> PolicyMemory | None:
        """Deprecated: :attr:`memory`."""
        _renamed("history", "memory")
        return self.memory

    def save_history(self, now: float | None = None) -> None:
        """Deprecated: :meth:`save_memory`."""
        _renamed("save_history()", "save_memory()")
        self.save_memory(now)
