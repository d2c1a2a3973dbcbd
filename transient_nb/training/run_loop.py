"""The driver's loop: its thread, evaluation, the stop conditions and the end.

:class:`RunLoop` runs in a background thread of the client process: it starts the PS (from the
model, or from the resumed run's checkpoint), then goes round: events, trainers, checkpoints, the
PS's health (a recovery, a reshard, a move), evaluation, until a stop condition is met; however it
ends, it stops its trainers and releases what it made on the cluster.
"""

from __future__ import annotations

import atexit
import copy
import json
import time
from typing import Any

import numpy as np
import torch
from distributed import Client, Variable

from transient_nb.eventlog.vocabulary import TOPIC
from transient_nb.training import checkpoint, export
from transient_nb.training.estimate import count_step
from transient_nb.training.preflight import dumps, payload
from transient_nb.training.ps import shard_bounds
from transient_nb.training.run_driver import logger
from transient_nb.training.run_trainers import Trainers
from transient_nb.training.spec import reached as metric_reached
from transient_nb.training.trainer import decay_mask, flat_layout, get_flat, set_flat
from transient_nb.training.workload import WorkloadPlugin, fixed_state, load_fixed, plugin_name

#: How often the driver looks at the PS, the trainers and the events (seconds).
POLL_S = 0.25


class RunLoop(Trainers):
    """The driver thread of a run (see the module's docstring)."""

    def _at_exit(self) -> None:
        # What run.stop() does, bounded: a kernel that exits waits for its trainers' end.
        if not self._done.is_set():
            self._stop.set()
            self._wake.set()
            self._done.wait(self.hp.call_timeout_s + 10)

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

    def _on_event(self, event: Any) -> None:
        # A topic message ``(time, event)``: handled by the driver's loop, woken now.
        self._events.put(event[1])
        self._wake.set()

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
            budget=self.limits.budget,
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

    def _finish(self, reason: str) -> None:
        self.reason = reason
        results = self._stop_trainers()
        try:
            self.status = self._ps[0].status().result(timeout=self.hp.call_timeout_s)
            self.step = int(self.status["step"])
        except Exception:
            pass
        self._flush_metrics()
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

    def _flush_metrics(self) -> None:
        """Have the PS post its last ``metrics`` window and wait until the log holds it: the
        curve (``run.history``) then reaches the last step, and has a row even when the run
        ended before the PS's first ``metrics_interval_s`` (a fast stop by accuracy)."""
        self._metrics_step = -1  # a metrics event posted from here on
        try:
            posted = self._ps[0].flush_metrics().result(timeout=self.hp.call_timeout_s)
        except Exception as e:  # the PS went: the curve ends at its last posted window
            logger.info("Flushing the PS's metrics failed: %r", e)
            return
        if posted is None:
            return
        deadline = time.monotonic() + self.hp.call_timeout_s
        while self._metrics_step < posted and time.monotonic() < deadline:
            self._wake.wait(POLL_S)
            self._wake.clear()
            self._handle_events()
        if self._metrics_step < posted:
            logger.warning("The PS's last metrics (step %d) did not reach the event log", posted)

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
