"""The vocabulary of a run's event log, and readers of run records.

Every event is a flat, msgpack-serialisable dict with at least ``kind`` and ``time`` (wall-clock
UNIX seconds, set by whoever posts it). Events travel on the scheduler under the topic
:data:`TOPIC`; the :class:`~transient_nb.deploy.monitor.TransientMonitor` writes them, one JSON object a
line, to the run record.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from typing import Any

#: Topic under which every transient_nb event is logged on the scheduler.
TOPIC = "transient"
#: Topic of control requests (scale, preempt, stop) sent to the cluster that owns a scheduler.
CONTROL_TOPIC = "transient-control"

#: The stream message a GCE worker's preload sends the scheduler when its metadata server
#: announces a preemption (honoured only for the sender's own VM).
PROVIDER_NOTICE_OP = "transient-provider-notice"

#: The scheduler RPC (a handler the monitor installs) that remote readers call for the log:
#: ``transient_events(since=i)`` returns the events from index ``i`` on. In-process readers (the
#: owning kernel's views) read the monitor's list instead; both go through
#: :func:`transient_nb.eventlog.folds.event_log`. (Live subscribers of :data:`TOPIC` see events as posted,
#: before the monitor names the worker that posted them: the RPC's copy is the one to show.)
EVENTS_RPC = "transient_events"

#: The scheduler RPC of a detached cluster's head that hands the cluster's client a run's trained
#: model: ``transient_export(run=RUN_ID, what="state" | "model")`` (see
#: :class:`transient_nb.deploy.head.Head`).
EXPORT_RPC = "transient_export"

#: Fields every lifecycle event of a VM carries (``VMSpec.event_fields``); ``joined`` and
#: ``left`` also carry the worker's ``address``.
VM_EVENT_FIELDS = (
    "worker",
    "role",
    "gpu",
    "zone",
    "spot",
    "machine",
    "price",
    "price_on_demand",
    "slot",
)

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

#: Every event kind that may be posted under :data:`TOPIC`, with the fields it carries beyond
#: ``kind`` and ``time``. Posting a kind that is not here is a bug: :func:`make_event` refuses it
#: when ``TRANSIENT_NB_STRICT_EVENTS=1`` (the test suite sets it), and a test reads the package's
#: source for every kind it posts.
EVENTS: dict[str, tuple[str, ...]] = {
    # -- VM lifecycle (posted by the cluster for its VMs; joined/left by the monitor) --
    "requested": VM_EVENT_FIELDS,
    "provisioning": VM_EVENT_FIELDS,
    "running": VM_EVENT_FIELDS,
    "joined": (*VM_EVENT_FIELDS, "address"),
    "notice": (*VM_EVENT_FIELDS, "deadline", "source"),
    "left": (*VM_EVENT_FIELDS, "address"),
    "preempted": (*VM_EVENT_FIELDS, "notice", "source"),
    "deleted": VM_EVENT_FIELDS,
    # -- the cluster --
    "started": (
        "cluster",
        "backend",
        "time_scale",
        "catalog",
        "catalog_date",
        "preemption",
        "gpu",
        "zone",
        "zones",  # the zones it may use: its own, then its fallback zones
        "spot",
        "workers",
        "mix",  # GPU type -> workers asked for ({"k80": 2, "v100": 1}); gpu: the main type
        "notice_s",
        "run_record",
        "scheduler_address",
    ),
    "replacement-requested": ("worker", "role", "slot", "gpu"),  # gpu: the type asked for
    # replace_at="ahead": a spare for ``worker``, whose revocation within lead_s has these odds.
    "spare-requested": ("worker", "role", "gpu", "odds", "age_s", "lead_s"),
    "stockout": ("worker", "gpu", "zone", "reason"),
    "capacity-exhausted": ("role", "gpu", "zone", "reason"),
    # The provider refused a VM for a quota (the cluster tries elsewhere or gives up).
    "quota-exceeded": ("worker", "role", "gpu", "zone", "quota", "region", "limit", "message"),
    "provision-failed": ("worker", "role", "zone", "error"),  # creating a VM failed otherwise
    # A VM the cluster's limits did not allow (max_workers, max_hourly_cost): none was created.
    "limit-refused": ("role", "gpu", "limit", "reason"),
    # VMs of one role failed in a row: the next attempt waits ``delay_s``.
    "crash-loop": ("role", "failures", "delay_s", "reason"),
    # A VM ran without its worker joining: it is deleted (``cost``: what it cost meanwhile).
    "join-timeout": (*VM_EVENT_FIELDS, "waited_s", "cost"),
    # The GPU workers the cluster now keeps, in all and per type, and how many of a type on demand.
    "scale": ("workers", "mix", "on_demand"),
    "ps-hosts": ("hosts", "hosts_from"),  # the PS hosts the cluster now keeps (scale_ps)
    # move_ps: new PS hosts asked for in ``zone``; the old ones (``hosts``) go once the run moved.
    "ps-move": ("zone_from", "zone", "hosts", "reason"),
    # A move that could not be made (no PS host could be started in ``zone``): nothing changed.
    "ps-move-failed": ("zone", "reason"),
    # The owning cluster's answer to a control request (``request`` is the request's id).
    "control": ("action", "ok", "error", "request", "run"),  # ``run``: a head's train/run-stop
    # A control message the monitor refused (e.g. a provider notice not sent by that VM itself).
    "control-refused": ("action", "vm", "sender"),
    # A cluster-level money or time limit stopped the cluster.
    "limit-reached": ("reason", "cost", "budget", "deadline_s"),
    "closed": ("cluster",),
    # Scale-down gave this worker back: it was not working yet, or the likeliest to be revoked.
    # ``spot``: False for an on-demand worker swapped for a Spot one (scale's ``on_demand``).
    "give-back": ("worker", "gpu", "working", "p_revoked_1h", "spot"),
    # A transient-aware policy was turned on with a goal, or off (goal None).
    # history: the policy's memory file, what earlier runs saw (None: none); remembered_h: the
    # hours of Spot workers' places it holds (aged), what the policy starts from beside the
    # paper's priors. The field keeps its name "history" although the policy now calls the file
    # its memory (transient_nb.policy.memory): events are persisted, their vocabulary does not
    # change.
    "policy": ("goal", "deadline_s", "budget", "history", "remembered_h"),
    # The transient-aware policy (transient_nb.policy.adaptive) chose a mix, acted on it or not, and why.
    "policy-decision": (
        "goal",
        "workers",
        "shards",
        "liveput",
        "hourly",
        "eta_s",
        "expected_cost",
        "feasible",
        "reason",
        "acted",
        "mix",
        "on_demand",  # GPU type -> how many of the mix's workers of that type run on demand
        "zones",  # GPU type -> the zone its new workers go to first
        "remaining_steps",
        "p_lose_1h",
        "ps_capacity",  # global steps/s the plan's PS shards serve at most (None: unbounded)
        "ps_bottleneck",  # in the last metrics window the PS served less than was pushed
        "ps_zone",  # where the plan has the PS (a move says "PS moved to ZONE" in its reason)
        # "gpu@zone" of each Spot kind -> [fraction of the time a worker is expected up, the
        # model's own figure before what was observed]
        "availability",
        "startup_s",  # seconds a new worker is expected to take from its request to training
        "load_s",  # of them, from its VM running (lived out of a Spot VM's lifetime)
    ),
    # -- workers --
    "drained": ("worker", "hooks", "seconds", "errors"),  # drain hooks ran after a notice
    # -- the training run (every one also carries ``run``; the PS's also ``shard``) --
    "train-started": (
        "run",
        "model",
        "data",
        "steps",
        "batch_size",
        "shards",
        "elastic_shards",  # the run follows new PS hosts (train() without shards=)
        "parameters",
        "hparams",
        "checkpoint_url",
        "target_accuracy",
        "budget",
        # A resumed run (train(..., resume=...)): the record or checkpoint URL it continues, the
        # checkpoint's step it goes on from, and the steps since the last one known there.
        "resumed_from",
        "resumed_step",
        "steps_lost",
        # A user's own workload (train(model=Net, loss=..., ...)); absent for the built-in ones:
        # what rebuilds the model anywhere (a built-in name or an import path; None: it travelled
        # by value), the loss, the metrics' names, the optimizer, frozen parameters, and the
        # stop conditions (JSON: metric -> [">=" or "<=", value]).
        "model_ref",
        "loss",
        "metrics",
        "optimizer",
        "frozen_parameters",
        "stop_at",
        # ... and what the policy plans it from: FLOPs per sample of a training step and the
        # operators a step runs (transient_nb.training.estimate).
        "flops_per_sample",
        "operators",
    ),
    "metrics": (
        "run",
        "shard",
        "step",
        "loss",
        "lr",
        "active_workers",
        "staleness",
        "img_per_s",
        "steps_per_s",
        "updates",
    ),
    "worker-metrics": ("run", "worker", "step", "img_per_s", "local_step", "device"),
    # metrics: every metric's value (a user's workload; the built-in ones have accuracy alone).
    "eval": ("run", "step", "accuracy", "test_loss", "metrics"),
    "checkpoint": ("run", "step", "path", "seconds"),  # all shards at one step, manifest written
    "ps-lost": ("run", "step", "address", "addresses"),  # addresses: every shard host
    "ps-recovered": ("run", "step", "steps_lost", "seconds", "generation", "source"),
    # An elastic run split its PS into one shard per PS host, from the PS's own state.
    "ps-resharded": (
        "run",
        "shards_from",
        "shards",
        "step",
        "steps_lost",
        "seconds",
        "generation",
        "addresses",
    ),
    # The run moved its PS to the cluster's new PS hosts (move_ps), from the PS's own state.
    "ps-moved": (
        "run",
        "zone_from",
        "zone",
        "step",
        "steps_lost",
        "seconds",
        "generation",
        "addresses",
    ),
    "ps-rejoined": ("run", "worker", "generation", "step"),  # a trainer is back after a slow call
    "trainer-ps-lost": ("run", "worker", "step", "error"),  # a trainer lost its PS mid-push
    "gradient-lost": ("run", "worker", "step"),  # a worker died with a gradient in flight
    "trainer-failed": ("run", "worker", "error", "attempt", "gave_up"),
    "trainer-restarted": ("run", "worker", "attempt", "delay_s"),
    # A trainer (or PS shard) paces itself to an emulated GPU (or PS): its rates in simulated
    # and in wall-clock steps/s (transient_nb.training.emulation).
    "emulation-paced": (
        "run",
        "worker",
        "role",
        "shard",
        "gpu",
        "steps_per_s",
        "wall_steps_per_s",
        "time_scale",
        "step_scale",
        # A user's model: where its rate comes from (one given for it, or none measured: the
        # paper's ResNet-32 rates are never used for it).
        "basis",
    ),
    # The host could not keep an emulated pace: its own work per step was slower (wall rates).
    "emulation-behind": (
        "run",
        "worker",
        "role",
        "shard",
        "gpu",
        "target_steps_per_s",
        "achieved_steps_per_s",
        "window_s",
    ),
    "train-finished": (
        "run",
        "reason",  # steps|accuracy|metric|budget|deadline|stopped|error|trainer-failed
        "step",
        "accuracy",
        "wall_s",
        "lost_in_flight",
        "gaps",
        "accepted",
        "trainers",
        "error",
        "checkpoint_step",
        "metrics",  # the newest evaluation's values (a user's workload)
        "stopped_by",  # the stop_at condition met (reason "metric"), e.g. "mae<=0.3"
    ),
}

#: Cluster-level events.
CLUSTER_EVENTS = (
    "started",
    "replacement-requested",
    "spare-requested",
    "stockout",
    "capacity-exhausted",
    "quota-exceeded",
    "provision-failed",
    "limit-refused",
    "crash-loop",
    "join-timeout",
    "scale",
    "ps-hosts",
    "ps-move",
    "ps-move-failed",
    "control",
    "control-refused",
    "limit-reached",
    "policy",
    "policy-decision",
    "give-back",
    "closed",
)
#: Events posted by workers and by the training run (same topic, same log).
TRAINING_EVENTS = (
    "train-started",
    "metrics",
    "worker-metrics",
    "eval",
    "checkpoint",
    "ps-lost",
    "ps-recovered",
    "ps-resharded",
    "ps-moved",
    "ps-rejoined",
    "trainer-ps-lost",
    "gradient-lost",
    "trainer-failed",
    "trainer-restarted",
    "emulation-paced",
    "emulation-behind",
    "train-finished",
)

#: Events after which a VM no longer costs money.
BILLING_ENDS = ("preempted", "deleted")


class UndeclaredEvent(ValueError):
    """An event kind that :data:`EVENTS` does not declare."""


def strict() -> bool:
    """Whether posting an undeclared event kind raises (``TRANSIENT_NB_STRICT_EVENTS=1``).

    An environment variable, not a config key, so that worker processes inherit it.
    """
    return os.environ.get("TRANSIENT_NB_STRICT_EVENTS", "") not in ("", "0")


def check_kind(kind: str) -> None:
    """Raise :class:`UndeclaredEvent` unless ``kind`` is declared in :data:`EVENTS`.

    Examples
    --------
    >>> check_kind("notice")
    >>> check_kind("notise")
    Traceback (most recent call last):
    ...
    transient_nb.eventlog.vocabulary.UndeclaredEvent: Event kind 'notise' is not declared in transient_nb.eventlog.vocabulary.EVENTS: declare it with its fields there first.
    """
    if kind not in EVENTS:
        raise UndeclaredEvent(
            f"Event kind {kind!r} is not declared in transient_nb.eventlog.vocabulary.EVENTS: declare it "
            "with its fields there first."
        )


def make_event(kind: str, **fields: Any) -> dict[str, Any]:
    """An event dict with its ``kind`` and the current wall-clock ``time``.

    In strict mode (:func:`strict`) an undeclared ``kind`` raises :class:`UndeclaredEvent`.

    Examples
    --------
    >>> e = make_event("notice", worker="w-1")
    >>> e["kind"], e["worker"]
    ('notice', 'w-1')
    """
    if strict():
        check_kind(kind)
    event: dict[str, Any] = {"kind": kind, "time": time.time()}
    event.update(fields)
    return event


class ClusterStart:
    """What a cluster's ``started`` event says: the one reader of its fields.

    Built from the event itself (:meth:`of` finds the first one in a log); a log without one
    reads as an empty event (time scale 1, no catalog).

    Examples
    --------
    >>> start = ClusterStart.of([{"kind": "requested"}, {"kind": "started", "time_scale": 120,
    ...                          "catalog": "paper-2019", "gpu": "k80", "workers": 2}])
    >>> start.time_scale, start.catalog, start.mix
    (120.0, 'paper-2019', {'k80': 2})
    >>> ClusterStart.of([]).time_scale
    1.0
    """

    def __init__(self, event: Mapping[str, Any] | None = None):
        self.event: Mapping[str, Any] = event or {}

    @classmethod
    def of(cls, events: Iterable[Any]) -> ClusterStart:
        """The first ``started`` event of ``events`` (anything else in the log is skipped)."""
        return cls(
            next(
                (e for e in events or () if isinstance(e, Mapping) and e.get("kind") == "started"),
                None,
            )
        )

    def __bool__(self) -> bool:
        return bool(self.event)

    def get(self, field: str, default: Any = None) -> Any:
        """Any other field of the event (see :data:`EVENTS`)."""
        return self.event.get(field, default)

    @property
    def time_scale(self) -> float:
        """Simulated seconds per wall second (1 where the event does not say)."""
        return float(self.event.get("time_scale") or 1.0)

    @property
    def catalog(self) -> str | None:
        """The name (or path) of the price catalog the cluster bills with."""
        name = self.event.get("catalog")
        return str(name) if name else None

    @property
    def mix(self) -> dict[str, int]:
        """GPU type -> workers asked for at the start (a one-type cluster's ``gpu`` and
        ``workers`` where no mix is given); {} without an event."""
        mix = self.event.get("mix")
        if mix:
            return {str(g): int(n) for g, n in mix.items()}
        if not self.event:
            return {}
        return {str(self.event.get("gpu")): int(self.event.get("workers") or 0)}

    @property
    def zones(self) -> list[str]:
        """The zones the cluster may use: its own, then its fallback zones."""
        return [str(z) for z in self.event.get("zones") or [self.event.get("zone")] if z]
