"""Attach to a transient cluster that another kernel (or process) owns, by name.

Every running :class:`~transient_nb.TransientCluster` registers its name and scheduler address in
the on-disk registry. :func:`connect` looks the name up and returns a :class:`RemoteCluster`: a
Dask ``Client`` on that scheduler, a copy of the cluster's event log kept up to date through the
scheduler's one documented RPC for remote readers (:data:`~transient_nb.eventlog.vocabulary.EVENTS_RPC`), folded
by :class:`~transient_nb.eventlog.folds.ClusterState` (so ``events()``, ``cost()``, ``vms()``, the control
panel and the dashboard work as for a local cluster), and control — ``scale``, ``preempt``,
``shutdown`` — sent as requests on the scheduler's ``transient-control`` topic, which the owning
cluster acts on and answers with a ``control`` event.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

import pandas as pd
from distributed import Client
from distributed.comm.core import CommClosedError
from distributed.core import Status

from transient_nb.backends.tls import security_from_registry
from transient_nb.catalog.prices import PriceCatalog
from transient_nb.deploy import messages, registry
from transient_nb.deploy.remote_run import RemoteRun
from transient_nb.eventlog.bill import CostReport
from transient_nb.eventlog.folds import ClusterState
from transient_nb.eventlog.records import events_frame
from transient_nb.eventlog.vocabulary import (
    CONTROL_TOPIC,
    EVENTS_RPC,
    ClusterStart,
)
from transient_nb.ticker import Ticker

#: ``train()`` arguments that may be objects: they travel to a head cloudpickled.
BY_VALUE = ("model", "data", "loss", "metrics", "optimizer", "collate_fn")


def _plain(value: Any) -> bool:
    """Whether ``value`` travels as JSON (a name, a number, a mapping of them)."""
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


logger = logging.getLogger(__name__)

#: Failed reads of the event log in a row after which a remote cluster counts as gone.
MAX_FAILURES = 8

#: Seconds between reads of the scheduler's log while waiting for a control answer.
POLL_S = 0.05
#: Longest wait for one such read.
READ_TIMEOUT_S = 2.0


class RemoteEventLog:
    """The owning scheduler's event log, copied here as it grows.

    It has the monitor's shape (an append-only ``events`` list), so that
    :func:`transient_nb.eventlog.folds.event_log` reads a local and a remote cluster alike.
    """

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    async def fetch(self, scheduler: Any, timeout: float = 5.0) -> list[dict[str, Any]]:
        """Append the events the scheduler has beyond ours; returns them."""
        rpc = getattr(scheduler, EVENTS_RPC)
        new = list(await asyncio.wait_for(rpc(since=len(self.events)), timeout))
        self.events.extend(new)
        return new


class RemoteCluster:
    """A handle on a transient cluster that another process owns.

    Use :func:`connect` to get one. Reading (``events``, ``cost``, ``vms``, views) works from a
    copy of the cluster's event log kept up to date on the client's event loop; control requests
    go to the owning cluster through its scheduler and wait for its answer.

    Parameters
    ----------
    entry
        The cluster's registry entry (``name``, ``scheduler_address``, ...).
    timeout
        Seconds to wait for the scheduler when connecting.
    answer_timeout
        Seconds to wait for the owning cluster's answer to a control request.
    interval
        Seconds between two reads of the event log.

    Examples
    --------
    >>> from transient_nb import connect
    >>> cluster = connect("demo")  # doctest: +SKIP
    >>> cluster.preempt("w-1")  # doctest: +SKIP
    >>> cluster.cost()  # doctest: +SKIP
    >>> cluster.close()  # our handle only; the cluster keeps running  # doctest: +SKIP
    """

    #: ``train(cluster, ...)`` sends the run to the head rather than driving it here.
    runs_in_head = True

    def __init__(
        self,
        entry: Mapping[str, Any],
        *,
        timeout: float = 10.0,
        answer_timeout: float = 10.0,
        interval: float = 0.25,
    ):
        self.entry = dict(entry)
        self.name = str(entry["name"])
        self.scheduler_address = str(entry["scheduler_address"])
        self.dashboard_link = entry.get("dashboard_link")
        self.answer_timeout = answer_timeout
        self.monitor = RemoteEventLog()
        #: What the views show, folded from the log as it is copied (guarded by ``_lock``: the
        #: copy grows on the client's loop, the user reads from the notebook's thread).
        self.state = ClusterState()
        self._lock = threading.Lock()
        self.status = Status.running
        self._failures = 0
        self._catalog: PriceCatalog | None = None
        # The cluster's client certificate (TLS clusters): files only this user can read.
        self.client = Client(
            self.scheduler_address,
            set_as_default=False,
            timeout=timeout,
            security=security_from_registry(entry),
        )
        self.loop = self.client.loop
        try:
            self.client.sync(self._fetch)
        except Exception:
            self.client.close()
            raise
        self._ticker = Ticker(self.loop, self._fetch, interval)
        self._ticker.start()

    # -- the event log ------------------------------------------------------------------------------
    async def _fetch(self) -> None:
        if self.status != Status.running:
            return
        events = self.monitor.events
        try:
            new = await self.monitor.fetch(self._scheduler)
        except Exception as e:
            self._failures += 1
            logger.debug("Reading the event log of %s failed: %r", self.name, e)
            if self._failures >= MAX_FAILURES:
                self.status = Status.closed
                self._ticker.stop()
            if not events:
                raise
            return
        self._failures = 0
        with self._lock:
            if not self.state.n_events and self.catalog is not None:
                self.state = ClusterState(minimum_s=self.catalog.minimum_s)
            self.state.feed(new)
        if events and events[-1].get("kind") == "closed":
            self.status = Status.closed
            self._ticker.stop()

    @property
    def _scheduler(self) -> Any:
        # The client's RPC to the scheduler: handlers by name (``transient_events``, ...).
        assert self.client.scheduler is not None
        return self.client.scheduler

    def _started(self) -> ClusterStart:
        return ClusterStart.of(self.monitor.events)

    @property
    def catalog(self) -> PriceCatalog | None:
        """The price catalog the owning cluster bills with (None if it cannot be loaded)."""
        if self._catalog is None:
            name = self._started().catalog
            try:
                self._catalog = PriceCatalog.load(name) if name else None
            except (ValueError, OSError):
                self._catalog = None
        return self._catalog

    @property
    def time_scale(self) -> float:
        """Simulated seconds per wall second of the owning cluster."""
        return self._started().time_scale

    @property
    def gpu(self) -> str | None:
        """GPU type of new workers."""
        return self.entry.get("gpu") or self._started().get("gpu")

    @property
    def mix(self) -> dict[str, int]:
        """GPU type -> workers the owning cluster keeps (its last ``scale``, else its start)."""
        events = list(self.monitor.events)
        for e in reversed(events):
            if e.get("kind") in ("scale", "started") and e.get("mix"):
                return {str(g): int(n) for g, n in e["mix"].items()}
        return self._started().mix

    @property
    def zone(self) -> str | None:
        """Zone of new workers."""
        return self.entry.get("zone") or self._started().get("zone")

    @property
    def spot(self) -> bool:
        """Whether new workers are Spot VMs."""
        return bool(self.entry.get("spot", self._started().get("spot", True)))

    def events(self) -> pd.DataFrame:
        """Every event of the cluster's run so far, as a DataFrame."""
        return events_frame(list(self.monitor.events))

    def cost(self) -> CostReport:
        """Money spent so far, per VM and in total, beside the on-demand counterfactual."""
        with self._lock:
            return self.state.cost()

    def vms(self) -> pd.DataFrame:
        """Every VM of the cluster with its lifecycle state and time in state."""
        with self._lock:
            return self.state.vms_frame()

    def get_client(self) -> Client:
        """The Dask client connected to the cluster's scheduler."""
        return self.client

    def wait_for_workers(self, n_workers: int = 1, timeout: float | None = None) -> None:
        """Block until ``n_workers`` GPU workers have joined (by the event log)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                joined = self.state.counts().get("joined", 0)
            if joined >= n_workers:
                return
            if self.status != Status.running:
                raise RuntimeError(
                    f"Cluster {self.name!r} closed before {n_workers} workers joined."
                )
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"Only some of {n_workers} workers joined within {timeout} s.")
            time.sleep(0.1)

    # -- control ----------------------------------------------------------------------------------------
    async def _control(self, msg: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        req = messages.ControlRequest(msg)
        since = len(self.monitor.events)
        await self._scheduler.log_event(topic=CONTROL_TOPIC, msg=req.msg)
        timeout = self.answer_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            await asyncio.sleep(POLL_S)
            # Read the scheduler's log directly: the answer must not wait for the next mirror tick.
            try:
                # Bounded: a scheduler that is closing can leave a read unanswered for a minute.
                new = await asyncio.wait_for(
                    getattr(self._scheduler, EVENTS_RPC)(since=since),
                    max(0.1, min(READ_TIMEOUT_S, deadline - time.monotonic())),
                )
            except (OSError, CommClosedError, asyncio.TimeoutError) as failure:
                # A "stop" may close the scheduler before its answer is read: that is the answer,
                # once the owner's registry entry confirms it.
                if req.action == "stop" and await self._owner_gone(time.monotonic()):
                    return {"action": "stop", "ok": True, "request": req.id, "closed": True}
                if isinstance(failure, asyncio.TimeoutError):
                    continue  # a slow read (a loaded host): read again until the deadline
                raise
            answer = req.answer_in(new)
            if answer is not None:
                if req.action == "stop":
                    answer["closed"] = await self._owner_gone(deadline)
                return answer
            since += len(new)
        raise TimeoutError(
            f"Cluster {self.name!r} did not answer the {req.action!r} request within "
            f"{timeout:g} s; its owning process may be gone or busy."
        )

    async def _owner_gone(self, deadline: float) -> bool:
        """Whether the cluster's registry entry went (or went stale) before ``deadline``.

        A head VM's entry is this client's own: the VM itself is asked about (the API).
        """
        while True:
            if self.entry.get("head_vm"):
                from transient_nb.backends.gce.head import head_gone

                if await asyncio.to_thread(head_gone, self.entry):
                    return True
                if time.monotonic() >= deadline:
                    return False
                await asyncio.sleep(1.0)
                continue
            current = [e for e in registry.entries() if e["name"] == self.name]
            if not current or current[0]["stale"] or current[0].get("pid") != self.entry.get("pid"):
                return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(POLL_S)

    def _request(self, msg: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        if self.status != Status.running:
            raise ValueError(f"Cluster {self.name!r} is closed; nothing can act on it.")
        return self.client.sync(self._control, msg, timeout)

    # -- training runs (detached clusters: the head runs them) ------------------------------------
    @property
    def detached(self) -> bool:
        """Whether a head process owns the cluster (it then runs the training too)."""
        return bool(self.entry.get("detached"))

    def train(self, **kwargs: Any) -> RemoteRun:
        """Start a training run in the cluster's head; returns a view of it.

        Takes the arguments of :func:`transient_nb.train` (which calls this for a detached
        cluster), checked here first: a mistake is reported before the head starts anything.
        """
        # Imported here: a handle that only watches never pays for torch.
        from transient_nb.training.preflight import dumps
        from transient_nb.training.spec import check_train_args

        if not self.detached:
            raise ValueError(
                f"Cluster {self.name!r} is owned by a kernel (pid {self.entry.get('pid')}), not a "
                "head: start the run in that kernel, or start a detached cluster "
                "(TransientCluster(detached=True), `%transient_cluster up --detach`)."
            )
        kwargs.pop("wait", None)
        checked = {
            k: kwargs[k]
            for k in (
                "model",
                "data",
                "steps",
                "shards",
                "target_accuracy",
                "deadline",
                *BY_VALUE,
                "stop_at",
                "num_workers",
            )
            if k in kwargs
        }
        hparams = {
            k: v
            for k, v in kwargs.items()
            if k not in checked
            and k not in ("budget", "checkpoint_url", "seed", "device", "resume")
        }
        if kwargs.get("resume") is None:
            # The same checks as an attached run's, here: the model built, one batch run.
            check_train_args(**checked, **hparams)
        # Objects (a model class of this notebook, data sets, callables) travel cloudpickled, as
        # Dask ships functions; plain values as they are.
        objects = {k: kwargs.pop(k) for k in BY_VALUE if k in kwargs and not _plain(kwargs[k])}
        if objects:
            kwargs["by_value"] = dumps(objects, "model and data")
        deadline: Any = kwargs.get("deadline")
        if hasattr(deadline, "timestamp"):  # a datetime travels as seconds from now
            kwargs["deadline"] = max(1.0, deadline.timestamp() - time.time())
        answer = self._request(
            {"action": "train", "args": kwargs}, timeout=max(60.0, self.answer_timeout)
        )
        return RemoteRun(self, str(answer["run"]))

    def runs(self) -> list[RemoteRun]:
        """Every training run of the cluster, oldest first."""
        # A run is known from the head's answer to ``train`` (before its own first event).
        ids = [
            str(e["run"])
            for e in list(self.monitor.events)
            if e.get("run")
            and (
                e.get("kind") == "train-started"
                or (e.get("kind") == "control" and e.get("action") == "train" and e.get("ok"))
            )
        ]
        return [RemoteRun(self, i) for i in dict.fromkeys(ids)]

    @property
    def run(self) -> RemoteRun | None:
        """The newest training run of the cluster (None before the first)."""
        runs = self.runs()
        return runs[-1] if runs else None

    def scale(
        self,
        n: int | str | Mapping[str, int],
        *,
        gpu: str | None = None,
        on_demand: int | str | Mapping[str, int] | None = None,
    ) -> dict[str, Any]:
        """Ask the owning cluster to keep ``n`` GPU workers; returns its answer.

        As :meth:`TransientCluster.scale`: ``n`` of type ``gpu`` (the other types keep
        theirs), or a whole mix (``{"k80": 2, "v100": 1}`` or ``"k80=2,v100=1"``); ``on_demand``,
        how many of them run on demand (a number, or GPU type -> number such as ``{"v100": 1}``
        or ``"v100=1"``). The owning cluster checks the types against its catalog and the
        on-demand counts against the mix, and answers with its error if one is wrong.
        """
        return self._request(messages.scale_message(n, gpu, on_demand))

    def scale_ps(self, n: int) -> dict[str, Any]:
        """Ask the owning cluster to keep ``n`` PS hosts (see
        :meth:`transient_nb.TransientCluster.scale_ps`); returns its answer."""
        return self._request(messages.scale_ps_message(n))

    def move_ps(self, zone: str, reason: str = "") -> dict[str, Any]:
        """Ask the owning cluster to move its PS hosts to ``zone`` (see
        :meth:`transient_nb.TransientCluster.move_ps`); returns its answer.

        The owning cluster answers with its error for a zone it may not use (neither its own
        nor one of its ``fallback_zones``) or while a move is under way.
        """
        return self._request(messages.move_ps_message(zone, reason))

    def adapt(self, goal: str | None = None, **kwargs: Any) -> dict[str, Any]:
        """Start (or, with ``goal=None``, stop) the owning cluster's transient-aware policy.

        The policy runs where the cluster lives (a head, or the kernel that owns it); its
        arguments are those of :meth:`transient_nb.TransientCluster.adapt`. Its decisions are
        ``policy-decision`` events, seen here as any other.
        """
        # Checked here first: a mistake is reported before any change.
        return self._request(messages.adapt_message(goal, **kwargs))

    def preempt(self, target: int | str = 1, notice: bool = True) -> dict[str, Any]:
        """Ask the owning cluster to preempt ``target`` workers (a count) or the worker named so."""
        if isinstance(target, str):
            return self._request(messages.preempt_message(worker=target, notice=notice))
        return self._request(messages.preempt_message(count=target, notice=notice))

    def shutdown(self, timeout: float = 300.0) -> dict[str, Any]:
        """Ask the owning process to close the cluster, then close this handle.

        A GCE head VM closes the cluster (workers, firewall rules), then deletes itself: this
        waits up to ``timeout`` seconds for that, then forgets the cluster's local entry and
        client certificate. The answer's ``closed`` says whether the owner is gone.
        """
        # The owner ends this client's report stream before its scheduler closes
        # (deploy.cluster._dismiss_clients), so the client does not try to reconnect to it.
        try:
            if self.status == Status.running:
                answer = self._request(messages.stop_message())
            else:
                # The mirror gave up on a slow scheduler (MAX_FAILURES reads in a row): the owner
                # may well be alive, and "stop" must still reach it rather than leave it running.
                answer = self.client.sync(self._control, {"action": "stop"}, None)
        finally:
            self.close()
        if self.entry.get("head_vm"):
            from transient_nb.backends.gce.head import wait_gone

            answer["closed"] = answer.get("closed") or wait_gone(self.entry, timeout)
            if answer["closed"]:
                registry.forget(self.entry)
        return answer

    def close(self) -> None:
        """Close this handle (the client and the mirror); the cluster keeps running."""
        self._ticker.stop()
        if self.status == Status.running:
            self.status = Status.closed
        self.client.close()

    def __enter__(self) -> RemoteCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"<RemoteCluster {self.name!r}: {self.scheduler_address} "
            f"({registry.owner(self.entry)}), status={self.status.name}>"
        )
