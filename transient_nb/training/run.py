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
import time
from collections.abc import Mapping
from typing import Any

import pandas as pd
import torch

from transient_nb import limits
from transient_nb.eventlog.folds import event_log
from transient_nb.eventlog.folds import (
    summarize as summarize,  # re-exported: run records are read with it
)
from transient_nb.training import export
from transient_nb.training import resume as resuming
from transient_nb.training.checkpoint import (  # re-exported: the surfaces import them from here
    check_checkpoint_url as check_checkpoint_url,
)
from transient_nb.training.checkpoint import (
    probe_checkpoint_url as probe_checkpoint_url,
)
from transient_nb.training.hparams import HParams
from transient_nb.training.run_checkpoints import CHECKPOINTS_KEPT as CHECKPOINTS_KEPT
from transient_nb.training.run_driver import (  # re-exported: the driver's bounds, its slots
    PS_HOSTS_GRACE_S as PS_HOSTS_GRACE_S,
)
from transient_nb.training.run_driver import PS_OVERDUE_S as PS_OVERDUE_S
from transient_nb.training.run_driver import RESULT_AT_HAND_S as RESULT_AT_HAND_S
from transient_nb.training.run_driver import SETUP_TIMEOUT_S as SETUP_TIMEOUT_S
from transient_nb.training.run_driver import _TrainerSlot as _TrainerSlot
from transient_nb.training.run_driver import logger as logger
from transient_nb.training.run_loop import POLL_S as POLL_S
from transient_nb.training.run_loop import RunLoop
from transient_nb.training.run_trainers import TRAINER_BACKOFF_MAX_S as TRAINER_BACKOFF_MAX_S
from transient_nb.training.run_trainers import TRAINER_BACKOFF_S as TRAINER_BACKOFF_S
from transient_nb.training.spec import (
    check_train_args as check_train_args,  # re-exported: the surfaces import it from here
)
from transient_nb.training.spec import check_workload, stop_conditions

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


class TrainingRun(RunLoop):
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

    ``checkpoint_url`` is the run's own checkpoint folder: ``URL/<id>/`` under the
    ``checkpoint_url`` given to :func:`train` (runs may share that URL), the resumed run's folder,
    or by default ``checkpoints/<id>`` in the cluster's run folder.

    Its parts, stacked: :class:`~transient_nb.training.run_driver.RunCore` (its state, events and
    PS generations), :class:`~transient_nb.training.run_checkpoints.Checkpoints` (checkpoints,
    resume, recovery), :class:`~transient_nb.training.run_trainers.Trainers` (a trainer per GPU
    worker) and :class:`~transient_nb.training.run_loop.RunLoop` (the driver thread); this class
    adds what a notebook calls.
    """

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
        if not point.run_id:
            # The resumed run takes the id its checkpoints name, and loads only that run's.
            raise ValueError(
                f"resume={resume!r}: its checkpoint names no run (it was not written by a "
                "transient_nb run), so no run can continue from it."
            )
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
