"""TransientMonitor: the scheduler plugin that keeps a run's event log.

Everything that happens in a run is an event on the scheduler under the ``transient`` topic: VM
lifecycle events posted by the cluster, ``joined``/``left`` seen by this plugin, drain reports
from workers, training metrics. The plugin appends each one to the run record (JSON lines,
flushed as it happens, so a killed kernel loses nothing) and serves the log to readers over the
scheduler's RPC (``transient_events``); live readers subscribe with
``Client.subscribe_topic("transient", handler)``.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin

from transient_nb.eventlog.vocabulary import CONTROL_TOPIC, PROVIDER_NOTICE_OP, TOPIC, make_event
from transient_nb.worker.peers import ROLE_CLIENT, peer_of

logger = logging.getLogger(__name__)


def _is_control(topic: Any) -> bool:
    topics = [topic] if isinstance(topic, str) else list(topic or ())
    return CONTROL_TOPIC in topics


#: Fields that ``joined``/``left`` events copy from the VM's ``requested`` event.
_VM_FIELDS = ("role", "gpu", "zone", "spot", "machine", "price", "price_on_demand", "slot")


class TransientMonitor(SchedulerPlugin):
    """Records every ``transient`` event and writes the run record.

    Parameters
    ----------
    path
        The run record file (JSON lines); its folder is created.

    Examples
    --------
    >>> from distributed import Scheduler
    >>> monitor = TransientMonitor("/tmp/run/events.jsonl")  # doctest: +SKIP
    >>> scheduler = Scheduler(plugins=[monitor])  # doctest: +SKIP
    """

    name = "transient-monitor"

    def __init__(self, path: str):
        self.path = path
        self.events: list[dict[str, Any]] = []
        self._vms: dict[str, dict[str, Any]] = {}
        self._names: dict[
            str, str
        ] = {}  # address -> worker name (gone from the scheduler on removal)
        self._file: Any = None
        self.scheduler: Any = None
        #: Called with every control request (``transient-control`` topic) by the owning cluster.
        self.on_control: Callable[[dict[str, Any]], None] | None = None
        #: Called with ("joined" | "left", worker name) as workers come and go.
        self.on_membership: Callable[[str, str], None] | None = None

    async def start(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        self._file = open(self.path, "a", buffering=1)
        scheduler.handlers["transient_events"] = self.get_events
        # Workers' own messages: the scheduler adds the sender's address from the worker's
        # connection, so a provider notice cannot be sent in another VM's name.
        scheduler.stream_handlers[PROVIDER_NOTICE_OP] = self.provider_notice
        # Control requests are honoured only from the cluster's own clients: over TLS, a
        # connection whose certificate names the client role (a VM's names worker or ps);
        # never from a worker's stream.
        self._log_event_rpc = scheduler.handlers["log_event"]
        self._log_worker_event = scheduler.stream_handlers["log-event"]
        scheduler.handlers["log_event"] = self._checked_log_event
        scheduler.stream_handlers["log-event"] = self._checked_worker_event

    def _refuse(self, msg: Any, sender: Any) -> None:
        action = msg.get("action") if isinstance(msg, dict) else None
        logger.warning("Refused a control request %r from %s", action, sender)
        self.scheduler.log_event(
            TOPIC, make_event("control-refused", action=action, vm=None, sender=str(sender))
        )

    def _checked_log_event(self, comm: Any, topic: Any, msg: Any) -> Any:
        if _is_control(topic):
            peer = peer_of(comm)
            if peer is not None and peer.role != ROLE_CLIENT:
                self._refuse(msg, peer.name)
                return None
        return self._log_event_rpc(topic=topic, msg=msg)

    def _checked_worker_event(self, worker: str, topic: Any, msg: Any) -> Any:
        if _is_control(topic):
            self._refuse(msg, worker)
            return None
        return self._log_worker_event(worker=worker, topic=topic, msg=msg)

    def provider_notice(self, worker: str, vm: Any = None, **fields: Any) -> None:
        """A worker's report that its VM got the provider's notice (stream op, see gce_agent).

        Honoured only when ``vm`` is the name of the worker that sent it; anything else is
        recorded as refused and ignored.
        """
        ws = self.scheduler.workers.get(worker) if self.scheduler is not None else None
        sender = None if ws is None else str(ws.name)
        if sender is None or sender != str(vm):
            logger.warning("Refused a provider notice for VM %r from worker %s", vm, worker)
            self.scheduler.log_event(
                TOPIC,
                make_event("control-refused", action="provider-notice", vm=str(vm), sender=sender),
            )
            return
        if self.on_control is not None:
            self.on_control({**fields, "action": "provider-notice", "vm": sender})

    def get_events(self, since: int = 0, limit: int | None = None) -> list[dict[str, Any]]:
        """Events from index ``since`` on, at most ``limit`` (RPC handler ``transient_events``).

        ``limit`` lets a worker read the first events (the cluster's ``started``: its time
        scale) without fetching a long run's whole log.
        """
        return self.events[since:] if limit is None else self.events[since : since + limit]

    # -- SchedulerPlugin hooks ---------------------------------------------------------------------
    def log_event(self, topic: str, msg: Any) -> None:
        if topic == CONTROL_TOPIC and isinstance(msg, dict) and self.on_control is not None:
            if msg.get("action") == "provider-notice":
                # Only through provider_notice (the sender checked); never as a posted request.
                self.scheduler.log_event(
                    TOPIC,
                    make_event("control-refused", action="provider-notice", vm=msg.get("vm")),
                )
                return
            self.on_control(msg)
            return
        if topic != TOPIC or not isinstance(msg, dict):
            return
        worker = msg.get("worker")
        if worker in self._names:
            # Events that workers post arrive with the scheduler's stamp of the worker's address.
            msg = {**msg, "worker": self._names[worker], "address": worker}
        if msg.get("kind") == "requested" and msg.get("worker"):
            self._vms[msg["worker"]] = {k: msg.get(k) for k in _VM_FIELDS}
        self.events.append(msg)
        if self._file is not None:
            # One line per event, flushed by line buffering: a crash loses at most a torn line.
            self._file.write(json.dumps(msg, default=str) + "\n")

    def _post_membership(self, kind: str, scheduler: Any, address: str) -> None:
        ws = scheduler.workers.get(address)
        if ws is not None:
            self._names[address] = str(ws.name)
        name = self._names.get(address, address)
        fields = self._vms.get(name, {})
        scheduler.log_event(TOPIC, make_event(kind, worker=name, address=address, **fields))
        if self.on_membership is not None:
            self.on_membership(kind, name)

    def add_worker(self, scheduler: Any, worker: str) -> None:
        self._post_membership("joined", scheduler, worker)

    def remove_worker(
        self, scheduler: Any, worker: str, *, stimulus_id: str, **kwargs: Any
    ) -> None:
        self._post_membership("left", scheduler, worker)

    async def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
