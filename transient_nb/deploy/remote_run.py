"""A view of a training run that another process drives (a detached cluster's head).

The run belongs to the head; what a notebook, a second kernel or the CLI holds is a
:class:`RemoteRun`: ``step``, ``accuracy``, ``history``, ``summary()``, ``wait()`` and ``stop()``,
every one read from the cluster's event log (the same folds as the run's own), and ``stop()``
sent to the head as a ``run-stop`` control request. The trained model comes from the head over
the scheduler's ``transient_export`` RPC: ``model()`` (the module, rebuilt here even when its
class was defined in another client's notebook), ``state_dict()`` and ``save(path)``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

import cloudpickle
import pandas as pd

from transient_nb.catalog.prices import BILLING_MINIMUM_S
from transient_nb.eventlog.folds import event_log
from transient_nb.eventlog.vocabulary import EXPORT_RPC
from transient_nb.training.hparams import HParams
from transient_nb.training.resume import run_history, summarize_run

#: Reasons a run ends with that are failures (``wait()`` raises on them).
FAILED = ("error", "trainer-failed")


class RemoteRun:
    """A run of a detached cluster, seen from a client.

    Parameters
    ----------
    cluster
        The :class:`~transient_nb.deploy.remote.RemoteCluster` whose log holds the run.
    run_id
        The run's id (``run-...``).

    Examples
    --------
    >>> from transient_nb import connect
    >>> run = connect("demo").run  # doctest: +SKIP
    >>> run.step, run.accuracy  # doctest: +SKIP
    >>> run.stop()  # doctest: +SKIP
    """

    def __init__(self, cluster: Any, run_id: str):
        self.cluster = cluster
        self.id = run_id

    # -- from the event log --------------------------------------------------------------------
    def events(self) -> list[dict[str, Any]]:
        """This run's events and the cluster's lifecycle events, in order."""
        return [dict(e) for e in list(event_log(self.cluster)) if e.get("run") in (None, self.id)]

    def _own(self, kind: str) -> list[Mapping[str, Any]]:
        return [
            e
            for e in list(event_log(self.cluster))
            if e.get("kind") == kind and e.get("run") == self.id
        ]

    @property
    def started_event(self) -> Mapping[str, Any]:
        """The run's ``train-started`` event (empty until the head posts it)."""
        found = self._own("train-started")
        return found[0] if found else {}

    @property
    def started(self) -> float:
        """Wall time the run started (UNIX seconds)."""
        return float(self.started_event.get("time", time.time()))

    @property
    def hp(self) -> HParams:
        """The run's hyperparameters (HParams' defaults until the head posts its start)."""
        raw = self.started_event.get("hparams")
        return HParams.from_dict(json.loads(raw)) if raw else HParams()

    @property
    def model_name(self) -> str | None:
        """The model's name (a built-in name, an import path, or its class's name)."""
        return self.started_event.get("model")

    @property
    def data(self) -> str | None:
        return self.started_event.get("data")

    @property
    def finished_event(self) -> Mapping[str, Any] | None:
        """The run's ``train-finished`` event, once it has ended."""
        found = self._own("train-finished")
        return found[-1] if found else None

    @property
    def done(self) -> bool:
        """True once the run has ended, or its cluster has closed."""
        return self.finished_event is not None or self.cluster.status.name != "running"

    @property
    def reason(self) -> str | None:
        """Why the run ended (``steps``, ``accuracy``, ``stopped``, ``error``, ...)."""
        f = self.finished_event
        return None if f is None else f.get("reason")

    @property
    def error(self) -> str | None:
        f = self.finished_event
        return None if f is None else f.get("error")

    @property
    def step(self) -> int:
        """The newest global step the PS reported."""
        f = self.finished_event
        if f is not None:
            return int(f.get("step") or 0)
        steps = [int(e["step"]) for e in self._own("metrics") if e.get("step") is not None]
        start = self.started_event.get("resumed_step") or 0
        return max(steps, default=int(start))

    @property
    def accuracy(self) -> float | None:
        """Test accuracy of the newest evaluation."""
        evals = self._own("eval")
        return float(evals[-1]["accuracy"]) if evals else None

    @property
    def status(self) -> dict[str, Any]:
        """The newest PS status (``active`` workers), as the CLI's progress bar shows it."""
        metrics = self._own("metrics")
        if not metrics:
            return {}
        active = int(metrics[-1].get("active_workers") or 0)
        return {"step": self.step, "active": list(range(active))}

    @property
    def history(self) -> pd.DataFrame:
        """The training curve with the money spent at each point (see :func:`~transient_nb.training.resume.run_history`)."""
        return run_history(self.events(), t0=self.started, minimum_s=self._minimum_s())

    def summary(self) -> dict[str, Any]:
        """What the run achieved and what it cost (see :func:`~transient_nb.training.resume.summarize_run`)."""
        return summarize_run(self.events(), self._minimum_s())

    def _minimum_s(self) -> float:
        catalog = getattr(self.cluster, "catalog", None)
        return float(catalog.minimum_s) if catalog is not None else BILLING_MINIMUM_S

    # -- the trained model (from the head) -------------------------------------------------------
    def _export(self, what: str) -> dict[str, Any]:
        client = self.cluster.client
        rpc = getattr(client.scheduler, EXPORT_RPC)
        return dict(client.sync(rpc, run=self.id, what=what))

    def state_dict(self) -> dict[str, Any]:
        """The model's ``state_dict`` with the newest weights (the PS's while the run goes on,
        its newest checkpoint after), as the head has them; CPU tensors."""
        from transient_nb.training.export import state_of

        return state_of(self._export("state")["state"])

    def model(self) -> Any:
        """The trained network (the head's copy of it, with the newest weights), on the CPU, in
        eval mode; its class is rebuilt here even when another client's notebook defined it."""
        return cloudpickle.loads(self._export("model")["model"])

    def save(self, path: str) -> str:
        """Write :meth:`state_dict` with ``torch.save``; returns the path."""
        from transient_nb.training.export import save

        return save(self.state_dict(), path)

    # -- control -------------------------------------------------------------------------------
    def wait(self, timeout: float | None = None) -> RemoteRun:
        """Block until the run ends; raise if it failed (``RuntimeError``) or ``timeout`` passed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.done:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(
                    f"Run {self.id} still going after {timeout} s (step {self.step})."
                )
            time.sleep(0.1)
        if self.reason in FAILED:
            raise RuntimeError(f"Training run {self.id} failed: {self.error}")
        if self.finished_event is None:
            raise RuntimeError(
                f"Run {self.id} did not finish: its cluster {self.cluster.name!r} is gone. "
                f"Continue it with train(cluster, resume={self.id!r})."
            )
        return self

    def stop(self, wait: bool = True, timeout: float | None = 120) -> RemoteRun:
        """Ask the head to stop the run (trainers stop after their current step)."""
        if not self.done:
            self.cluster._request({"action": "run-stop", "run": self.id})
        if wait:
            self.wait_ended(timeout)
        return self

    def wait_ended(self, timeout: float | None = None) -> None:
        """Block until the run has ended, whatever the reason (no error raised)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.done:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"Run {self.id} still going after {timeout} s.")
            time.sleep(0.1)

    def __repr__(self) -> str:
        steps = self.started_event.get("steps", "?")
        acc = f", accuracy {self.accuracy:.3f}" if self.accuracy is not None else ""
        state = self.reason or ("running" if not self.done else "gone")
        return (
            f"<RemoteRun {self.id} on {self.cluster.name}: {self.model_name} on {self.data}, "
            f"step {self.step}/{steps}{acc}, {state}>"
        )
