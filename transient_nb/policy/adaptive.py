"""A transient-aware policy: the cluster chooses its mix of GPU workers to meet a goal.

Like :class:`distributed.deploy.Adaptive`, the policy is separate from the mechanism: it is called
periodically, reads what happened (the cluster's event log), asks the
:class:`~transient_nb.policy.planner.Planner` for the configuration that best meets its goal for the steps
left, and acts only through the cluster's public API (``cluster.scale(mix)``). Every decision is a
``policy-decision`` event with its reason, e.g. ``"3 k80 in us-central1-a + 1 v100 in
us-central1-a, 1 PS shard: ETA 1.90 h -> 1.20 h, +0.44 $/h, expected $2.10 to finish"``, and the
cluster's probability of losing 1, 2 or 3 workers within the next hour.

What it learns from the event log (:meth:`TransientPolicy.observe`):

- each GPU type's step rate, from the trainers' ``worker-metrics`` (local steps over time);
- each GPU type's and zone's revocations (``preempted`` events of Spot workers) and exposure
  (hours its workers ran), which update the paper's prior hazard;
- the run's progress and target (``train-started`` and ``metrics``) and the money spent;
- the PS's service rate (shard 0's ``metrics``: global steps/s against the workers pushing):
  where it serves clearly fewer steps than fewer workers did, grown in proportion (or, before
  that was seen, than their GPUs' rates), the PS is the bottleneck, its capacity is what it
  serves, and the workers' rates of that moment are not their GPUs'
  (:meth:`~transient_nb.policy.planner.Planner.observe_ps`).

Its clock is the cluster's: on a local cluster with ``time_scale`` (simulated seconds per wall
second), deadlines, start-up delays, hazards and ETAs are in simulated time, as the bill is, and
a wall-clock rate or exposure is converted. Its steps are the steps the run stands for: with the
paper emulation's ``emulate_step_scale`` (each global step paced as that many GPU steps), a
trainer's rate and the steps left are counted in emulated steps, the unit of the planner's prior
rates and PS capacity. Without either, both clocks and both step counts are the same.

Goals: ``"deadline"`` (the cheapest mix expected to finish in time), ``"budget"`` (the fastest
mix expected to stay within the money left) and ``"cost-per-step"``. A new mix is applied only when
it is expected to be better by at least ``hysteresis`` (a fraction) in the goal's measure, so the
cluster does not flap between near-equal mixes; a mix that no longer meets the goal is always
replaced.

Besides the mix it decides: PS shards (``cluster.scale_ps``) where one PS is the bottleneck of a
run that follows new PS hosts; the zone new workers of each type go to first (``prefer_zone``);
on a Spot cluster, how many of each type run on demand (``scale(..., on_demand=...)``, where the
goal needs workers no storm revokes); and where the PS runs (``cluster.move_ps``), when the plan
with the PS in another region is better by the hysteresis.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dask.utils import parse_timedelta

from transient_nb import config
from transient_nb.catalog.lifetimes import HOUR
from transient_nb.eventlog.folds import event_log
from transient_nb.policy.history import Observations, PolicyHistory
from transient_nb.policy.planner import (
    GOALS,
    SATURATED,
    Configuration,
    Estimate,
    Kind,
    Plan,
    Planner,
    kinds_from_catalog,
    plan_fields,
)
from transient_nb.training.emulation import region_of

#: PS shards the policy may grow a run's PS to (the paper measured two: 1.75x one PS).
DEFAULT_MAX_SHARDS = 2

#: Fraction of the time or money left that a deadline or a budget keeps in reserve.
DEFAULT_MARGIN = 0.1
#: The history file of ``history=True`` where the configuration names none.
DEFAULT_HISTORY = "~/.transient_nb/policy-history.json"

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


def parse_goal(text: str) -> tuple[str | None, dict[str, Any]]:
    """Read a goal as typed in the magic and the CLI: ``GOAL[:VALUE]``, or ``off``.

    Examples
    --------
    >>> parse_goal("deadline:2h")
    ('deadline', {'deadline': '2h'})
    >>> parse_goal("budget:20")
    ('budget', {'budget': 20.0})
    >>> parse_goal("cost-per-step"), parse_goal("off")
    (('cost-per-step', {}), (None, {}))
    """
    goal, _, value = str(text).strip().partition(":")
    goal = goal.strip().lower()
    if goal in ("off", "none", "stop"):
        return None, {}
    if goal == "deadline" and value:
        return goal, {"deadline": value.strip()}
    if goal == "budget" and value:
        try:
            return goal, {"budget": float(value)}
        except ValueError:
            pass
    if goal == "cost-per-step" and not value:
        return goal, {}
    raise ValueError(
        f"goal {text!r}: write deadline:DURATION (e.g. deadline:2h), budget:DOLLARS (e.g. "
        "budget:20), cost-per-step, or off."
    )


def check_goal(
    goal: Any, deadline: Any = None, budget: Any = None
) -> tuple[float | None, float | None]:
    """Check a goal and its limit; returns ``(deadline_s, budget)``, or a ``ValueError`` that
    names the bad value and says what to give."""
    if goal not in GOALS:
        raise ValueError(f"goal={goal!r}: use one of {', '.join(GOALS)}.")
    deadline_s: float | None = None
    if goal == "deadline":
        try:
            deadline_s = parse_timedelta(deadline, default="seconds")
        except (ValueError, TypeError, KeyError, IndexError):
            deadline_s = None
        if not deadline_s or deadline_s <= 0:
            raise ValueError(
                f"goal='deadline' needs deadline= a positive duration such as '2h', "
                f"not {deadline!r}."
            )
    if goal == "budget":
        if not (isinstance(budget, (int, float)) and not isinstance(budget, bool) and budget > 0):
            raise ValueError(
                f"goal='budget' needs budget= a positive number of dollars, not {budget!r}."
            )
        return deadline_s, float(budget)
    return deadline_s, None


class TransientPolicy:
    """Choose the cluster's GPU mix for a goal, periodically, from its event log.

    Parameters
    ----------
    cluster
        A :class:`~transient_nb.TransientCluster` (anything with ``monitor.events``, ``cost()``,
        ``scale(mix)``, ``catalog``, ``zone``, ``machine_type``, ``ps_machine_type``, ``limits``).
    goal
        ``"deadline"``, ``"budget"`` or ``"cost-per-step"``.
    deadline
        For ``goal="deadline"``: a duration (``"2h"``, seconds) from when the policy starts, on
        the cluster's clock (simulated time on a local cluster with a ``time_scale``).
    budget
        For ``goal="budget"``: dollars the cluster may spend in all (what it spent counts).
    gpus
        GPU types it may use (default: the cluster's own, every type of its mix, and its
        fallbacks).
    max_workers
        Largest cluster it may ask for (default: the cluster's ``max_workers`` limit, else 8).
    max_shards
        Most PS shards (one PS host each) it may grow the PS to, when one PS is the bottleneck
        (default 2, the paper's measured gain; never fewer than the cluster has). Only a run
        started without ``shards=`` follows new PS hosts, so only such a run gets them.
    interval
        How often it decides (wall-clock).
    hysteresis
        Relative improvement a new mix must promise before the cluster is changed.
    margin
        Fraction of the time or money left that a deadline or a budget keeps in reserve against
        the model's errors (default 0.1): the plan must meet the goal with 10% to spare. A
        budget plan expected to cost $0.98 of $1.00 cost $1.15 (round ten: its first start-ups
        took longer than the paper's).
    on_demand
        On a Spot cluster, whether it may run some workers on demand (default True): it does
        where the model expects them to serve the goal better, e.g. a deadline that a storm of
        revocations makes Spot workers alone miss (an on-demand worker is never revoked, and
        costs about three times a Spot one). False keeps every worker Spot.
    planner
        A ready planner (tests); default: one built from the cluster's catalog.
    """

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
        history: str | os.PathLike[str] | bool | None = None,
    ):
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
                        *getattr(cluster.policy, "fallback_gpus", []),
                    ]
                )
            )
            # Every zone the cluster may place workers in (its own, then its fallbacks): the
            # planner weighs each zone's price, the revocations observed there, and its
            # distance from the PS (the PS hosts run in the cluster's zone: a worker in another
            # region steps slower).
            zones = list(
                dict.fromkeys([cluster.zone, *getattr(cluster.policy, "fallback_zones", [])])
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
        # What earlier runs saw, read (and a file that is not a history refused) before the
        # policy changes anything.
        self.history = _history(cluster, history)
        self._remembered = Observations() if self.history is None else self.history.load()
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

    # -- what it decides -----------------------------------------------------------------------------
    def current(self) -> Configuration:
        """The cluster's configuration now: its workers asked for, by GPU type, each in the zone
        its live VMs are in, Spot or on demand as they run (those still to come: where the
        cluster places that type first, on demand while the type has fewer on-demand workers
        than the cluster keeps)."""
        mix = getattr(self.cluster, "mix", None)
        if mix is None:
            mix = {self.cluster.gpu: int(getattr(self.cluster, "_target", 0))}
        dear = dict(getattr(self.cluster, "on_demand", None) or {})
        kinds = {(k.gpu, k.zone, k.spot): k for k in self.planner.kinds}
        counts: dict[Kind, int] = {}
        for gpu, n in dict(mix).items():
            n = int(n)
            of_gpu = [k for k in self.planner.kinds if k.gpu == gpu]
            if not n or not of_gpu:
                continue
            on_demand = int(dear.get(gpu, 0))
            for g, zone, spot in self._live.values():
                kind = kinds.get((g, zone, spot)) or kinds.get((g, zone, not spot))
                if g == gpu and kind is not None and n > 0:
                    counts[kind] = counts.get(kind, 0) + 1
                    n -= 1
                    on_demand -= int(not kind.spot)
            zone = self._first_zone(gpu)
            for spot, m in ((False, min(n, max(0, on_demand))), (True, n - max(0, on_demand))):
                if m > 0:
                    home = kinds.get((gpu, zone, spot)) or kinds.get((gpu, zone, True))
                    home = home or next((k for k in of_gpu if k.spot == spot), of_gpu[0])
                    counts[home] = counts.get(home, 0) + m
        return Configuration.of(counts, self._shards())

    def _first_zone(self, gpu: str) -> str:
        replacement = getattr(self.cluster, "policy", None)
        preferred = getattr(replacement, "preferred_zones", None) or {}
        return str(preferred.get(gpu, getattr(self.cluster, "zone", "")))

    def zones_of(self, plan: Plan) -> dict[str, str]:
        """GPU type -> the zone the plan puts most of that type in (ties: the earlier kind)."""
        best: dict[str, tuple[int, str]] = {}
        for kind, n in plan.chosen.config.workers:
            if kind.gpu not in best or n > best[kind.gpu][0]:
                best[kind.gpu] = (n, kind.zone)
        return {gpu: zone for gpu, (_, zone) in best.items()}

    def remaining_steps(self) -> int | None:
        """Global steps the run still has to train (None before a run starts)."""
        if self._steps is None:
            return None
        return max(0, self._steps - self._step)

    def recommend(self, now: float | None = None) -> Plan | None:
        """The planner's choice for the steps left (None when no run is going or it is done)."""
        remaining = self.remaining_steps()
        if not remaining:
            return None
        now = time.time() if now is None else now
        self.observe_places(now)
        kwargs: dict[str, Any] = {}
        if self.goal == "deadline":
            assert self.deadline_s is not None
            elapsed = (now - self.started_at) * self.time_scale
            kwargs["deadline_s"] = max(1.0, (self.deadline_s - elapsed) * (1 - self.margin))
        elif self.goal == "budget":
            assert self.budget is not None
            left = self.budget - float(self.cluster.cost().total)
            kwargs["budget"] = max(0.01, left * (1 - self.margin))
        shards = self._shards()
        # More shards only for a run that follows new PS hosts, and never fewer. Before the PS
        # is measured the paper's plateau decides (waiting to measure cost a deadline run the
        # seconds that mattered); once measured, what it serves does.
        return self.planner.choose(
            self.goal,
            remaining * self.step_scale,
            max_workers=self.max_workers,
            max_shards=max(shards, self.max_shards) if self._elastic else shards,
            min_shards=shards,
            current=self.current(),
            **kwargs,
        )

    def _shards(self) -> int:
        return int(getattr(self.cluster, "ps_hosts", 1) or 1)

    def worth_changing(self, plan: Plan) -> bool:
        """Whether ``plan``'s mix is enough better than the current one to act on."""
        now, new = plan.current, plan.chosen
        if now is None or new.config == now.config:
            return False
        if now.liveput <= 0:
            return True
        return self.better(plan, new, now)

    def settling(self, now: float | None = None) -> bool:
        """Whether the last change is still taking effect: its workers take a start-up (the
        median observed) to boot and join, and until then the cluster's rates, and the plan made
        from them, do not show it. No other change before (under a storm, changing on a plan
        made mid-change flapped the mix: each change billed a boot and gave back working VMs)."""
        if self._acted_at is None:
            return False
        now = time.time() if now is None else now
        return now - self._acted_at < self.planner.startup_s / self.time_scale

    def mix_of(self, plan: Plan) -> dict[str, int]:
        """The plan as the mix ``cluster.scale`` takes (types it leaves out go to 0)."""
        mix = {k.gpu: 0 for k in self.planner.kinds}
        for kind, n in plan.chosen.config.workers:
            mix[kind.gpu] = mix.get(kind.gpu, 0) + n
        return mix

    def on_demand_of(self, plan: Plan) -> dict[str, int]:
        """GPU type -> how many of the plan's workers of that type run on demand (types with
        none left out)."""
        dear: dict[str, int] = {}
        for kind, n in plan.chosen.config.workers:
            if not kind.spot:
                dear[kind.gpu] = dear.get(kind.gpu, 0) + n
        return dear

    def _on_demand_asked(self, plan: Plan) -> dict[str, int]:
        """:meth:`on_demand_of` with every type the planner may buy (0 for those with none):
        a type whose on-demand workers the plan drops gets them swapped back for Spot ones."""
        return {**{k.gpu: 0 for k in self.planner.kinds}, **self.on_demand_of(plan)}

    def _weighs_on_demand(self) -> bool:
        return any(not k.spot for k in self.planner.kinds) and bool(
            getattr(self.cluster, "spot", True)
        )

    def decision_fields(self, plan: Plan, acted: bool) -> dict[str, Any]:
        """The fields of the ``policy-decision`` event of ``plan``."""
        config = plan.chosen.config
        return {
            **plan_fields(plan),
            "acted": acted,
            "mix": self.mix_of(plan),
            "on_demand": self.on_demand_of(plan),
            "zones": self.zones_of(plan),
            "remaining_steps": self.remaining_steps(),
            "p_lose_1h": [round(self.planner.p_lose_at_least(config, k), 4) for k in (1, 2, 3)],
            # Of each Spot kind the plan or the cluster has: the fraction of the time a worker
            # is expected up, and the model's own figure (the difference: what was observed).
            "availability": self._availabilities(plan),
            # What the plan assumes of the PS (measured live once it was the bottleneck).
            "ps_capacity": _finite(self.planner.ps_capacity(config.shards)),
            "ps_bottleneck": self._ps_bottleneck,
            "ps_zone": self.planner.ps_zone,
            # What a change is expected to wait for its new workers (simulated seconds).
            "startup_s": round(self.planner.startup_s, 1),
            "load_s": round(self.planner.load_s, 1),
        }

    def _availabilities(self, plan: Plan) -> dict[str, list[float]]:
        configs = [plan.chosen.config] + ([plan.current.config] if plan.current else [])
        kinds = dict.fromkeys(k for c in configs for k, _ in c.workers if k.spot)
        return {
            f"{k.gpu}@{k.zone}": [
                round(self.planner.availability(k), 4),
                round(self.planner.model_availability(k), 4),
            ]
            for k in kinds
        }

    def better(self, plan: Plan, new: Estimate, old: Estimate) -> bool:
        """Whether ``new`` serves ``plan``'s goal enough better than ``old`` (by the hysteresis).

        A deadline: meeting it where ``old`` misses it; both meet it, cheaper; both miss it,
        enough sooner (a near-equal miss is no reason to boot and give back VMs: under a storm
        that flapped the mix a dozen times). A budget: within it where ``old`` is not; both
        within, sooner; both over, cheaper. Cost per step: less per step.
        """
        factor = 1 - self.hysteresis
        if plan.goal == "cost-per-step":
            return new.cost_per_step < old.cost_per_step * factor
        if plan.meets(new) != plan.meets(old):
            return plan.meets(new)
        cheaper, sooner = new.cost < old.cost * factor, new.eta_s < old.eta_s * factor
        if plan.goal == "deadline":
            return cheaper if plan.meets(new) else sooner
        return sooner if plan.meets(new) else cheaper

    def ps_move(self, plan: Plan, now: float | None = None) -> tuple[str, Plan] | None:
        """A zone in another region to move the PS to, and the plan made there, where that
        plan is :meth:`better` than ``plan`` (the workers there then step at their GPU's
        speed, not 1.48x slower); None when staying is as good, or no zone elsewhere is
        allowed.

        The planner weighs each other region's first zone the cluster may use as the PS's
        place. A move costs a PS host's start-up, during which the run goes on where it is.
        """
        here = self.planner.ps_zone
        if here is None or getattr(self.cluster, "ps_move_zone", None) is not None:
            return None
        now = time.time() if now is None else now
        startup = self.planner.startup_s
        if (
            self._ps_moved_at is not None
            and (now - self._ps_moved_at) * self.time_scale < PS_MOVE_SETTLE * startup
        ):
            return None
        remaining = (self.remaining_steps() or 0) * self.step_scale
        if plan.current is not None and plan.current.liveput * startup >= remaining:
            # Done before a new PS host would serve a step: a PS moved 38 steps before the end
            # (round eleven) billed a host for nothing.
            return None
        replacement = getattr(self.cluster, "policy", None)
        zones = list(getattr(replacement, "zones", lambda: [])() or [])
        others = {region_of(z): z for z in reversed(zones) if region_of(z) != region_of(here)}
        best: tuple[str, Plan] | None = None
        try:
            for zone in others.values():
                self.planner.ps_zone = zone
                there = self.recommend(now)
                rival = best[1] if best else plan
                if there is not None and self.better(there, there.chosen, rival.chosen):
                    best = (zone, there)
        finally:
            self.planner.ps_zone = here
        return best

    async def adapt(self) -> Plan | None:
        """One round: read the log, decide, and change the cluster when it is worth it."""
        self.observe(list(event_log(self.cluster)))
        self.save_history()
        plan = self.recommend()
        if plan is None:
            return None
        move = None if self.settling() else self.ps_move(plan)
        if move is not None:
            zone, plan = move
            # Said in the reason, and acted on below as any change (mix, zones, shards).
            plan.reason = f"PS moved to {zone}: " + plan.reason
            self.cluster.move_ps(zone, reason=plan.reason)
            self.planner.ps_zone = zone
            self._ps_moved_at = time.time()
        act = (move is not None or self.worth_changing(plan)) and not self.settling()
        if act:
            shards = plan.chosen.config.shards
            if shards > self._shards():
                # A PS host first: the run splits its PS once the host has joined.
                self.cluster.scale_ps(shards)
            prefer = getattr(getattr(self.cluster, "policy", None), "prefer_zone", None)
            if prefer is not None:
                # New workers of each type (and replacements) go where the plan put them; the
                # ones already running stay until they are preempted or given back.
                for gpu, zone in self.zones_of(plan).items():
                    prefer(gpu, zone)
            if self._weighs_on_demand():
                self.cluster.scale(self.mix_of(plan), on_demand=self._on_demand_asked(plan))
            else:
                self.cluster.scale(self.mix_of(plan))
            self._acted_at = time.time()
        self.last = plan
        changed = self._changed_view(plan)
        if act or changed:
            await self.cluster._post("policy-decision", **self.decision_fields(plan, act))
        return plan

    @property
    def remembered_h(self) -> float:
        """Hours of Spot workers' places the history gave the planner (aged): 0 without one."""
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

    def save_history(self, now: float | None = None) -> None:
        """Keep what this run saw in the policy's history file (when it has one)."""
        if self.history is None:
            return
        seen = self.observations(now)
        if seen:
            try:
                self.history.save(seen, now)
            except OSError:  # a full disk must not stop the policy: the next round tries again
                logger.warning("Could not save the policy's history to %s", self.history.path)

    def _changed_view(self, plan: Plan) -> bool:
        # Post the first decision, and one whenever the expected finish moves by over 10%.
        before = self._posted_eta
        eta = plan.chosen.eta_s
        if before is None or not math.isfinite(before) or abs(eta - before) > 0.1 * before:
            self._posted_eta = eta
            return True
        return False

    # -- running it -----------------------------------------------------------------------------------
    def start(self) -> None:
        """Decide every ``interval`` on the cluster's event loop until :meth:`stop`."""
        loop = self.cluster.loop
        loop.add_callback(self._start)

    async def _start(self) -> None:
        await self._announce(self.goal)
        self._task = asyncio.ensure_future(self._loop())

    async def _announce(self, goal: str | None) -> None:
        # The views (panel, dashboard) show which goal is on, and drop a stopped policy's plan.
        try:
            await self.cluster._post(
                "policy",
                goal=goal,
                deadline_s=self.deadline_s if goal else None,
                budget=self.budget if goal else None,
                history=str(self.history.path) if goal and self.history else None,
                remembered_h=round(self.remembered_h, 3) if goal else None,
            )
        except Exception:  # the scheduler may be closing with the cluster
            logger.debug("could not post 'policy' for %s", self.goal, exc_info=True)

    async def _loop(self) -> None:
        while True:
            try:
                await self.adapt()
            except Exception:  # a bad round must not end the policy: log it, go on
                logger.exception("Policy round of %s failed", getattr(self.cluster, "name", "?"))
            await asyncio.sleep(self.interval_s)

    def stop(self, announce: bool = True) -> None:
        """Stop deciding (the cluster keeps its current mix); ``announce`` it in the event log."""
        task = self._task
        if task is not None:
            self.save_history()
            self.cluster.loop.add_callback(task.cancel)
            self._task = None
            if announce:
                self.cluster.loop.add_callback(self._announce, None)


def _history(cluster: Any, history: str | os.PathLike[str] | bool | None) -> PolicyHistory | None:
    """The policy's history file: ``history`` (a path; True: the configured one, else
    ``~/.transient_nb/policy-history.json``; False: none), else ``policy.history`` from the
    configuration (null: none), kept for the cluster's backend."""
    if history is None:
        history = config.get("policy.history")
    if history is None or history is False:
        return None
    if history is True:
        history = config.get("policy.history") or DEFAULT_HISTORY
    if not isinstance(history, (str, os.PathLike)) or not os.fspath(history).strip():
        raise ValueError(
            f"history={history!r}: give the path of a history file, True for "
            f"{DEFAULT_HISTORY}, or False for none."
        )
    half_life = parse_timedelta(config.get("policy.history-half-life"), default="seconds")
    backend = getattr(getattr(cluster, "backend", None), "name", None) or "local"
    return PolicyHistory(history, str(backend), float(half_life or 86400.0))


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
