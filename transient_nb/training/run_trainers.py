"""The driver's trainers: one per GPU worker that joins (replacements too), watched.

:class:`Trainers` asks for a trainer actor on every GPU worker without ever blocking the driver,
restarts one that fails with backoff (and gives a worker up when its trainer keeps failing),
follows the cluster's events (a worker joined, left, preempted; a PS host gone), and learns from
the PS whether a killed worker's gradient was lost.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Mapping
from typing import Any

from transient_nb.training.run_checkpoints import Checkpoints
from transient_nb.training.run_driver import RESULT_AT_HAND_S, _TrainerSlot, logger
from transient_nb.training.trainer import Trainer

#: First and longest pause before a failed trainer is restarted (seconds; doubled each time).
TRAINER_BACKOFF_S = 1.0
TRAINER_BACKOFF_MAX_S = 30.0


class Trainers(Checkpoints):
    """The trainers of a run, and the events that concern them (see the module's docstring)."""

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
                    actor = slot.future.result(timeout=RESULT_AT_HAND_S)
                    # Its worker can go between the two (a notice that lands as the actor is
                    # made): Dask's Actor then refuses the call at once ("Worker holding Actor
                    # was lost").
                    run = actor.run()
                except Exception as e:  # the worker went away before its trainer started
                    logger.info("Trainer on %s did not start: %r", name, e)
                    self._trainer_failed(name, slot, e)
                    continue
                self._released.append(slot.future)
                slot.actor, slot.future, slot.started = actor, run, True

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
                self._metrics_step = max(self._metrics_step, int(e.get("step", 0)))
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
