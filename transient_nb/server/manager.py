"""The state behind the JupyterLab panel: every transient cluster of this user, as JSON models.

One :class:`ClusterManager` lives in the Jupyter server. It finds clusters through the on-disk
registry (so clusters created by magics or the Python API in any kernel show up, and those of
crashed kernels show up as stale), reads each live cluster's event log from its scheduler over Dask
RPC (:data:`~transient_nb.eventlog.vocabulary.EVENTS_RPC`), folds it with :class:`~transient_nb.eventlog.folds.ClusterState`
(the notebook panel's fold, so both panels show the same figures) and turns that into one JSON model
per cluster with :func:`~transient_nb.server.model.make_cluster_model`. Control actions
(scale, preempt, stop) travel to the cluster that owns a scheduler as events on the
``transient-control`` topic; the owning kernel's cluster acts on them and answers with a
``control`` event. Clusters started from the panel are detached: each runs in a head process of
its own (:mod:`transient_nb.deploy.head`), started from a thread so that the server keeps answering,
and outlives the server.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from distributed.core import ConnectionPool

from transient_nb import config
from transient_nb.backends.tls import security_from_registry
from transient_nb.catalog.mix import parse_mix
from transient_nb.catalog.prices import PriceCatalog, shipped_catalogs
from transient_nb.deploy import messages, registry
from transient_nb.deploy.detached import launch_head
from transient_nb.eventlog.folds import MAX_GONE_ROWS, ClusterState
from transient_nb.eventlog.records import read_run_record
from transient_nb.eventlog.vocabulary import CONTROL_TOPIC, EVENTS_RPC
from transient_nb.server.model import billing_minimum_s, fingerprint, make_cluster_model

logger = logging.getLogger(__name__)

__all__ = ["MAX_GONE_ROWS", "ClusterManager", "fingerprint", "make_cluster_model"]

#: Parameters the panel's "new cluster" form may send, with the JSON types each accepts.
CREATE_PARAMETERS: dict[str, tuple[type, ...]] = {
    "name": (str,),
    # A number, or a mix of GPU types: {"k80": 2, "v100": 1} or the form's text "k80=2,v100=1".
    "workers": (int, str, dict),
    "gpu": (str,),
    "zone": (str,),
    "spot": (bool,),
    "preemption": (str,),
    "time_scale": (int, float),
    "notice": (str, int, float),
    "provisioning_delay": (str, int, float),
    "prices": (str,),
    "replace": (bool,),
}

_TYPE_NAMES = {
    int: "a whole number",
    float: "a number",
    str: "a string",
    bool: "true or false",
    dict: "an object",
}


class ClusterNotFound(KeyError):
    """No cluster of that name is registered or owned by the manager."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "cluster not found"


# -- the manager ------------------------------------------------------------------------------------
@dataclass
class _Starting:
    """A head being started from the panel: its launch (in a thread) and what the form asked."""

    task: asyncio.Future[Any]
    info: dict[str, Any]


@dataclass
class _Tracked:
    """What the manager remembers about one registered cluster between refreshes."""

    address: str | None
    pid: int | None
    events: list[dict[str, Any]] = field(default_factory=list)
    from_record: bool = False
    model: dict[str, Any] | None = None
    built_at: float = 0.0
    built_from: tuple[int, str] = (-1, "")
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    #: The fold of ``events`` so far (refreshed with the new events only), and the list it folds.
    state: ClusterState | None = None
    state_of: list[dict[str, Any]] | None = None


class ClusterManager:
    """Finds, describes and controls every transient cluster of this user.

    Parameters
    ----------
    rpc_timeout
        Seconds to wait for a scheduler's answer before marking its cluster unreachable.
    answer_timeout
        Seconds to wait for the owning cluster's answer to a control request.
    min_refresh_s
        Refreshes closer together than this share one result: many browser tabs, one scan.

    Examples
    --------
    >>> manager = ClusterManager()
    >>> models = await manager.list_clusters()  # doctest: +SKIP
    >>> await manager.scale("demo", 4)  # doctest: +SKIP
    >>> await manager.close()  # doctest: +SKIP
    """

    def __init__(
        self, rpc_timeout: float = 2.0, answer_timeout: float = 5.0, min_refresh_s: float = 0.25
    ):
        self.rpc_timeout = rpc_timeout
        self.answer_timeout = answer_timeout
        self.min_refresh_s = min_refresh_s
        self._starting: dict[str, _Starting] = {}
        self._tracked: dict[str, _Tracked] = {}
        self._pool: ConnectionPool | None = None
        #: Pools of TLS clusters, one per scheduler (each cluster has its own CA).
        self._tls_pools: dict[str, ConnectionPool] = {}
        self._refreshing: asyncio.Task[list[dict[str, Any]]] | None = None
        self._models: list[dict[str, Any]] = []
        self._refreshed_at = 0.0
        self._closed = False

    # -- reading ----------------------------------------------------------------------------------
    async def _rpc(self, address: str, entry: Mapping[str, Any] | None = None) -> Any:
        security = security_from_registry(entry) if entry is not None else None
        if security is not None:
            # A TLS cluster: its own client certificate (registry files only this user reads).
            pool = self._tls_pools.get(address)
            if pool is None:
                pool = self._tls_pools[address] = await ConnectionPool(
                    limit=4,
                    timeout=self.rpc_timeout,
                    connection_args=security.get_connection_args("client"),
                )
            return pool(address)
        if self._pool is None:
            # One pool for every scheduler: a poll reuses its connection instead of a handshake.
            self._pool = await ConnectionPool(limit=64, timeout=self.rpc_timeout)
        return self._pool(address)

    async def _forget_connections(self, address: str, reason: str) -> None:
        if self._pool is not None:
            self._pool.remove(address, reason=reason)
        pool = self._tls_pools.pop(address, None)
        if pool is not None:
            await pool.close()

    async def _fetch(self, name: str, entry: Mapping[str, Any]) -> tuple[_Tracked, str]:
        """Bring one cluster's events up to date; returns its tracking record and status."""
        address = entry.get("scheduler_address")
        pid = entry.get("pid")
        tracked = self._tracked.get(name)
        if tracked is None or tracked.address != address or tracked.pid != pid:
            # A new cluster, or a new one under an old name: start its log afresh.
            tracked = self._tracked[name] = _Tracked(address, pid)
        async with tracked.lock:
            if entry.get("stale") or not address:
                self._read_record(tracked, entry)
                return tracked, "stale" if entry.get("stale") else "starting"
            try:
                if tracked.from_record:
                    tracked.events, tracked.from_record = [], False
                rpc = await self._rpc(address, entry)
                new = await asyncio.wait_for(
                    getattr(rpc, EVENTS_RPC)(since=len(tracked.events)), self.rpc_timeout
                )
            except Exception as e:
                # Busy, dead, or firewalled: show what we last knew and say so.
                logger.debug("cluster %s at %s unreachable: %r", name, address, e)
                await self._forget_connections(address, "unreachable")
                if not tracked.events:
                    self._read_record(tracked, entry)
                return tracked, "unreachable"
            tracked.events.extend(new)
            return tracked, "running"

    @staticmethod
    def _read_record(tracked: _Tracked, entry: Mapping[str, Any]) -> None:
        """Fill the log from the run record on disk, once (the cluster no longer adds to it)."""
        if tracked.events or not entry.get("run_record"):
            return
        try:
            tracked.events = read_run_record(entry["run_record"])
            tracked.from_record = True
        except OSError:
            pass

    def _build(self, name: str, entry: Mapping[str, Any], tracked: _Tracked, status: str) -> None:
        key = (len(tracked.events), status)
        # Rebuild on news, and every second while VMs bill (the $ figures move).
        if tracked.model is None or key != tracked.built_from or time.time() - tracked.built_at > 1:
            state = tracked.state
            if state is None or tracked.state_of is not tracked.events:
                # First build, or the log was replaced (read again from the scheduler): refold.
                state = tracked.state = ClusterState(
                    minimum_s=billing_minimum_s(entry, tracked.events)
                )
                tracked.state_of = tracked.events
            state.follow(tracked.events)
            tracked.model = make_cluster_model(
                entry,
                tracked.events,
                status=status,
                owner="head" if entry.get("detached") else "kernel",
                state=state,
            )
            tracked.built_at, tracked.built_from = time.time(), key

    async def _model(self, entry: Mapping[str, Any]) -> dict[str, Any]:
        name = str(entry["name"])
        tracked, status = await self._fetch(name, entry)
        self._build(name, entry, tracked, status)
        assert tracked.model is not None
        return tracked.model

    async def _scan(self) -> list[dict[str, Any]]:
        entries = {str(e["name"]): e for e in registry.entries()}
        models = list(await asyncio.gather(*(self._model(e) for e in entries.values())))
        for name in list(self._tracked):
            if name not in entries:
                tracked = self._tracked.pop(name)
                if tracked.address:
                    await self._forget_connections(tracked.address, "cluster gone")
        for name, pending in list(self._starting.items()):
            if name in entries:
                continue
            # Started from the panel, not registered yet: its head is still coming up.
            entry = {"name": name, "pid": None, **pending.info}
            models.append(make_cluster_model(entry, [], status="starting", owner="head"))
        models.sort(key=lambda m: m["name"])
        self._models, self._refreshed_at = models, time.monotonic()
        return models

    async def list_clusters(self) -> list[dict[str, Any]]:
        """The model of every cluster: registered ones (live, stale or unreachable) and those
        this manager is starting. Concurrent callers share one scan."""
        if self._refreshing is None:
            if time.monotonic() - self._refreshed_at < self.min_refresh_s:
                return self._models
            self._refreshing = asyncio.ensure_future(self._scan())
            self._refreshing.add_done_callback(lambda _: setattr(self, "_refreshing", None))
        return await asyncio.shield(self._refreshing)

    async def get_cluster(self, name: str) -> dict[str, Any]:
        """The model of cluster ``name``; :class:`ClusterNotFound` if there is none."""
        for m in await self.list_clusters():
            if m["name"] == name:
                return m
        known = ", ".join(m["name"] for m in self._models) or "none"
        raise ClusterNotFound(f"No transient cluster named {name!r} (known: {known}).")

    async def wait_for_change(
        self,
        version: str | None,
        timeout: float,
        interval: float = 0.5,
        gone: Callable[[], bool] | None = None,
    ) -> tuple[list[dict[str, Any]], str]:
        """The models and their fingerprint, as soon as the fingerprint differs from ``version``
        or after ``timeout`` seconds (a long poll: news within ``interval``, few requests when
        nothing happens). ``gone()`` tells when the client stopped waiting."""
        deadline = time.monotonic() + timeout
        while True:
            models = await self.list_clusters()
            current = fingerprint(models)
            if current != version or time.monotonic() >= deadline or self._closed:
                return models, current
            if gone is not None and gone():  # the client hung up: stop scanning for it
                return models, current
            await asyncio.sleep(min(interval, max(0.0, deadline - time.monotonic())))

    # -- creating -------------------------------------------------------------------------------
    async def create(self, params: Mapping[str, Any], wait: float = 30.0) -> dict[str, Any]:
        """Start a detached cluster (a head process of its own; on GCE a head VM), as the panel's form asks.

        The head outlives this server: a cluster started from the panel runs on when JupyterLab
        stops, and is stopped from the panel, the CLI (``transient-nb down``) or a notebook. The
        head starts in a thread, so the server answers other requests meanwhile.

        Parameters
        ----------
        params
            Keyword arguments of :class:`~transient_nb.deploy.cluster.TransientCluster` among
            :data:`CREATE_PARAMETERS`; anything else, or a wrong type, is a ``ValueError``.
        wait
            Seconds to wait for the head to register the cluster before answering with its
            model (the workers keep coming up afterwards); the head goes on starting after that.
        """
        if not isinstance(params, Mapping):
            raise ValueError("Send the new cluster's parameters as a JSON object.")
        kwargs: dict[str, Any] = {}
        for key, value in params.items():
            if key not in CREATE_PARAMETERS:
                allowed = ", ".join(CREATE_PARAMETERS)
                raise ValueError(f"Unknown parameter {key!r}: use some of {allowed}.")
            if value is None or value == "":
                continue  # left blank in the form: the configured default
            types = CREATE_PARAMETERS[key]
            if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
                kind = " or ".join(_TYPE_NAMES[t] for t in types)
                raise ValueError(f"{key}={value!r} must be {kind}.")
            if key == "prices" and value not in shipped_catalogs():
                # A path from a request would have the server read any YAML file it can: a
                # catalog file of one's own is for Python or the CLI.
                raise ValueError(
                    f"prices={value!r} is not one of the packaged price catalogs "
                    f"({', '.join(shipped_catalogs())}); a catalog file of your own is passed "
                    "from Python (TransientCluster(prices='/path/catalog.yaml')) or the CLI "
                    "(transient-nb up --prices /path/catalog.yaml)."
                )
            if key == "workers" and not isinstance(value, int):
                # The form's one text field takes a mix too; refused here, before any head. (JSON
                # numbers stay numbers: "2" is a typo of the client, not a mix.)
                if isinstance(value, str) and "=" not in value:
                    raise ValueError(
                        f"workers={value!r} must be a whole number, or a mix such as k80=2,v100=1."
                    )
                value = parse_mix(cast(Any, value), "")
            kwargs[key] = value
        name = str(kwargs.pop("name", None) or f"transient-{uuid.uuid4().hex[:6]}")
        if name in self._starting:
            raise ValueError(f"A transient cluster named {name!r} is already starting.")
        registry.check_free(name)
        # The head checks everything (GPU, zone, preemption spec) before it starts anything, and
        # says what was wrong (launch raises its ValueError here).
        task = asyncio.ensure_future(asyncio.to_thread(launch_head, kwargs, name=name))
        info = {k: kwargs.get(k) for k in ("backend", "gpu", "zone", "spot")}
        self._starting[name] = _Starting(task, info)
        task.add_done_callback(functools.partial(self._started, name))
        try:
            await asyncio.wait_for(asyncio.shield(task), wait)
        except asyncio.TimeoutError:
            pass  # still starting: the listing shows it so, and it registers later
        self._refreshed_at = 0.0  # the next listing must show it
        if task.done():
            task.result()  # the head refused: its ValueError goes back to the form
            return await self.get_cluster(name)
        entry = {"name": name, "pid": None, **info}
        return make_cluster_model(entry, [], status="starting", owner="head")

    def _started(self, name: str, task: asyncio.Future[Any]) -> None:
        self._starting.pop(name, None)
        self._refreshed_at = 0.0
        if not task.cancelled() and task.exception() is not None:
            # Retrieved here (the form may have had its answer already); the log keeps it.
            logger.warning("cluster %s failed to start: %s", name, task.exception())

    # -- controlling ------------------------------------------------------------------------------
    async def _entry(self, name: str) -> dict[str, Any]:
        for entry in registry.entries():
            if entry["name"] == name:
                return entry
        if name in self._starting:
            raise ValueError(f"Cluster {name!r} is still starting; try again in a moment.")
        known = ", ".join(e["name"] for e in registry.entries()) or "none"
        raise ClusterNotFound(f"No transient cluster named {name!r} (known: {known}).")

    async def _control(self, name: str, msg: dict[str, Any]) -> dict[str, Any]:
        """Post a control request on the cluster's scheduler and wait for its owner's answer."""
        entry = await self._entry(name)
        if entry.get("stale"):
            raise ValueError(
                f"Cluster {name!r} is stale: the process that owned it (pid {entry.get('pid')}) "
                "is gone, so nothing can act on it. Stop it to remove it from the list."
            )
        req = messages.ControlRequest(msg)
        tracked, status = await self._fetch(name, entry)
        if status != "running":
            raise ValueError(f"Cluster {name!r} is {status}: its scheduler does not answer.")
        rpc = await self._rpc(entry["scheduler_address"], entry)
        await asyncio.wait_for(rpc.log_event(topic=CONTROL_TOPIC, msg=req.msg), self.rpc_timeout)
        deadline = time.monotonic() + self.answer_timeout
        seen = 0
        while time.monotonic() < deadline:
            tracked, status = await self._fetch(name, entry)
            if req.answer_in(tracked.events[seen:]) is not None:
                self._refreshed_at = 0.0
                return {"request": req.id, "answered": True, "action": req.action}
            seen = len(tracked.events)
            if status != "running":
                break
            await asyncio.sleep(0.05)
        # Posted but not answered yet: the owning kernel acts when its loop gets to it.
        return {"request": req.id, "answered": False, "action": req.action}

    async def scale(
        self, name: str, workers: Any, gpu: Any = None, on_demand: Any = None
    ) -> dict[str, Any]:
        """Ask cluster ``name`` to keep ``workers`` GPU workers (of type ``gpu``), or a mix.

        ``workers``: a number (of type ``gpu`` if given; a mixed cluster needs it), or a whole
        mix, ``{"k80": 2, "v100": 1}`` or ``"k80=2,v100=1"``. ``on_demand``: how many of them
        run on demand (never revoked), a number or a mix such as ``"p100=1"`` (0: none; left
        out: as before). The owning cluster checks the counts against its mix.
        """
        return await self._control(name, messages.scale_message(workers, gpu, on_demand))

    async def move_ps(self, name: str, zone: Any, reason: Any = "") -> dict[str, Any]:
        """Ask cluster ``name`` to move its PS hosts to ``zone`` (one of its ``zones``: its own
        and its fallback zones); a run moves its PS onto the new hosts from the PS's state."""
        return await self._control(name, messages.move_ps_message(zone, reason))

    async def scale_ps(self, name: str, hosts: Any) -> dict[str, Any]:
        """Ask cluster ``name`` to keep ``hosts`` PS hosts (it only grows; at most 4): a run
        started without ``shards=`` splits its PS onto them."""
        return await self._control(name, messages.scale_ps_message(hosts))

    async def preempt(self, name: str, worker: Any, notice: Any = True) -> dict[str, Any]:
        """Preempt worker ``worker`` of cluster ``name``, with or without the notice."""
        return await self._control(name, messages.preempt_message(worker=worker, notice=notice))

    async def adapt(self, name: str, goal: Any) -> dict[str, Any]:
        """Turn a transient-aware policy on for cluster ``name``, or off.

        ``goal``: ``"deadline:2h"``, ``"budget:20"``, ``"cost-per-step"`` or ``"off"`` (as in
        ``%transient_cluster adapt``); checked here, before the cluster is asked.
        """
        from transient_nb.policy.goals import parse_goal

        if not isinstance(goal, str) or not goal.strip():
            raise ValueError(
                f"goal={goal!r}: give deadline:DURATION (e.g. deadline:2h), budget:DOLLARS "
                "(e.g. budget:20), cost-per-step, or off."
            )
        name_, args = parse_goal(goal)
        return await self._control(name, messages.adapt_message(name_, **args))

    async def stop(self, name: str) -> dict[str, Any]:
        """Stop cluster ``name``; a stale entry (its owner is gone) is just removed."""
        pending = self._starting.get(name)
        if pending is not None:
            # Still starting: wait for its head to register, then stop it like any other.
            await asyncio.shield(pending.task)
        entry = await self._entry(name)
        if entry.get("stale"):
            registry.unregister(name)
            self._refreshed_at = 0.0
            return {"action": "stop", "answered": True, "removed": True}
        return await self._control(name, messages.stop_message())

    async def close(self) -> None:
        """Close connections (server shutdown). Clusters started from the panel are detached:
        they run on, and the panel of the next server lists them again."""
        self._closed = True
        if self._pool is not None:
            await self._pool.close()
            self._pool = None
        for pool in self._tls_pools.values():
            await pool.close()
        self._tls_pools.clear()

    # -- the form -----------------------------------------------------------------------------------
    def options(self) -> dict[str, Any]:
        """What the "new cluster" form offers: defaults from the configuration, and the GPU types
        and zones of the configured price catalog."""
        catalog = PriceCatalog.load()
        return {
            "defaults": {
                "workers": config.get("workers"),
                "gpu": config.get("gpu"),
                "zone": config.get("zone"),
                "spot": config.get("spot"),
                "preemption": config.get("preemption"),
                "time_scale": config.get("time-scale"),
                "notice": str(config.get("notice")),
                "provisioning_delay": str(config.get("provisioning-delay")),
            },
            "gpus": catalog.gpus(),
            "zones": catalog.zones(),
            "catalog": catalog.name,
            "catalogs": shipped_catalogs(),
            "preemption_examples": ["none", "paper", "paper:k80", "paper:v100", "exp:mean=60s"],
            # The workers field takes a number or a mix of the catalog's GPU types.
            "workers_examples": ["4", "k80=2,p100=1,v100=1"],
        }
