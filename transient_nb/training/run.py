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

import json
import logging
import math
import os
import queue
import threading
import time
import uuid
from typing import Any

import numpy as np
import pandas as pd
import torch
from dask.utils import parse_timedelta
from distributed import Client, Variable

from transient_nb.events import TOPIC, make_event
from transient_nb.training import checkpoint
from transient_nb.training.data import check_data_spec, load_dataset, to_tensor
from transient_nb.training.hparams import HParams
from transient_nb.training.models import MODELS, build_model, evaluate
from transient_nb.training.ps import ParameterServer, shard_bounds
from transient_nb.training.trainer import Trainer, decay_mask, flat_layout, get_flat, set_flat

logger = logging.getLogger(__name__)

#: How often the driver looks at the PS (seconds).
POLL_S = 0.25


def _parse_deadline(deadline: Any) -> float | None:
    """A deadline as UNIX seconds: a duration from now ("2h", 3600) or a datetime."""
    if deadline is None:
        return None
    if hasattr(deadline, "timestamp"):
        return float(deadline.timestamp())
    try:
        seconds = parse_timedelta(deadline, default="seconds")
    except (ValueError, TypeError, KeyError):
        seconds = None
    if seconds is None or seconds <= 0:
        raise ValueError(
            f"deadline={deadline!r}: give a positive duration such as '2h' or a datetime."
        )
    return time.time() + seconds


class TrainingRun:
    """An asynchronous PS training run on a :class:`~transient_nb.TransientCluster`.

    Created by :func:`train`; runs in the background. ``history`` and ``summary()`` are computed
    from the cluster's event log.
    """

    def __init__(
        self,
        cluster: Any,
        model: str,
        data: str,
        hparams: HParams,
        *,
        shards: int = 1,
        target_accuracy: float | None = None,
        budget: float | None = None,
        deadline: float | None = None,
        checkpoint_url: str | None = None,
        seed: int = 0,
        device: str | None = None,
    ):
        self.cluster = cluster
        self.model = model
        self.data = data
        self.hp = hparams
        self.shards = shards
        self.target_accuracy = target_accuracy
        self.budget = budget
        self.deadline = deadline
        self.seed = seed
        self.device = device
        self.id = f"run-{uuid.uuid4().hex[:8]}"
        self.checkpoint_url = checkpoint_url or os.path.join(
            cluster.run_path, "checkpoints", self.id
        )
        self.variable = f"transient-ps-{self.id}"
        self.reason: str | None = None
        self.error: BaseException | None = None
        self.step = 0
        self.accuracy: float | None = None
        self.started = time.time()
        self.finished: float | None = None
        self._stop = threading.Event()
        self._done = threading.Event()
        self._events: queue.Queue[dict[str, Any]] = queue.Queue()
        self._trainers: dict[str, Any] = {}  # worker name -> (actor, run future)
        self._pending: dict[str, Any] = {}  # worker name -> future of its trainer actor
        self._ps: list[Any] = []
        self._ps_address: str | None = None
        self._generation = 0
        self._bounds: list[tuple[int, int]] = []
        self._next_eval = hparams.eval_every
        self._eval_model: torch.nn.Module | None = None
        self._test: tuple[torch.Tensor, np.ndarray] | None = None
        self.status: dict[str, Any] = {}
        #: Gradients lost with workers killed mid-step (at most one per killed worker).
        self.lost_in_flight = 0
        self._thread = threading.Thread(target=self._main, name=f"transient-{self.id}", daemon=True)

    # -- public ------------------------------------------------------------------------------------
    def start(self) -> TrainingRun:
        self._thread.start()
        return self

    @property
    def done(self) -> bool:
        """True once the run has finished (for whatever reason)."""
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> TrainingRun:
        """Block until the run finishes; re-raises an error of the driver."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"Run {self.id} still going after {timeout} s (step {self.step}).")
        if self.error is not None:
            raise RuntimeError(f"Training run {self.id} failed: {self.error!r}") from self.error
        return self

    def stop(self, wait: bool = True, timeout: float | None = 120) -> TrainingRun:
        """Stop the run (trainers stop after their current step)."""
        self._stop.set()
        if wait:
            self._done.wait(timeout)
        return self

    def events(self) -> list[dict[str, Any]]:
        """This run's events and the cluster's lifecycle events, in order."""
        return [e for e in self.cluster.monitor.events if e.get("run") in (None, self.id)]

    @property
    def history(self) -> pd.DataFrame:
        """One row per ``metrics`` event: step, time, loss, test accuracy (last evaluation),
        active workers, staleness, img/s, cost and on-demand cost so far."""
        from transient_nb.cost import compute_costs

        events = self.events()
        rows = []
        acc = None
        t0 = self.started
        for i, e in enumerate(events):
            if e.get("kind") == "eval":
                acc = e["accuracy"]
            if e.get("kind") != "metrics":
                continue
            cost = compute_costs(
                events[: i + 1], now=e["time"], minimum_s=self.cluster.catalog.minimum_s
            )
            rows.append(
                {
                    "step": e["step"],
                    "time": e["time"] - t0,
                    "loss": e["loss"],
                    "accuracy": acc,
                    "active_workers": e["active_workers"],
                    "staleness": e["staleness"],
                    "img_per_s": e["img_per_s"],
                    "lr": e["lr"],
                    "cost": cost.total,
                    "cost_on_demand": cost.total_on_demand,
                }
            )
        return pd.DataFrame(
            rows,
            columns=[
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
            ],
        )

    def summary(self) -> dict[str, Any]:
        """What the run achieved and what it cost (JSON-friendly)."""
        return summarize(self.events(), self.cluster.catalog.minimum_s)

    def __repr__(self) -> str:
        state = self.reason or ("running" if self._thread.is_alive() else "created")
        acc = f", accuracy {self.accuracy:.3f}" if self.accuracy is not None else ""
        return f"<TrainingRun {self.id}: {self.model} on {self.data}, step {self.step}/{self.hp.steps}{acc}, {state}>"

    # -- the driver thread --------------------------------------------------------------------------
    def _post(self, kind: str, **fields: Any) -> None:
        self._client.log_event(TOPIC, make_event(kind, run=self.id, **fields))

    def _main(self) -> None:
        try:
            # Talk to actors directly, not through the scheduler (measured: 1.55 vs 2.2 ms a call).
            self._client = Client(self.cluster, set_as_default=False, direct_to_workers=True)
            self._client.subscribe_topic(TOPIC, lambda ev: self._events.put(ev[1]))
            with self._client.as_current():  # actor handles in this thread find this client
                self._run()
        except BaseException as e:  # the run ends; the notebook learns why from .error
            logger.exception("Training run %s failed", self.id)
            self.error = e
            self.reason = "error"
            try:
                self._post(
                    "train-finished",
                    reason="error",
                    step=self.step,
                    error=repr(e)[:500],
                    accuracy=self.accuracy,
                    wall_s=time.time() - self.started,
                )
            except Exception:
                pass
        finally:
            self.finished = time.time()
            try:
                self._client.unsubscribe_topic(TOPIC)
                self._client.close()
            except Exception:
                pass
            self._done.set()

    def _workers(self) -> dict[str, dict[str, Any]]:
        try:
            info = self._client.scheduler_info(n_workers=-1)
        except Exception:  # the client is reconnecting: nothing is known for now
            return {}
        return dict(info.get("workers", {}))

    def _run(self) -> None:
        torch.manual_seed(self.seed)
        init = build_model(self.model, num_classes=load_dataset(self.data, train=False).num_classes)
        params, buffers = flat_layout(init)
        w0, bn0, mask = get_flat(params), get_flat(buffers), decay_mask(init)
        self._bounds = shard_bounds(len(w0), self.shards)
        self._post(
            "train-started",
            model=self.model,
            data=self.data,
            steps=self.hp.steps,
            batch_size=self.hp.batch_size,
            shards=self.shards,
            parameters=len(w0),
            hparams=json.dumps(self.hp.to_dict()),
            checkpoint_url=self.checkpoint_url,
            target_accuracy=self.target_accuracy,
            budget=self.budget,
        )
        self._create_ps(
            [
                {"weights": w0[a:b], "momentum": None, "bn": bn0 if i == 0 else None, "step": 0}
                for i, (a, b) in enumerate(self._bounds)
            ],
            mask,
        )
        for ps in self._ps:  # a step-0 checkpoint: the PS can always be re-created
            ps.checkpoint().result(timeout=self.hp.call_timeout_s)
        for addr, info in self._workers().items():
            if "gpu" in info.get("resources", {}):
                self._start_trainer(str(info["name"]), addr)
        failures = 0
        while True:
            self._handle_events()
            self._launch_ready_trainers()
            try:
                self.status = self._ps[0].status().result(timeout=self.hp.call_timeout_s)
                failures = 0
            except Exception as e:
                failures += 1
                logger.warning("PS status failed (%d): %r", failures, e)
                if failures >= 2 or not self._ps_alive():
                    self._recover(mask)
                    failures = 0
                continue
            self.step = int(self.status["step"])
            if self.step >= self._next_eval:
                self._evaluate()
                self._next_eval = (self.step // self.hp.eval_every + 1) * self.hp.eval_every
            reason = self._stop_reason()
            if reason:
                self._finish(reason)
                return
            self._stop.wait(POLL_S)

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
        if self.budget is not None and self.cluster.cost().total >= self.budget:
            return "budget"
        if self.deadline is not None and time.time() >= self.deadline:
            return "deadline"
        return None

    def _ps_alive(self) -> bool:
        return self._ps_address is not None and self._ps_address in self._workers()

    # -- PS ---------------------------------------------------------------------------------------------
    def _wait_for_ps_host(self, exclude: str | None, timeout: float) -> str:
        deadline = time.time() + timeout
        while time.time() < deadline:
            for addr, info in self._workers().items():
                if "ps" in info.get("resources", {}) and addr != exclude:
                    return str(addr)
            if self._stop.is_set():
                raise RuntimeError("stopped while waiting for a PS host")
            time.sleep(0.1)
        raise TimeoutError(f"No PS host joined within {timeout:.0f} s.")

    def _create_ps(self, states: list[dict[str, Any]], mask: np.ndarray) -> None:
        delay = self.cluster._delay(False) if hasattr(self.cluster, "_delay") else 0
        addr = self._wait_for_ps_host(self._ps_address, timeout=120 + 2 * delay)
        futures = [
            self._client.submit(
                ParameterServer,
                self.id,
                i,
                self.shards,
                st["weights"],
                mask[a:b],
                st["bn"],
                self.hp.to_dict(),
                self.checkpoint_url,
                version=st["step"],
                momentum=st["momentum"],
                model=self.model,
                generation=self._generation,
                actor=True,
                workers=[addr],
                allow_other_workers=False,
                pure=False,
                key=f"ps-{self.id}-g{self._generation}-s{i}",
            )
            for i, (st, (a, b)) in enumerate(zip(states, self._bounds, strict=True))
        ]
        self._ps = [f.result(timeout=self.hp.call_timeout_s) for f in futures]
        self._ps_address = addr
        Variable(self.variable, client=self._client).set(
            json.dumps(
                {
                    "generation": self._generation,
                    "shards": [[ps._address, ps.key] for ps in self._ps],
                }
            )
        )

    def _recover(self, mask: np.ndarray) -> None:
        lost_at = self.step
        self._post("ps-lost", step=lost_at, address=self._ps_address)
        t0 = time.time()
        states = []
        for i in range(self.shards):
            st = checkpoint.load(self.checkpoint_url, i)
            if st is None:
                raise RuntimeError(f"PS lost and no checkpoint under {self.checkpoint_url}")
            states.append(st)
        resumed = min(int(st["step"]) for st in states)
        self._generation += 1
        if self._ps_alive():
            # The host lives but our handle to the PS broke (e.g. its actor future was lost with
            # another worker): re-create the PS on the same host rather than wait for a new one.
            self._ps_address = None
        self._create_ps(states, mask)
        # Trainers still registered with the old PS are re-counted when they push again.
        self._post(
            "ps-recovered",
            step=resumed,
            steps_lost=max(0, lost_at - resumed),
            seconds=time.time() - t0,
            generation=self._generation,
        )
        self.step = resumed

    # -- trainers -------------------------------------------------------------------------------------
    def _start_trainer(self, name: str, address: str) -> None:
        """Ask for a trainer actor on the worker; it starts training once created.

        Never blocks the driver: a worker can die while its trainer is being created, and the
        driver must keep serving the others meanwhile.
        """
        if name in self._trainers or name in self._pending:
            return
        self._pending[name] = self._client.submit(
            Trainer,
            self.id,
            self.model,
            self.data,
            self.hp.to_dict(),
            self.variable,
            self._bounds,
            seed=self.seed,
            device=self.device,
            actor=True,
            workers=[address],
            allow_other_workers=False,
            pure=False,
            key=f"trainer-{self.id}-{name}",
        )

    def _launch_ready_trainers(self) -> None:
        for name, fut in list(self._pending.items()):
            if not fut.done():
                continue
            del self._pending[name]
            try:
                actor = fut.result(timeout=self.hp.call_timeout_s)
            except Exception as e:  # the worker went away before its trainer started
                logger.info("Trainer on %s did not start: %r", name, e)
                continue
            self._trainers[name] = (actor, actor.run())

    def _handle_events(self) -> None:
        while True:
            try:
                e = self._events.get_nowait()
            except queue.Empty:
                return
            kind, name, role = e.get("kind"), e.get("worker"), e.get("role")
            if kind == "joined" and role == "worker" and name:
                self._start_trainer(str(name), str(e.get("address")))
            elif kind in ("left", "preempted") and role == "worker" and name in self._pending:
                self._pending.pop(name).cancel()
            elif kind in ("left", "preempted") and role == "worker" and name in self._trainers:
                self._trainers.pop(name)
                try:  # a trainer that drained has left already; this is a no-op then
                    lost = (
                        self._ps[0].unregister(name, False).result(timeout=self.hp.call_timeout_s)
                    )
                    for ps in self._ps[1:]:
                        ps.unregister(name, False).result(timeout=self.hp.call_timeout_s)
                except Exception:
                    lost = False
                if lost:
                    self.lost_in_flight += 1
                    self._post("gradient-lost", worker=name, step=self.step)

    # -- evaluation and the end -------------------------------------------------------------------------
    def _evaluate(self) -> float | None:
        try:
            states = [ps.get_state().result(timeout=self.hp.call_timeout_s) for ps in self._ps]
        except Exception as e:
            logger.info("Evaluation skipped: %r", e)
            return None
        if self._eval_model is None:
            test = load_dataset(self.data, train=False)
            n = len(test) if self.hp.eval_images is None else min(len(test), self.hp.eval_images)
            self._test = (to_tensor(test.images[:n]), test.labels[:n])
            self._eval_model = build_model(self.model, num_classes=test.num_classes)
        model = self._eval_model
        params, buffers = flat_layout(model)
        set_flat(
            params, np.concatenate([np.asarray(s["weights"], dtype=np.float32) for s in states])
        )
        if states[0]["bn"] is not None and buffers:
            set_flat(buffers, np.asarray(states[0]["bn"]))
        assert self._test is not None
        acc, loss = evaluate(model, self._test[0], self._test[1])
        self.accuracy = float(acc)
        self._post("eval", step=int(states[0]["step"]), accuracy=float(acc), test_loss=float(loss))
        return self.accuracy

    def _finish(self, reason: str) -> None:
        self.reason = reason
        for fut in self._pending.values():
            fut.cancel()
        for actor, _ in self._trainers.values():
            try:
                actor.stop()
            except Exception:
                pass
        # One deadline for all: a trainer whose worker just died never answers.
        deadline = time.monotonic() + self.hp.call_timeout_s
        results = []
        for name, (_, fut) in list(self._trainers.items()):
            while not fut.done() and time.monotonic() < deadline:
                time.sleep(0.02)
            try:
                if fut.done():
                    results.append(fut.result(timeout=1))
            except Exception as e:
                logger.info("Trainer on %s ended with %r", name, e)
        try:
            self.status = self._ps[0].status().result(timeout=self.hp.call_timeout_s)
            self.step = int(self.status["step"])
        except Exception:
            pass
        if reason != "accuracy" or self.accuracy is None:
            self._evaluate()
        for ps in self._ps:
            try:
                ps.checkpoint().result(timeout=self.hp.call_timeout_s)
            except Exception:
                pass
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
        )


def summarize(events: list[dict[str, Any]], minimum_s: float = 60.0) -> dict[str, Any]:
    """The summary of a run, computed from its event log alone (a run record will do)."""
    from transient_nb.cost import compute_costs

    started = next((e for e in events if e.get("kind") == "train-started"), None)
    finished = next((e for e in reversed(events) if e.get("kind") == "train-finished"), None)
    t0 = started["time"] if started else (events[0]["time"] if events else 0.0)
    t1 = finished["time"] if finished else (events[-1]["time"] if events else 0.0)
    evals = [e for e in events if e.get("kind") == "eval"]
    window = [e for e in events if t0 <= e.get("time", 0) <= t1]
    preempted = [e for e in window if e.get("kind") == "preempted" and e.get("role") == "worker"]
    replacements = [
        e for e in window if e.get("kind") == "replacement-requested" and e.get("role") != "ps"
    ]
    cost = compute_costs(events, now=t1, minimum_s=minimum_s)
    rates = [
        e["img_per_s"] for e in events if e.get("kind") == "worker-metrics" and e.get("img_per_s")
    ]
    metrics = [e for e in events if e.get("kind") == "metrics"]
    wall = max(0.0, t1 - t0)
    steps = int(finished["step"]) if finished else (metrics[-1]["step"] if metrics else 0)
    batch = int(started["batch_size"]) if started else 0
    cluster_rate = steps * batch / wall if wall > 0 else 0.0
    one_worker = float(np.median(rates)) if rates else math.nan
    return {
        "run": started.get("run") if started else None,
        "model": started.get("model") if started else None,
        "data": started.get("data") if started else None,
        "reason": finished.get("reason") if finished else None,
        "steps": steps,
        "wall_s": wall,
        "accuracy": evals[-1]["accuracy"] if evals else None,
        "preemptions": len(preempted),
        "replacements": len(replacements),
        "ps_recoveries": sum(1 for e in window if e.get("kind") == "ps-recovered"),
        "steps_lost": sum(
            int(e.get("steps_lost", 0)) for e in window if e.get("kind") == "ps-recovered"
        ),
        "lost_in_flight": finished.get("lost_in_flight") if finished else None,
        "cost": cost.total,
        "cost_on_demand": cost.total_on_demand,
        "saved": cost.saved,
        "saved_fraction": cost.saved_fraction,
        "img_per_s": cluster_rate,
        "speedup_over_one_worker": cluster_rate / one_worker
        if one_worker and one_worker > 0
        else None,
    }


def train(
    cluster: Any,
    model: str = "resnet32",
    data: str = "synthetic",
    steps: int = 64_000,
    *,
    batch_size: int = 128,
    lr: float = 0.1,
    shards: int = 1,
    target_accuracy: float | None = None,
    budget: float | None = None,
    deadline: Any = None,
    checkpoint_url: str | None = None,
    checkpoint_every: int | None = None,
    eval_every: int | None = None,
    eval_images: int | None = None,
    warmup_steps: int = 100,
    wire_dtype: str = "float32",
    seed: int = 0,
    device: str | None = None,
    wait: bool = False,
) -> TrainingRun:
    """Train ``model`` on ``data`` with asynchronous PS training on ``cluster``.

    Inputs are checked before any trainer starts. The run goes on in the background; use
    ``run.wait()``, ``run.stop()``, ``run.history`` and ``run.summary()``.

    Parameters
    ----------
    cluster
        A running :class:`~transient_nb.TransientCluster`.
    model
        ``"resnet32"`` (canonical, 0.46M), ``"resnet32-t2t"`` (the paper's, 1.86M), ``"resnet20"``,
        ``"resnet8"``.
    data
        ``"synthetic"``, ``"digits"`` or ``"cifar10:PATH-OR-URL"``.
    steps
        Global steps (accepted pushes) to train for.
    shards
        Number of PS shards.
    target_accuracy, budget, deadline
        Further stop conditions: test accuracy in [0, 1], dollars, a duration or datetime.
    checkpoint_url
        fsspec URL of the PS checkpoints (default: the run's folder).
    checkpoint_every, eval_every
        Global steps between checkpoints (default steps/16, the paper's 4K of 64K) and
        evaluations (default steps/20).

    Examples
    --------
    >>> from transient_nb import TransientCluster, train
    >>> cluster = TransientCluster(workers=2)  # doctest: +SKIP
    >>> run = train(cluster, model="resnet8", data="digits", steps=300)  # doctest: +SKIP
    >>> run.wait().summary()["accuracy"]  # doctest: +SKIP
    """
    if model not in MODELS:
        raise ValueError(f"Unknown model {model!r}: use one of {', '.join(MODELS)}.")
    check_data_spec(data)
    if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
        raise ValueError(f"shards={shards!r} must be a whole number of at least 1.")
    if target_accuracy is not None and not 0 < target_accuracy <= 1:
        raise ValueError(f"target_accuracy={target_accuracy!r} must be in (0, 1], e.g. 0.9.")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps <= 0:
        raise ValueError(f"steps={steps!r} must be a whole number above 0.")
    hp = HParams(
        steps=steps,
        batch_size=batch_size,
        lr=lr,
        warmup_steps=warmup_steps,
        checkpoint_every=checkpoint_every or max(1, steps // 16),
        eval_every=eval_every or max(1, steps // 20),
        eval_images=eval_images,
        wire_dtype=wire_dtype,
    ).validate()
    if budget is not None:
        if not budget > 0:
            raise ValueError(f"budget={budget!r} must be a positive number of dollars.")
        spent = cluster.cost().total
        if spent >= budget:
            raise ValueError(
                f"budget=${budget:.2f} is already spent: this cluster has cost ${spent:.4f} so far. "
                "Raise the budget or start a new cluster."
            )
    if getattr(cluster, "status", None) is not None and cluster.status.name != "running":
        raise ValueError(f"The cluster is {cluster.status.name}; start it (or a new one) first.")
    run = TrainingRun(
        cluster,
        model,
        data,
        hp,
        shards=shards,
        target_accuracy=target_accuracy,
        budget=budget,
        deadline=_parse_deadline(deadline),
        checkpoint_url=checkpoint_url,
        seed=seed,
        device=device,
    ).start()
    if wait:
        run.wait()
    return run
