"""The driver of a training run: PS, trainers, evaluation, recovery and stop conditions.

:func:`train` checks its inputs, then starts a :class:`TrainingRun` in a background thread of the
client process (the notebook stays usable). The driver creates the PS shards on the ``ps`` worker,
starts a trainer on every GPU worker that joins (replacements too), evaluates the PS's weights
every ``eval_every`` steps, re-creates the PS from its last checkpoint when its host is lost, and
stops at a step count, a target accuracy, a money budget or a deadline, whichever comes first.
Everything it learns goes into the cluster's event log, so the run record alone rebuilds the
curves and the summary.
"""

from __future__ import annotations

import atexit
import copy
import json
import logging
import os
import queue
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from distributed import Client, Variable

from transient_nb import limits
from transient_nb.eventlog.folds import event_log
from transient_nb.eventlog.folds import (
    summarize as summarize,  # re-exported: run records are read with it
)
from transient_nb.eventlog.vocabulary import TOPIC, make_event
from transient_nb.training import checkpoint, export
from transient_nb.training import resume as resuming
from transient_nb.training.checkpoint import Checkpoint
from transient_nb.training.checkpoint import (  # re-exported: the surfaces import them from here
    check_checkpoint_url as check_checkpoint_url,
)
from transient_nb.training.checkpoint import (
    probe_checkpoint_url as probe_checkpoint_url,
)
from transient_nb.training.estimate import count_step
from transient_nb.training.hparams import HParams
from transient_nb.training.optim import optimizer_state
from transient_nb.training.preflight import dumps, payload
from transient_nb.training.ps import ParameterServer, regroup, shard_bounds
from transient_nb.training.spec import (
    check_train_args as check_train_args,  # re-exported: the surfaces import it from here
)
from transient_nb.training.spec import check_workload, stop_conditions
from transient_nb.training.spec import reached as metric_reached
from transient_nb.training.trainer import Trainer, decay_mask, flat_layout, get_flat, set_flat
from transient_nb.training.workload import (
    Workload,
    WorkloadPlugin,
    fixed_state,
    load_fixed,
    plugin_name,
)

logger = logging.getLogger(__name__)

#: How often the driver looks at the PS, the trainers and the events (seconds).
POLL_S = 0.25
#: First and longest pause before a failed trainer is restarted (seconds; doubled each time).
TRAINER_BACKOFF_S = 1.0
TRAINER_BACKOFF_MAX_S = 30.0
#: A PS status answer older than this makes the driver check that the PS host is still there.
PS_OVERDUE_S = 1.0
#: Seconds a start waits for one PS host per shard before it places shards on fewer hosts.
PS_HOSTS_GRACE_S = 30.0
#: Bound of setting things up: creating an actor, the first checkpoint (seconds).
SETUP_TIMEOUT_S = 120.0
#: Seconds to read the result of a future that is done (a trainer's creation or end): it is at
#: hand, or never (its worker is gone), and the driver's loop must not wait on it.
RESULT_AT_HAND_S = 1.0
#: Complete checkpoints kept under the run's URL (older ones are deleted).
CHECKPOINTS_KEPT = 2


#: The earlier run's settings with what a resume gave (moved to :func:`.resume.settings`).
_resumed_settings = resuming.settings


def _parse_deadline(deadline: Any) -> float | None:
    """A deadline as UNIX seconds: a duration from now ("2h", 3600) or a datetime.

    Durations are checked by :func:`transient_nb.limits.duration`, as the cluster's own deadline
    is: one rule for money and time limits, whoever sets them.
    """
    if deadline is None:
        return None
    if hasattr(deadline, "timestamp"):
        return float(deadline.timestamp())
    seconds = limits.duration(deadline, "deadline", "2h")
    assert seconds is not None
    return time.time() + seconds


def _shard_states(ck: checkpoint.Checkpoint) -> list[dict[str, Any]]:
    """A checkpoint's shards as the PS takes them: weights, momentum (or a torch optimizer's
    state), statistics on shard 0."""
    return [
        {
            "weights": sh["weights"],
            "momentum": sh.get("momentum"),
            "bn": sh.get("bn") if i == 0 else None,
            "opt": optimizer_state(sh) or None,
        }
        for i, sh in enumerate(ck.shards)
    ]


@dataclass
class _TrainerSlot:
    """One worker's trainer: its actor, the future of its ``run()``, and its restarts."""

    address: str
    attempt: int = 0
    actor: Any = None
    future: Any = None  # of the actor's creation while pending, of ``run()`` once started
    started: bool = False
    not_before: float = 0.0  # monotonic time before which a restart must not be submitted
    generation: int = 0  # the PS generation when its trainer was asked for
    reruns: int = 0  # trainers asked for again after one finished against an older PS


class TrainingRun:
    """An asynchronous PS training run on a :class:`~transient_nb.TransientCluster`.

    Created by :func:`train`; runs in the background. ``history`` and ``summary()`` are computed
    from the cluster's event log.

    The driver watches everything it started: a trainer that raises is reported
    (``trainer-failed``) and restarted with backoff; a worker whose trainer keeps failing is
    given up; when every worker's trainer has been given up, the run stops with that error. The
    PS is declared lost only when its host has left the cluster or it answered nothing for
    ``ps_lost_after_s``; it is then re-created from the newest complete checkpoint. Whatever way
    the driver ends (finished, stopped, an error, the kernel exiting), it stops its trainers and
    releases its PS actors and its Dask Variable, so a later run on the cluster always starts.
    """

    def __init__(
        self,
        cluster: Any,
        model: str,
        data: str,
        hparams: HParams,
        *,
        workload: Workload | None = None,
        stop_at: Mapping[str, tuple[str, float]] | None = None,
        shards: int = 1,
        elastic_shards: bool = False,
        target_accuracy: float | None = None,
        budget: float | None = None,
        deadline: float | None = None,
        checkpoint_url: str | None = None,
        seed: int = 0,
        device: str | None = None,
        resume: resuming.ResumePoint | None = None,
    ):
        self.cluster = cluster
        #: What is trained (the built-in ``model`` on ``data`` unless a workload is given).
        self.workload = workload or Workload(model, data)
        self.model_name = self.workload.model_name
        self.data = self.workload.data_name
        #: Metric -> (">=" or "<=", threshold): the run stops when one is met (``stop_at``).
        self.stop_at = dict(stop_at or {})
        #: The condition that stopped the run (``"mae<=0.3"``), if one did.
        self.stopped_by: str | None = None
        self.hp = hparams
        self.shards = shards
        #: Follow the cluster's PS hosts: when it gains one, split the PS into one more shard.
        self.elastic_shards = elastic_shards
        self.target_accuracy = target_accuracy
        self.budget = budget
        self.deadline = deadline
        # The run's own money and time limits, under the cluster's (which stop the cluster):
        # the same Limits and the same rule, counted from the run's start.
        self.limits = limits.Limits(
            budget=budget, deadline_s=None if deadline is None else deadline - time.time()
        )
        self._limits_t0 = time.monotonic()
        self.seed = seed
        self.device = device
        #: Where a resumed run goes on from (it keeps the earlier run's id and checkpoints).
        self.resume = resume
        self.id = resume.run_id if resume else f"run-{uuid.uuid4().hex[:8]}"
        #: The run's own checkpoint folder: ``checkpoint_url/<id>`` (runs may share the URL
        #: given), the resumed run's folder, or by default the run's folder of the run record
        #: (``checkpoints/<id>``: already its own, so no id is added to it).
        if resume is not None:
            self.checkpoint_url = resume.checkpoint_url
        elif checkpoint_url:
            self.checkpoint_url = checkpoint.run_url(checkpoint_url, self.id)
        else:
            self.checkpoint_url = os.path.join(cluster.run_path, "checkpoints", self.id)
        self.variable = f"transient-ps-{self.id}"
        self.reason: str | None = None
        self.error: BaseException | None = None
        self.step = 0
        self.accuracy: float | None = None
        #: Every metric of the newest evaluation, and its test loss.
        self.metrics: dict[str, float] = {}
        self.test_loss: float | None = None
        self.started = time.time()
        self.finished: float | None = None
        self.status: dict[str, Any] = {}
        #: Gradients lost with workers killed mid-step (at most one per killed worker).
        self.lost_in_flight = 0
        #: Step of the newest complete checkpoint (-1: none yet).
        self.checkpoint_step = -1
        self._stop = threading.Event()
        self._done = threading.Event()
        # Set by what the driver must answer (an event, a trainer at hand, stop): its loop runs
        # then, not at its next poll (a replacement's trainer starts up to 2 polls sooner).
        self._wake = threading.Event()
        self._events: queue.Queue[dict[str, Any]] = queue.Queue()
        self._slots: dict[str, _TrainerSlot] = {}
        self._given_up: dict[str, str] = {}  # worker -> the error it kept failing with
        self._released: list[Any] = []  # futures of ended trainers, released at cleanup
        self._ps: list[Any] = []
        self._ps_futures: list[Any] = []
        #: The hosts of the current PS generation's shards (shard i on the i-th, round robin).
        self._ps_addresses: list[str] = []
        self._ps_zone: str | None = None  # where shard 0 runs (told to the trainers)
        self._ps_left = False
        self._generation = 0
        self._bounds: list[tuple[int, int]] = []
        self._mask = np.zeros(0, dtype=np.uint8)
        self._next_eval = hparams.eval_interval
        self._next_checkpoint = hparams.checkpoint_interval
        self._checkpoint_wanted = threading.Event()
        # Checkpoint attempts started, and the latest one settled (published, or nothing new to
        # publish): run.checkpoint() waits for an attempt started after it was called.
        self._checkpoint_attempts = 0
        self._checkpoint_settled = 0
        self._inflight: dict[str, Any] | None = None  # the checkpoint being written
        self._status_future: Any = None
        self._status_sent = 0.0
        self._ps_answered = time.monotonic()
        self._known_step = 0  # the last step the PS is known to have accepted
        self._unregistering: list[tuple[str, list[Any], float]] = []
        self._eval_model: torch.nn.Module | None = None
        #: The model's layout (export.layout) and what the PS never holds (fixed_state).
        self._layout: list[Any] = []
        self._fixed: dict[str, np.ndarray] = {}
        self._fixed_entry: dict[str, Any] | None = None
        self._optimizer: bytes | None = None  # a torch optimizer for the PS, cloudpickled
        self._plugin: str | None = None  # the workload's worker plugin, once registered
        self._client: Any = None
        self._thread = threading.Thread(target=self._main, name=f"transient-{self.id}", daemon=True)

    # -- public ------------------------------------------------------------------------------------
    def start(self) -> TrainingRun:
        """Start the driver thread (``train()`` does)."""
        # A kernel that exits stops the run first, so no trainer outlives it on a worker.
        atexit.register(self._at_exit)
        self._thread.start()
        return self

    @property
    def done(self) -> bool:
        """True once the run has finished (for whatever reason)."""
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> TrainingRun:
        """Block until the run finishes; re-raises the error that ended it, if any."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"Run {self.id} still going after {timeout} s (step {self.step}).")
        if self.error is not None:
            raise RuntimeError(f"Training run {self.id} failed: {self.error}") from self.error
        return self

    def stop(self, wait: bool = True, timeout: float | None = 120) -> TrainingRun:
        """Stop the run (trainers stop after their current step)."""
        self._stop.set()
        self._wake.set()
        if wait:
            self._done.wait(timeout)
        return self

    def checkpoint(self, timeout: float = 120) -> int:
        """Write a checkpoint now (through the driver, so it never races the automatic ones);
        returns its step."""
        # Not the one being written now (its snapshot may predate this call): a later one.
        wanted = self._checkpoint_attempts + 1
        self._checkpoint_wanted.set()
        deadline = time.monotonic() + timeout
        while self._checkpoint_settled < wanted and not self._done.is_set():
            if time.monotonic() > deadline:
                raise TimeoutError(f"No checkpoint of run {self.id} within {timeout} s.")
            time.sleep(0.05)
        return self.checkpoint_step

    def events(self) -> list[dict[str, Any]]:
        """This run's events and the cluster's lifecycle events, in order."""
        return [dict(e) for e in event_log(self.cluster) if e.get("run") in (None, self.id)]

    @property
    def history(self) -> pd.DataFrame:
        """One row per ``metrics`` event: step, time, loss, test accuracy (last evaluation),
        active workers, staleness, img/s, cost and on-demand cost so far."""
        return resuming.run_history(
            self.events(), t0=self.started, minimum_s=self.cluster.catalog.minimum_s
        )

    def summary(self) -> dict[str, Any]:
        """What the run achieved and what it cost (JSON-friendly)."""
        return resuming.summarize_run(self.events(), self.cluster.catalog.minimum_s)

    def __repr__(self) -> str:
        state = self.reason or ("running" if self._thread.is_alive() else "created")
        acc = f", accuracy {self.accuracy:.3f}" if self.accuracy is not None else ""
        err = f": {self.error}" if self.error is not None else ""
        return f"<TrainingRun {self.id}: {self.model_name} on {self.data}, step {self.step}/{self.hp.steps}{acc}, {state}{err}>"

    # -- the trained model ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, torch.Tensor]:
        """The model's ``state_dict`` with the PS's newest weights and statistics (its newest
        checkpoint once the run has ended), on the CPU: what ``model.load_state_dict`` reads."""
        states = None
        if self._ps and not self._done.is_set():
            try:
                states = [
                    ps.get_state().result(timeout=self.hp.call_timeout_s) for ps in list(self._ps)
                ]
            except Exception as e:  # the PS went meanwhile: its newest checkpoint
                logger.info("Reading the PS for the state dict failed: %r", e)
        if states is None:
            return export.load_state_dict(self.checkpoint_url)
        weights, bn = export.flat_of(states)
        return export.assemble(self._layout, weights, bn, self._fixed)

    def model(self) -> torch.nn.Module:
        """The user's network with the PS's newest weights and buffers, on the CPU, in eval mode
        (call ``.train()`` to train it further)."""
        return export.model_with(self.workload.build_model(), self.state_dict(), f"run {self.id}")

    def save(self, path: str) -> str:
        """Write :meth:`state_dict` with ``torch.save`` (a path or an fsspec URL); returns the
        path. ``model.load_state_dict(torch.load(path))`` reads it."""
        return export.save(self.state_dict(), path)

    # -- the driver thread --------------------------------------------------------------------------
    def _post(self, kind: str, **fields: Any) -> None:
        self._client.log_event(TOPIC, make_event(kind, run=self.id, **fields))

    def _at_exit(self) -> None:
        if not self._done.is_set():
            self.stop(wait=True, timeout=self.hp.call_timeout_s + 10)

    def _main(self) -> None:
        try:
            # Talk to actors directly, not through the scheduler (measured: 1.55 vs 2.2 ms a call).
            self._client = Client(self.cluster, set_as_default=False, direct_to_workers=True)
            self._client.subscribe_topic(TOPIC, self._on_event)
            with self._client.as_current():  # actor handles in this thread find this client
                try:
                    self._run()
                finally:
                    self._cleanup()
        except BaseException as e:  # the run ends; the notebook learns why from .error
            logger.exception("Training run %s failed", self.id)
            if self.error is None:
                self.error = e
            self.reason = self.reason if self.reason == "trainer-failed" else "error"
            self._post_safely(
                "train-finished",
                reason=self.reason,
                step=self.step,
                error=str(self.error)[:500],
                accuracy=self.accuracy,
                wall_s=time.time() - self.started,
                lost_in_flight=self.lost_in_flight,
            )
        finally:
            self.finished = time.time()
            try:
                self._client.unsubscribe_topic(TOPIC)
                self._client.close()
            except Exception:
                pass
            atexit.unregister(self._at_exit)
            self._done.set()

    def _post_safely(self, kind: str, **fields: Any) -> None:
        try:
            self._post(kind, **fields)
        except Exception:
            logger.info("Could not post %s for run %s", kind, self.id)

    def _zone_of(self, address: str) -> str | None:
        """The zone of the VM behind a worker's address (the cluster's record of it), else the
        cluster's zone: trainers are told where the PS is (a paced trainer in another region
        steps slower, as the paper measured)."""
        name = ((self._workers() or {}).get(address) or {}).get("name")
        vm = (getattr(self.cluster, "workers", None) or {}).get(name)
        zone = getattr(getattr(vm, "spec", None), "zone", None) or getattr(
            self.cluster, "zone", None
        )
        return str(zone) if zone else None

    def _on_event(self, event: Any) -> None:
        # A topic message ``(time, event)``: handled by the driver's loop, woken now.
        self._events.put(event[1])
        self._wake.set()

    def _workers(self) -> dict[str, dict[str, Any]] | None:
        """The scheduler's workers, or None when they cannot be read right now (never ``{}``
        for "unknown": an empty listing must not look like a lost PS host)."""
        try:
            info = self._client.scheduler_info(n_workers=-1)
        except Exception:
            return None
        return dict(info.get("workers", {}))

    def _run(self) -> None:
        torch.manual_seed(self.seed)
        init = self.workload.build_model()
        params, buffers = flat_layout(init)
        w0, bn0, self._mask = get_flat(params), get_flat(buffers), decay_mask(init)
        self._layout = export.layout(init)
        self._fixed = fixed_state(init)
        if not isinstance(self.workload.optimizer, str):
            self._optimizer = dumps(self.workload.optimizer, "optimizer")
        self._ship_workload()
        self._bounds = shard_bounds(len(w0), self.shards)
        states: list[dict[str, Any]] = [
            {"weights": w0[a:b], "momentum": None, "bn": bn0 if i == 0 else None}
            for i, (a, b) in enumerate(self._bounds)
        ]
        start, counters, resumed = 0, None, {}
        if self.resume is not None:
            states, start, counters = self._resume_states(len(w0))
            last = self.resume.last_step
            resumed = {
                "resumed_from": self.resume.record or self.resume.checkpoint_url,
                "resumed_step": start,
                "steps_lost": max(0, (last if last is not None else start) - start),
            }
        # A user's workload says what it is; the built-in runs' start reads as it always did.
        described = {} if self.workload.builtin else self.workload.describe()
        if described:
            del described["model"], described["data"]
            described["model_ref"] = self.workload.model_ref
            described["frozen_parameters"] = sum(
                p.numel() for p in init.parameters() if not p.requires_grad
            )
            # What the policy plans a user's model from (not ResNet-32's figures): its FLOPs
            # per sample and operators per step, counted on a copy (BN statistics move).
            flops, operators = count_step(self.workload, copy.deepcopy(init))
            described["flops_per_sample"], described["operators"] = flops, operators
        if self.stop_at:
            described["stop_at"] = json.dumps(self.stop_at)
        self._post(
            "train-started",
            **described,
            model=self.model_name,
            data=self.data,
            steps=self.hp.steps,
            batch_size=self.hp.batch_size,
            shards=self.shards,
            elastic_shards=self.elastic_shards,
            parameters=len(w0),
            hparams=json.dumps(self.hp.to_dict()),
            checkpoint_url=self.checkpoint_url,
            target_accuracy=self.target_accuracy,
            budget=self.budget,
            **resumed,
        )
        self._create_ps(states, step=start, counters=counters)
        if self.resume is None:
            self._checkpoint_now()  # step 0: the PS can always be re-created
        else:
            self.step = self._known_step = self.checkpoint_step = start
            self._next_eval = (start // self.hp.eval_interval + 1) * self.hp.eval_interval
            self._next_checkpoint = (
                start // self.hp.checkpoint_interval + 1
            ) * self.hp.checkpoint_interval
        for addr, info in (self._workers() or {}).items():
            if "gpu" in info.get("resources", {}):
                self._want_trainer(str(info["name"]), addr)
        while True:
            self._handle_events()
            self._watch_trainers()
            self._submit_trainers()
            self._poll_unregistering()
            self._poll_checkpoint()
            self._poll_status()
            if self._ps_lost():
                self._recover()
                continue
            if self._wants_more_shards():
                self._reshard(self._ps_host_count())
                continue
            hosts = self._ps_move_hosts()
            if hosts:
                self._move_ps(hosts)
                continue
            if self.step >= self._next_eval:
                self._evaluate()
                self._next_eval = (self.step // self.hp.eval_interval + 1) * self.hp.eval_interval
            if self._inflight is None and (
                self.step >= self._next_checkpoint or self._checkpoint_wanted.is_set()
            ):
                self._checkpoint_wanted.clear()
                self._start_checkpoint()
            reason = self._stop_reason()
            if reason:
                self._finish(reason)
                return
            self._wake.wait(POLL_S)
            self._wake.clear()

    def _stop_reason(self) -> str | None:
        if self._stop.is_set():
            return "stopped"
        if self.step >= self.hp.steps:
            return "steps"
        if (
            self.target_accuracy is not None
            and self.accuracy is not None
            and self.accuracy >= self.target_accuracy
        ):
            return "accuracy"
        if self.stop_at:
            hit = metric_reached(self.stop_at, {**self.metrics, "test_loss": self.test_loss})
            if hit is not None:
                self.stopped_by = hit
                return "metric"
        if self.limits.budget is not None or self.limits.deadline_s is not None:
            spent = self.cluster.cost().total if self.limits.budget is not None else 0.0
            reached = self.limits.reached(spent, time.monotonic() - self._limits_t0)
            if reached is not None:
                return reached
        if self._given_up and not self._slots:
            # Every worker's trainer kept failing: nothing trains, the GPUs only bill.
            errors = sorted(set(self._given_up.values()))
            self.error = RuntimeError(
                f"Every trainer kept failing ({len(self._given_up)} worker(s), "
                f"{self.hp.trainer_restarts} restarts each): {'; '.join(errors)}"
            )
            return "trainer-failed"
        return None

    # -- PS ---------------------------------------------------------------------------------------------
    def _poll_status(self) -> None:
        """Ask the PS for its counters without blocking the loop on a slow PS."""
        now = time.monotonic()
        fut = self._status_future
        if fut is not None and fut.done():
            self._status_future = None
            try:
                self.status = fut.result(timeout=RESULT_AT_HAND_S)
            except Exception as e:
                logger.info("PS status failed: %r", e)
                return
            self._ps_answered = now
            self.step = int(self.status["step"])
            self._known_step = max(self._known_step, self.step)
        elif fut is not None and now - self._status_sent > self.hp.call_timeout_s:
            logger.warning("PS status: no answer within %.0f s", self.hp.call_timeout_s)
            self._status_future = None  # ask again; _ps_lost decides when it is lost
        if self._status_future is None and self._ps:
            try:
                self._status_future = self._ps[0].status()
                self._status_sent = now
            except Exception as e:
                # The scheduler marked the actor's task erred: its worker is gone for sure.
                logger.info("PS status not sent: %r", e)
                self._ps_left = True

    def _ps_lost(self) -> bool:
        """Lost means gone: its host left the cluster, or it answered nothing for a while."""
        if self._ps_left:
            return True
        silent = time.monotonic() - self._ps_answered
        if silent <= PS_OVERDUE_S:
            return False
        # Overdue: is its host still a member? (A call to a killed host can hang rather than
        # fail, so waiting for the call alone took up to call_timeout_s: measured 31 s.)
        workers = self._workers()
        if workers is not None and any(a not in workers for a in self._ps_addresses):
            return True  # a confirmed listing without a PS host
        return silent > self.hp.ps_lost_after_s

    def _ps_host_count(self) -> int:
        return max(1, int(getattr(self.cluster, "ps_hosts", 1) or 1))

    def _wants_more_shards(self) -> bool:
        """An elastic run whose cluster has more PS hosts than it has shards, all joined."""
        if not self.elastic_shards or self._ps_host_count() <= self.shards:
            return False
        joined = [
            a for a, info in (self._workers() or {}).items() if "ps" in info.get("resources", {})
        ]
        return len(joined) >= self._ps_host_count()

    def _ps_move_hosts(self) -> list[str] | None:
        """The hosts to move the PS to, once the cluster asked for a move
        (:meth:`~transient_nb.TransientCluster.move_ps`: ``ps_move_zone``) and as many of its new
        PS hosts there have joined as the PS has shards; None while there is none to make."""
        zone = getattr(self.cluster, "ps_move_zone", None)
        if not zone or self._ps_zone == zone:
            return None
        hosts = sorted(
            str(addr)
            for addr, info in (self._workers() or {}).items()
            if "ps" in info.get("resources", {})
            and addr not in self._ps_addresses
            and self._zone_of(addr) == zone
        )
        return hosts if len(hosts) >= min(self.shards, self._ps_host_count()) else None

    def _move_ps(self, hosts: list[str]) -> None:
        """Move the PS to ``hosts``, from its own state (as :meth:`_reshard`, with the same
        shards): the trainers follow the new generation, paced for their distance from it."""
        before = self._ps_zone
        done = self._regenerate(self.shards, hosts)
        if done is not None:
            self._post("ps-moved", zone_from=before, zone=self._ps_zone, **done)

    def _reshard(self, shards: int) -> None:
        """Split the PS into ``shards`` shards, one per PS host, from its own state.

        The same move as a recovery (a new generation the trainers follow), from the live PS:
        what is lost is at most the pushes that reach the old shards while their state is read.
        """
        before = self.shards
        done = self._regenerate(shards)
        if done is not None:
            self._post("ps-resharded", shards_from=before, shards=shards, **done)

    def _regenerate(self, shards: int, hosts: list[str] | None = None) -> dict[str, Any] | None:
        """A new PS generation of ``shards`` shards (on ``hosts``, else one per PS host) from
        the live PS's own state; the event's fields, or None when the PS does not answer
        (:meth:`_ps_lost` decides, and the next round tries again)."""
        t0 = time.time()
        self._abandon_checkpoint()
        states = self._old_ps_state()
        if states is None:
            return None
        step = int(states[0]["step"])
        if shards != self.shards:
            self.shards = shards
            self._bounds = shard_bounds(self._bounds[-1][1], shards)
        self._generation += 1
        self._create_ps(
            regroup(states, shards), step=step, counters=states[0]["counters"], hosts=hosts
        )
        done = {
            "step": step,
            "steps_lost": max(0, self._known_step - step),
            "seconds": time.time() - t0,
            "generation": self._generation,
            "addresses": list(dict.fromkeys(self._ps_addresses)),
        }
        self.step = self._known_step = step
        return done

    def _wait_for_ps_hosts(
        self, exclude: set[str], want: int, timeout: float, grace: float
    ) -> list[str]:
        """The PS hosts to place shards on (sorted, at most ``want``), none of ``exclude``.

        Waits for ``want`` hosts, but goes on with fewer (at least one) once ``grace`` seconds
        have passed.
        """
        t0 = time.time()
        while True:
            hosts = sorted(
                str(addr)
                for addr, info in (self._workers() or {}).items()
                if "ps" in info.get("resources", {}) and addr not in exclude
            )
            waited = time.time() - t0
            if len(hosts) >= want or (hosts and waited >= grace):
                return hosts[:want]
            if waited >= timeout:
                raise TimeoutError(f"No PS host joined within {timeout:.0f} s.")
            if self._stop.is_set():
                raise RuntimeError("stopped while waiting for a PS host")
            self._stop.wait(0.1)

    def _resume_states(self, n_params: int) -> tuple[list[dict[str, Any]], int, Any]:
        """The PS shards' states from the newest complete checkpoint of the resumed run."""
        assert self.resume is not None
        ck = self._load_own_checkpoint()
        if ck is None:
            raise RuntimeError(
                f"No complete checkpoint under {self.checkpoint_url} to resume from."
            )
        sizes = [len(sh["weights"]) for sh in ck.shards]
        if sum(sizes) != n_params:
            raise RuntimeError(
                f"The checkpoint at {ck.url} holds {sum(sizes)} parameters; {self.model_name} has "
                f"{n_params}: resume with the model of the earlier run."
            )
        # The earlier run may have gained shards after it started (an elastic PS): the same
        # vector, cut for this run's shards.
        return regroup(_shard_states(ck), self.shards), ck.step, ck.meta.get("counters")

    def _load_own_checkpoint(self) -> Checkpoint | None:
        """The newest complete checkpoint of the run's folder, refused (a ValueError that says
        whose it is) unless it is this run's, of its model and layout: a resume or a PS recovery
        never loads another run's weights."""
        return checkpoint.load_latest(
            self.checkpoint_url,
            run=self.id,
            model=self.workload.model_ref,  # by value, a model's name is not its identity
            layout=self._layout or None,
        )

    def _create_ps(
        self,
        states: list[dict[str, Any]],
        step: int,
        counters: dict[str, Any] | None,
        hosts: list[str] | None = None,
    ) -> None:
        try:
            delay = float(getattr(self.cluster, "provisioning_delay", 0) or 0)
        except (TypeError, ValueError):  # "paper": start-ups drawn from the paper's 81-98 s
            delay = 100.0
        # A start waits (a while) for one host per shard; a recovery takes the hosts there
        # are at once rather than wait out a lost host's replacement: shards then share a
        # host until the next generation.
        recovering = self._generation > 0
        timeout = 120 + 2 * delay
        hosts = hosts or self._wait_for_ps_hosts(
            set(self._ps_addresses) if self._ps_left else set(),
            want=min(self.shards, self._ps_host_count()),
            timeout=timeout,
            grace=0.0 if recovering else min(timeout, PS_HOSTS_GRACE_S),
        )
        futures = [
            self._client.submit(
                ParameterServer,
                self.id,
                i,
                self.shards,
                st["weights"],
                self._mask[a:b],
                st["bn"],
                self.hp.to_dict(),
                self.checkpoint_url,
                version=step,
                momentum=st["momentum"],
                model=self.model_name,
                generation=self._generation,
                counters=counters if i == 0 else None,
                **self._custom_ps_kwargs(st),
                actor=True,
                workers=[hosts[i % len(hosts)]],
                allow_other_workers=False,
                pure=False,
                key=f"ps-{self.id}-g{self._generation}-s{i}",
            )
            for i, (st, (a, b)) in enumerate(zip(states, self._bounds, strict=True))
        ]
        old = self._ps_futures
        # Creating an actor ships its arrays and waits for the scheduler: a setup bound, not a
        # call's.
        self._ps = [f.result(timeout=SETUP_TIMEOUT_S) for f in futures]
        self._ps_futures = futures
        for f in old:  # the previous generation's actors are released from their worker
            f.release()
        self._ps_addresses = [hosts[i % len(hosts)] for i in range(len(self._ps))]
        self._ps_zone = self._zone_of(hosts[0])
        self._ps_left = False
        self._ps_answered = time.monotonic()
        self._status_future = None
        Variable(self.variable, client=self._client).set(
            json.dumps(
                {
                    "generation": self._generation,
                    "shards": [[ps._address, ps.key] for ps in self._ps],
                    # Where the PS runs now: trainers pace for their distance from it.
                    "ps_zone": self._ps_zone,
                }
            )
        )

    def _custom_ps_kwargs(self, state: Mapping[str, Any]) -> dict[str, Any]:
        """What a PS of a user's workload takes beyond the built-in one's: the model's size (an
        emulated PS's service time scales with it), the torch optimizer and its state."""
        if self.workload.builtin:
            return {}
        kwargs: dict[str, Any] = {"parameters": int(self._bounds[-1][1])}
        if self._optimizer is not None:
            kwargs.update(optimizer=self._optimizer, opt_state=state.get("opt"))
        return kwargs

    def _old_ps_state(self) -> list[dict[str, Any]] | None:
        """The old PS's own state, if it still answers (it is fresher than any checkpoint)."""
        if self._ps_left or not self._ps:
            return None
        try:
            return [
                ps.get_state().result(timeout=min(5.0, self.hp.call_timeout_s)) for ps in self._ps
            ]
        except Exception:
            return None

    def _recover(self) -> None:
        lost_at = self._known_step
        self._post(
            "ps-lost",
            step=lost_at,
            address=self._ps_addresses[0] if self._ps_addresses else None,
            addresses=list(dict.fromkeys(self._ps_addresses)),
        )
        t0 = time.time()
        self._abandon_checkpoint()
        states = self._old_ps_state()
        if states is not None:
            # Its handle broke but it answers: move its own state, lose nothing.
            resumed = int(states[0]["step"])
            counters = states[0]["counters"]
            source = "ps"
        else:
            ck = self._load_own_checkpoint()
            if ck is None:
                raise RuntimeError(
                    f"The PS was lost and there is no complete checkpoint under "
                    f"{self.checkpoint_url}: the run cannot go on."
                )
            resumed = ck.step
            counters = ck.meta.get("counters")
            states = _shard_states(ck)
            source = "checkpoint"
        if len(states) != self.shards:
            # Written before the PS gained a shard: the same vector, cut for today's shards.
            states = regroup(states, self.shards)
        self._generation += 1
        self._create_ps(states, step=resumed, counters=counters)
        self._post(
            "ps-recovered",
            step=resumed,
            steps_lost=max(0, lost_at - resumed),
            seconds=time.time() - t0,
            generation=self._generation,
            source=source,
        )
        self.step = resumed
        self._known_step = resumed
        self._next_checkpoint = (
            resumed // self.hp.checkpoint_interval + 1
        ) * self.hp.checkpoint_interval

    # -- checkpoints: every shard at one agreed version, the manifest last --------------------------
    def _start_checkpoint(self, timeout: float | None = None) -> None:
        timeout = timeout or self.hp.call_timeout_s
        self._checkpoint_attempts += 1
        attempt = self._checkpoint_attempts
        try:
            first = self._ps[0].snapshot().result(timeout=timeout)
            step = int(first["step"])
            for ps in self._ps[1:]:
                ps.snapshot(step).result(timeout=timeout)
        except Exception as e:
            logger.info("Checkpoint snapshot failed: %r", e)
            return
        if step <= self.checkpoint_step:
            # Nothing new since the last one (or older): never publish it over a newer one.
            self._next_checkpoint = (
                step // self.hp.checkpoint_interval + 1
            ) * self.hp.checkpoint_interval
            self._inflight = None
            self.checkpoint_step = max(self.checkpoint_step, step)
            self._checkpoint_settled = attempt
            return
        self._inflight = {
            "attempt": attempt,
            "step": step,
            "counters": first["counters"],
            "futures": [ps.write_snapshot(step) for ps in self._ps],
            "t0": time.monotonic(),
        }

    def _poll_checkpoint(self, block: bool = False) -> None:
        job = self._inflight
        if job is None:
            return
        bound = max(120.0, 4 * self.hp.call_timeout_s)  # a slow bucket is not a hang
        if block:
            end = job["t0"] + bound
            while not all(f.done() for f in job["futures"]) and time.monotonic() < end:
                time.sleep(0.02)
        if not all(f.done() for f in job["futures"]):
            if time.monotonic() - job["t0"] > bound:
                logger.warning(
                    "Checkpoint of step %d not written within %.0f s", job["step"], bound
                )
                self._abandon_checkpoint()
            return
        self._inflight = None
        try:
            files = [f.result(timeout=RESULT_AT_HAND_S) for f in job["futures"]]
            path = checkpoint.write_manifest(
                self.checkpoint_url,
                job["step"],
                {
                    "run": self.id,
                    "model": self.model_name,
                    "model_ref": self.workload.model_ref,
                    "optimizer": self.workload.describe()["optimizer"],
                    "data": self.data if isinstance(self.workload.data, str) else None,
                    "layout": self._layout,
                    "fixed": self._fixed_entry,
                    "shards": self.shards,
                    "generation": self._generation,
                    "hparams": self.hp.to_dict(),
                    "counters": job["counters"],
                    "time": time.time(),
                },
                files,
            )
        except Exception as e:
            logger.warning("Checkpoint of step %d failed: %r", job["step"], e)
            return
        self.checkpoint_step = job["step"]
        self._checkpoint_settled = job["attempt"]
        self._next_checkpoint = (
            job["step"] // self.hp.checkpoint_interval + 1
        ) * self.hp.checkpoint_interval
        self._post(
            "checkpoint",
            step=job["step"],
            path=path,
            seconds=time.monotonic() - job["t0"],
        )
        try:
            checkpoint.prune(self.checkpoint_url, keep=CHECKPOINTS_KEPT, run=self.id)
        except Exception as e:  # housekeeping only
            logger.info("Could not prune old checkpoints: %r", e)

    def _abandon_checkpoint(self) -> None:
        self._inflight = None  # its manifest is never written: readers ignore its files

    def _checkpoint_now(self) -> None:
        if self._inflight is not None:
            self._poll_checkpoint(block=True)
        self._start_checkpoint(timeout=max(self.hp.call_timeout_s, SETUP_TIMEOUT_S / 4))
        self._poll_checkpoint(block=True)

    # -- trainers -------------------------------------------------------------------------------------
    def _want_trainer(self, name: str, address: str) -> None:
        if name in self._slots or name in self._given_up:
            return
        self._slots[name] = _TrainerSlot(address=address)

    def _submit_trainers(self) -> None:
        """Ask for a trainer actor on every worker that needs one; never blocks the driver."""
        now = time.monotonic()
        for name, slot in self._slots.items():
            if slot.future is None and now >= slot.not_before:
                slot.generation = self._generation
                rerun = f"-{slot.reruns}" if slot.reruns else ""
                slot.future = self._client.submit(
                    Trainer,
                    self.id,
                    self.model_name,
                    self.data,
                    self.hp.to_dict(),
                    self.variable,
                    self._bounds,
                    seed=self.seed,
                    device=self.device,
                    ps_zone=self._ps_zone,
                    workload="plugin" if self._plugin else None,
                    actor=True,
                    workers=[slot.address],
                    allow_other_workers=False,
                    pure=False,
                    key=f"trainer-{self.id}-{name}-{slot.attempt}{rerun}",
                )
                slot.future.add_done_callback(lambda _: self._wake.set())
            elif slot.future is not None and not slot.started and slot.future.done():
                try:
                    # Done: the actor is at hand, or its worker is gone and asking would wait
                    # out any bound (a storm's revoked workers held the driver 30 s each).
                    slot.actor = slot.future.result(timeout=RESULT_AT_HAND_S)
                except Exception as e:  # the worker went away before its trainer started
                    logger.info("Trainer on %s did not start: %r", name, e)
                    self._trainer_failed(name, slot, e)
                    continue
                self._released.append(slot.future)
                slot.future = slot.actor.run()
                slot.started = True

    def _watch_trainers(self) -> None:
        for name, slot in list(self._slots.items()):
            if not slot.started or not slot.future.done():
                continue
            try:
                result = slot.future.result(timeout=RESULT_AT_HAND_S)
            except Exception as e:
                self._trainer_failed(name, slot, e)
                continue
            if result.get("state") == "drained":
                self._slots.pop(name, None)  # its worker is leaving: the replacement gets one
            elif result.get("state") == "finished" and self._short_of_steps(slot, result):
                # It had the run's steps from a PS that a move, a reshard or a recovery has
                # since replaced with one a few steps short (read before its last pushes): with
                # no trainer left the run would wait for them forever (a PS moved 3 steps
                # before the end, round eleven). A new trainer, no failure.
                self._released.append(slot.future)
                slot.reruns += 1
                slot.actor, slot.future, slot.started = None, None, False
                self._post("trainer-restarted", worker=name, attempt=slot.attempt, delay_s=0.0)
            elif result.get("state") != "finished" and not self._stop.is_set():
                self._trainer_failed(
                    name, slot, RuntimeError(f"trainer ended early ({result.get('state')})")
                )

    def _short_of_steps(self, slot: _TrainerSlot, result: Mapping[str, Any]) -> bool:
        """Whether the run still needs steps from a PS newer than the one ``slot``'s trainer
        finished against (its counters' ``generation``)."""
        last = int(result.get("generation", slot.generation))
        return last < self._generation and self.step < self.hp.steps and not self._stop.is_set()

    def _trainer_failed(self, name: str, slot: _TrainerSlot, error: BaseException) -> None:
        text = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:300]
        slot.attempt += 1
        gave_up = slot.attempt > self.hp.trainer_restarts
        self._post("trainer-failed", worker=name, error=text, attempt=slot.attempt, gave_up=gave_up)
        logger.warning("Trainer on %s failed (attempt %d): %s", name, slot.attempt, text)
        if slot.future is not None:
            self._released.append(slot.future)
        if gave_up:
            self._slots.pop(name, None)
            self._given_up[name] = text
            logger.warning(
                "Worker %s gave up after %d failed trainers; it stays idle (scale it away): %s",
                name,
                slot.attempt,
                text,
            )
            return
        delay = min(TRAINER_BACKOFF_MAX_S, TRAINER_BACKOFF_S * 2 ** (slot.attempt - 1))
        slot.actor, slot.future, slot.started = None, None, False
        slot.not_before = time.monotonic() + delay
        self._post("trainer-restarted", worker=name, attempt=slot.attempt, delay_s=delay)

    def _handle_events(self) -> None:
        while True:
            try:
                e = self._events.get_nowait()
            except queue.Empty:
                return
            kind, name, role = e.get("kind"), e.get("worker"), e.get("role")
            if kind == "metrics" and e.get("run") == self.id:
                self._known_step = max(self._known_step, int(e.get("step", 0)))
            elif kind == "joined" and role == "worker" and name:
                self._want_trainer(str(name), str(e.get("address")))
            elif (
                kind == "left"
                and e.get("address") is not None
                and e.get("address") in self._ps_addresses
            ):
                self._ps_left = True  # the scheduler removed a PS host: gone for sure
            elif kind in ("left", "preempted") and role == "worker" and name in self._slots:
                slot = self._slots.pop(str(name))
                if slot.future is not None:
                    self._released.append(slot.future)
                if slot.started and self._ps:
                    # Did its worker die holding weights it was computing on? The PS knows.
                    try:
                        futures = [ps.unregister(name, False) for ps in self._ps]
                    except Exception as ex:  # the PS went too: its recovery counts nothing
                        logger.info("Could not unregister %s: %r", name, ex)
                        continue
                    self._unregistering.append((str(name), futures, time.monotonic()))

    def _poll_unregistering(self) -> None:
        keep = []
        for name, futures, t0 in self._unregistering:
            if not futures[0].done():
                if time.monotonic() - t0 < self.hp.call_timeout_s:
                    keep.append((name, futures, t0))
                continue
            try:
                lost = bool(futures[0].result(timeout=RESULT_AT_HAND_S))
            except Exception:
                lost = False
            if lost:
                self.lost_in_flight += 1
                self._post("gradient-lost", worker=name, step=self.step)
        self._unregistering = keep

    # -- evaluation and the end -------------------------------------------------------------------------
    def _evaluate(self) -> float | None:
        try:
            states = [ps.get_state().result(timeout=self.hp.call_timeout_s) for ps in self._ps]
        except Exception as e:
            logger.info("Evaluation skipped: %r", e)
            return None
        if self._eval_model is None:
            self._eval_model = self.workload.build_model()
            if not self.workload.builtin:
                load_fixed(self._eval_model, self._fixed)
        model = self._eval_model
        params, buffers = flat_layout(model)
        set_flat(
            params, np.concatenate([np.asarray(s["weights"], dtype=np.float32) for s in states])
        )
        if states[0]["bn"] is not None and buffers:
            set_flat(buffers, np.asarray(states[0]["bn"]))
        metrics, loss = self.workload.evaluate(model, limit=self.hp.eval_images)
        self.metrics, self.test_loss = metrics, float(loss)
        acc = metrics.get("accuracy")
        self.accuracy = None if acc is None else float(acc)
        extra = {} if self.workload.builtin else {"metrics": metrics}
        self._post(
            "eval",
            step=int(states[0]["step"]),
            accuracy=self.accuracy,
            test_loss=float(loss),
            **extra,
        )
        return self.accuracy

    def _stop_trainers(self) -> list[dict[str, Any]]:
        """Stop every trainer and wait for them, all within one bound; returns their counters."""
        for slot in self._slots.values():
            if slot.started and slot.actor is not None:
                try:
                    slot.actor.stop()
                except Exception:
                    pass
        # One deadline for all: a trainer whose worker just died never answers.
        deadline = time.monotonic() + max(self.hp.call_timeout_s, 15.0)
        results = []
        for name, slot in list(self._slots.items()):
            if not slot.started:
                continue
            while not slot.future.done() and time.monotonic() < deadline:
                time.sleep(0.02)
            try:
                if slot.future.done():
                    results.append(slot.future.result(timeout=RESULT_AT_HAND_S))
            except Exception as e:
                logger.info("Trainer on %s ended with %r", name, e)
        return results

    def _finish(self, reason: str) -> None:
        self.reason = reason
        results = self._stop_trainers()
        try:
            self.status = self._ps[0].status().result(timeout=self.hp.call_timeout_s)
            self.step = int(self.status["step"])
        except Exception:
            pass
        evaluated = (reason == "accuracy" and self.accuracy is not None) or (
            reason == "metric" and self.metrics
        )
        if not evaluated:
            self._evaluate()
        try:
            self._checkpoint_now()
        except Exception as e:
            logger.warning("Final checkpoint failed: %r", e)
        if reason == "trainer-failed":
            raise self.error or RuntimeError("trainers failed")
        self._post(
            "train-finished",
            reason=reason,
            step=self.step,
            accuracy=self.accuracy,
            wall_s=time.time() - self.started,
            lost_in_flight=self.lost_in_flight,
            gaps=self.status.get("gaps"),
            accepted=json.dumps(self.status.get("accepted", {})),
            trainers=json.dumps(results, default=str),
            checkpoint_step=self.checkpoint_step,
            **({} if self.workload.builtin else {"metrics": self.metrics}),
            stopped_by=self.stopped_by,
        )

    def _cleanup(self) -> None:
        """Every exit path: stop the trainers, release the PS and trainer actors and the
        Variable, so nothing of this run is left on the cluster."""
        self._stop.set()
        try:
            self._stop_trainers()
        except Exception as e:
            logger.info("Stopping trainers: %r", e)
        for slot in self._slots.values():
            if slot.future is not None:
                self._released.append(slot.future)
        self._slots.clear()
        for fut in [*self._released, *self._ps_futures]:
            release = getattr(fut, "release", None)  # actor-call futures hold nothing
            try:
                if release is not None:
                    release()
            except Exception:
                pass
        self._released, self._ps_futures, self._ps = [], [], []
        try:
            Variable(self.variable, client=self._client).delete()
        except Exception as e:
            logger.info("Could not delete %s: %r", self.variable, e)
        if self._plugin is not None:
            try:
                self._client.unregister_worker_plugin(self._plugin)
            except Exception as e:
                logger.info("Could not unregister %s: %r", self._plugin, e)
            self._plugin = None

    def _ship_workload(self) -> None:
        """Write what the PS never holds beside the checkpoints; send a user's workload to every
        worker once, present and future (a worker plugin), with those fixed arrays."""
        self._fixed_entry = checkpoint.write_fixed(self.checkpoint_url, self._fixed)
        if self.workload.builtin:
            return  # trainers build the built-in model and data by name, as ever
        name = plugin_name(self.id)
        plugin = WorkloadPlugin(payload(self.workload), self._fixed)
        try:
            self._client.register_plugin(plugin, name=name)
        except OSError as e:  # a worker went during the broadcast: the others have it
            logger.info("Registering the workload: %r", e)
        self._plugin = name


def train(
    cluster: Any,
    model: Any = None,
    data: Any = None,
    steps: int | None = None,
    *,
    loss: Any = None,
    metrics: Any = None,
    optimizer: Any = None,
    stop_at: Mapping[str, Any] | None = None,
    collate_fn: Any = None,
    num_workers: int | None = None,
    resume: str | None = None,
    shards: int | None = None,
    target_accuracy: float | None = None,
    budget: float | None = None,
    deadline: Any = None,
    checkpoint_url: str | None = None,
    seed: int = 0,
    device: str | None = None,
    wait: bool = False,
    **hparams: Any,
) -> TrainingRun:
    """Train ``model`` on ``data`` with asynchronous PS training on ``cluster``.

    Every input is checked before anything starts (:func:`~transient_nb.training.spec.preflight`:
    the model is built, the data and the callables travel through a serialisation round trip,
    and one batch runs forward and backward through the loss and the metrics). The run goes on in
    the background; use ``run.wait()``, ``run.stop()``, ``run.history``, ``run.summary()``, and
    at the end ``run.model()``, ``run.state_dict()`` or ``run.save(path)``.

    Parameters
    ----------
    cluster
        A running :class:`~transient_nb.TransientCluster`, or a detached cluster's handle
        (:class:`~transient_nb.deploy.remote.RemoteCluster`): its head then runs the training, and
        what comes back is a :class:`~transient_nb.deploy.remote_run.RemoteRun`.
    model
        ``"resnet32"`` (the default: canonical, 0.46M), ``"resnet32-t2t"`` (the paper's, 1.86M),
        ``"resnet20"``, ``"resnet8"``; or your own: an ``nn.Module`` instance (its weights are
        the start: fine-tuning), a zero-argument factory (a class, a function of a notebook
        cell), or an import path ``"package.module:attr"``. Parameters with
        ``requires_grad=False`` are never updated.
    data
        ``"synthetic"`` (the default), ``"digits"`` or ``"cifar10:PATH-OR-URL"``; or your own
        ``(train, test)`` pair of map-style Datasets of ``(input, target)`` items (sent once to
        each worker; above 200 MB pickled, pass a factory), a zero-argument factory that returns
        the pair where it runs (each worker, and here), or an import path.
    steps
        Global steps (accepted pushes) to train for (default: HParams' 64,000).
    loss
        ``"cross_entropy"`` (the default), ``"mse"``, or ``(output, target) -> scalar tensor``.
    metrics
        Name -> ``(output, target) -> float`` (averaged over the test set, weighted by batch
        size), or the names ``"accuracy"``, ``"mse"``. Default: accuracy with cross entropy,
        mse with mse. Each is a column of ``run.history``.
    optimizer
        ``"sgd"`` (the paper's momentum SGD and LR schedule, the default), or a ``torch.optim``
        class or factory such as ``functools.partial(torch.optim.AdamW, lr=1e-3)``, applied on
        the PS to its shard of the parameters; its learning rate is divided by sqrt(active
        workers), as the paper's, and its state goes into the checkpoints.
    stop_at
        Stop when a metric reaches a value: ``{"mae": 0.3}`` (loss-like names such as mae, mse,
        loss, error: at or below; others at or above; ``"<=0.3"``/``">=0.9"`` say it outright).
    collate_fn, num_workers
        Passed to the ``DataLoader`` of your data set on each worker.
    resume
        A run id (``"run-1a2b3c4d"``, looked up in the run records) or a checkpoint URL: continue
        that run from its newest complete checkpoint, with its id, model, data, shards and
        hyperparameters (any given here must agree, except ``steps`` and the stop conditions).
        A model or data defined in a notebook must be given again, and so must a user's
        loss, metrics and optimizer (the optimizer's state comes from the checkpoint).
    shards
        Number of PS shards (default: the cluster's ``ps_hosts``, so one shard per PS host).
    target_accuracy, budget, deadline
        Further stop conditions: test accuracy in [0, 1], dollars, a duration or datetime.
    checkpoint_url
        fsspec URL under which the run keeps its PS checkpoints, in a folder of its own,
        ``checkpoint_url/<run id>/`` (``run.checkpoint_url``), so runs may share one URL.
        Default: the run's folder beside its run record. On a cloud backend shared storage is
        required, such as a bucket URL ``gs://BUCKET/PREFIX``, and probed with a write first.
        With ``resume=RUN_ID``, a run without a record here is found in its folder under it.
    **hparams
        Any field of :class:`~transient_nb.training.hparams.HParams` (``batch_size``, ``lr``,
        ``checkpoint_every``, ``eval_every``, ``eval_images``, ``warmup_steps``,
        ``wire_dtype``, ``call_timeout_s``, ``ps_lost_after_s``, ``trainer_restarts``, ...);
        their defaults are HParams' own.

    Examples
    --------
    >>> from transient_nb import TransientCluster, train
    >>> cluster = TransientCluster(workers=2)  # doctest: +SKIP
    >>> run = train(cluster, model="resnet8", data="digits", steps=300)  # doctest: +SKIP
    >>> run.wait().summary()["accuracy"]  # doctest: +SKIP
    >>> run = train(cluster, model=Net, data=(train_set, test_set), loss="mse",
    ...             metrics={"mae": mae}, stop_at={"mae": 0.3})  # doctest: +SKIP
    >>> net = run.wait().model()  # doctest: +SKIP
    """
    custom = {
        "loss": loss,
        "metrics": metrics,
        "optimizer": optimizer,
        "stop_at": stop_at,
        "collate_fn": collate_fn,
        "num_workers": num_workers,
    }
    if getattr(cluster, "runs_in_head", False):  # a detached cluster's handle: its head trains
        given = {
            "model": model,
            "data": data,
            "steps": steps,
            "resume": resume,
            "shards": shards,
            "target_accuracy": target_accuracy,
            "budget": budget,
            "deadline": deadline,
            "checkpoint_url": checkpoint_url,
            "seed": seed,
            "device": device,
            **custom,
            **hparams,
        }
        view = cluster.train(**{k: v for k, v in given.items() if v is not None})
        if wait:
            view.wait()
        return view
    point = None
    shards_given = shards is not None
    if resume is not None:
        point = resuming.find(resume, checkpoint_url=checkpoint_url)
        model, data, shards, steps, hparams = resuming.settings(
            point, model, data, shards, steps, hparams
        )
        resuming.check_optimizer(point, optimizer)
    # One shard per PS host by default: each shard then has a process of its own.
    # Without an explicit number, the run also follows the PS hosts the cluster gains later
    # (cluster.scale_ps, or the policy when one PS is the bottleneck).
    elastic = not shards_given
    shards = int(getattr(cluster, "ps_hosts", 1) or 1) if shards is None else shards
    hp, checked = check_workload(
        model=model,
        data=data,
        steps=HParams.steps if steps is None else steps,
        shards=shards,
        target_accuracy=target_accuracy,
        **custom,
        **hparams,
    )
    if limits.dollars(budget, "budget") is not None:
        spent = cluster.cost().total
        if spent >= budget:
            raise ValueError(
                f"budget=${budget:.2f} is already spent: this cluster has cost ${spent:.4f} so far. "
                "Raise the budget or start a new cluster."
            )
    if getattr(cluster, "status", None) is not None and cluster.status.name != "running":
        raise ValueError(f"The cluster is {cluster.status.name}; start it (or a new one) first.")
    # A resumed run writes on in its own folder: that is the storage to check.
    check_checkpoint_url(
        point.checkpoint_url if point is not None else checkpoint_url,
        getattr(getattr(cluster, "backend", None), "name", "local"),
    )
    workload = checked.workload
    run = TrainingRun(
        cluster,
        workload.model_name,
        workload.data_name,
        hp,
        workload=workload,
        stop_at=stop_conditions(stop_at, workload.metrics),
        shards=shards,
        elastic_shards=elastic,
        target_accuracy=target_accuracy,
        budget=budget,
        deadline=_parse_deadline(deadline),
        checkpoint_url=checkpoint_url,
        seed=seed,
        device=device,
        resume=point,
    ).start()
    if wait:
        run.wait()
    return run
