"""The parameter server: a Dask actor on the never-preemptible ``ps`` worker.

Asynchronous data-parallel training as in Li et al.: every trainer pushes its gradient and gets
the new weights back in the same call (one round trip per step); each accepted push is one global
step. The server applies momentum SGD with L2 weight decay (:func:`~.optim.momentum_sgd_`) and the
paper's learning-rate schedule, divided by sqrt of the number of ACTIVE trainers, and records each
update's staleness. Several shards split the flat parameter vector when one server is the
bottleneck.

Methods are coroutines, so Dask runs them on the worker's event loop: no thread hop per call, and
each update is atomic with respect to the others. Every reply is a fresh buffer: Dask's TCP comm
sends numpy memory without copying it, so replying with the live weights would let the next
update change the bytes of a reply that is still being sent.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import cloudpickle
import numpy as np
from distributed import get_worker

from transient_nb.eventlog.vocabulary import TOPIC, make_event
from transient_nb.training import checkpoint
from transient_nb.training.emulation import ServicePacer, cluster_time_scale_async, parse_emulation
from transient_nb.training.hparams import HParams
from transient_nb.training.optim import META_KEY, ShardOptimizer, lr_scale, momentum_sgd_
from transient_nb.training.wire.codec import from_wire, to_wire
from transient_nb.training.wire.server import serve_ps

logger = logging.getLogger(__name__)

#: (weights on the wire, batch-norm statistics or None, version): what pull and push_pull return.
Reply = tuple[np.ndarray, "np.ndarray | None", int]


def shard_bounds(n: int, shards: int) -> list[tuple[int, int]]:
    """Contiguous, nearly equal slices of a vector of length ``n``.

    Examples
    --------
    >>> shard_bounds(10, 3)
    [(0, 3), (3, 7), (7, 10)]
    """
    edges = np.linspace(0, n, shards + 1).round().astype(int)
    return [(int(edges[i]), int(edges[i + 1])) for i in range(shards)]


def regroup(states: Sequence[Mapping[str, Any]], shards: int) -> list[dict[str, Any]]:
    """The shards' states (``weights``, ``momentum``, ``bn``) split again into ``shards``.

    A run whose PS gains a shard (a new PS host), or is recovered from a checkpoint written with
    another number of shards, joins the slices and cuts them along :func:`shard_bounds`; the
    statistics stay with shard 0. A missing momentum (a fresh start) stays missing.

    Examples
    --------
    >>> old = [{"weights": np.arange(3.0), "momentum": np.zeros(3), "bn": np.ones(2)},
    ...        {"weights": np.arange(3.0, 5.0), "momentum": np.ones(2), "bn": None}]
    >>> new = regroup(old, 3)
    >>> [s["weights"].tolist() for s in new], [s["momentum"].tolist() for s in new]
    ([[0.0, 1.0], [2.0], [3.0, 4.0]], [[0.0, 0.0], [0.0], [1.0, 1.0]])
    >>> [s["bn"] is not None for s in new]
    [True, False, False]
    """
    weights = np.concatenate([np.asarray(s["weights"]) for s in states])
    momenta = [s.get("momentum") for s in states]
    momentum: np.ndarray | None = None
    if all(m is not None for m in momenta):
        momentum = np.concatenate([np.asarray(m) for m in momenta])
    bn = states[0].get("bn") if states else None
    bounds = shard_bounds(len(weights), shards)
    opts = _regroup_optimizer(states, bounds)
    return [
        {
            "weights": weights[a:b],
            "momentum": None if momentum is None else momentum[a:b],
            "bn": bn if i == 0 else None,
            "opt": opts[i],
        }
        for i, (a, b) in enumerate(bounds)
    ]


def _regroup_optimizer(
    states: Sequence[Mapping[str, Any]], bounds: list[tuple[int, int]]
) -> list[dict[str, np.ndarray] | None]:
    """A torch optimizer's state (``opt`` of each shard) cut along new ``bounds``: arrays with
    one entry per weight are joined and cut; the rest (the JSON, a step count) is shard 0's."""
    opts = [s.get("opt") for s in states]
    if not opts or any(not o for o in opts):
        return [None] * len(bounds)
    sizes = [len(np.asarray(s["weights"])) for s in states]
    first: Mapping[str, np.ndarray] = opts[0]  # type: ignore[assignment]
    out: list[dict[str, np.ndarray] | None] = []
    for a, b in bounds:
        piece: dict[str, np.ndarray] = {}
        for key, value in first.items():
            parts = [np.asarray(o[key]) for o in opts]  # type: ignore[index]
            per_weight = key != META_KEY and all(
                p.shape == (n,) for p, n in zip(parts, sizes, strict=True)
            )
            piece[key] = np.concatenate(parts)[a:b] if per_weight else np.asarray(value)
        out.append(piece)
    return out


def _window(t: float) -> dict[str, float]:
    """The PS's ``metrics`` window from ``t``: its updates, images, summed loss and staleness,
    and the most trainers active at its updates."""
    return {"t": t, "last": t, "updates": 0, "images": 0, "loss": 0.0, "stale": 0, "active": 0}


class ParameterServer:
    """One shard of the parameters, with its optimizer state.

    Parameters
    ----------
    run
        Run id (goes into every event and checkpoint).
    shard, shards
        This shard's index and the number of shards.
    weights
        This shard's slice of the flat float32 parameter vector.
    decay_mask
        Which of those entries get weight decay (weights of convs and dense layers).
    bn
        Flat batch-norm running statistics (shard 0 only keeps them).
    hparams
        :class:`HParams` as a dict.
    checkpoint_url
        fsspec URL of the run's checkpoint folder.
    version, momentum
        Where to resume from (a checkpoint), if anywhere.
    parameters
        The whole model's trainable parameters, for a user's model: an emulated PS
        (``emulate="paper"``) serves in a time scaled from the paper's model to this size.
    optimizer, opt_state
        A ``torch.optim`` optimizer (class or factory, cloudpickled) to apply instead of the
        paper's momentum SGD, and its state to resume (:meth:`~.optim.ShardOptimizer.state_arrays`).
    model
        Model name (recorded in checkpoints).
    generation
        How many times the run's PS was re-created before this one.
    counters
        Bookkeeping to resume (``accepted``, ``last_local``, ``gaps``, ``lost_in_flight``), as in
        :meth:`counters`.
    """

    def __init__(
        self,
        run: str,
        shard: int,
        shards: int,
        weights: np.ndarray,
        decay_mask: np.ndarray,
        bn: np.ndarray | None,
        hparams: dict[str, Any],
        checkpoint_url: str,
        version: int = 0,
        momentum: np.ndarray | None = None,
        model: str = "",
        generation: int = 0,
        counters: dict[str, Any] | None = None,
        optimizer: bytes | None = None,
        opt_state: Mapping[str, np.ndarray] | None = None,
        parameters: int | None = None,
    ):
        self.run = run
        self.shard = shard
        self.shards = shards
        self.hp = HParams.from_dict(hparams)
        self.w = np.array(weights, dtype=np.float32, copy=True)
        self.decay = np.asarray(decay_mask, dtype=np.float32) * self.hp.weight_decay
        self.v = np.zeros_like(self.w) if momentum is None else np.array(momentum, dtype=np.float32)
        #: A user's torch optimizer over this shard (None: the paper's momentum SGD).
        self.opt: ShardOptimizer | None = None
        if optimizer is not None:
            self.opt = ShardOptimizer(cloudpickle.loads(optimizer), self.w, opt_state)
            self.v = np.zeros(0, dtype=np.float32)  # its own state replaces the momentum
        self.bn = None if bn is None else np.array(bn, dtype=np.float32, copy=True)
        self.version = int(version)
        self.checkpoint_url = checkpoint_url
        self.model = model
        #: The whole model's trainable parameters, for a user's model (the paced PS's service
        #: time scales with them); None for the built-in ones (the paper's PS figures).
        self.parameters = parameters
        self.generation = generation
        self.started = time.time()
        try:
            self._worker: Any = get_worker()
        except ValueError:  # built outside a worker (unit tests)
            self._worker = None
        c = counters or {}
        self.accepted: dict[str, int] = {k: int(v) for k, v in c.get("accepted", {}).items()}
        self.last_local: dict[str, int] = {k: int(v) for k, v in c.get("last_local", {}).items()}
        self.gaps = int(c.get("gaps", 0))  # local steps that never arrived (lost gradients)
        self.lost_in_flight = int(c.get("lost_in_flight", 0))
        self.registered: set[str] = set()
        self.last_seen: dict[str, float] = {}  # monotonic time of each trainer's last call
        self.computing: dict[str, bool] = {}
        self.finals: set[str] = set()  # trainers whose last gradient arrived with a notice
        self.last_checkpoint = self.version
        self._window = _window(time.time())
        self._lr = 0.0  # the learning rate of the newest update (what a flushed window reports)
        self._snapshot: dict[str, Any] | None = None
        # Paced emulation of the paper's PS capacity (``hparams["emulate"]`` with ``ps=``): set
        # up at the first push, once the cluster's time scale is read from its event log.
        emu = parse_emulation(self.hp.emulate)
        self._ps_capacity = emu if emu is not None and emu.ps_steps_per_s is not None else None
        self._service: ServicePacer | None = None
        self._data_server: Any = None  # the data plane's server, once a trainer asks for it

    # -- membership ------------------------------------------------------------------------------
    def active(self) -> list[str]:
        """Trainers that registered and called within the last ``call_timeout_s``.

        A trainer that stopped calling (its worker frozen, or it is rejoining after a slow call)
        stops counting at once, so the learning rate is not divided by a worker that no longer
        pushes; its next call counts it again.
        """
        now = time.monotonic()
        lease = self.hp.call_timeout_s
        return sorted(t for t in self.registered if now - self.last_seen.get(t, 0.0) <= lease)

    async def register(self, trainer: str, local_step: int = 0) -> int:
        """A trainer (re)joins having pushed ``local_step`` gradients; returns the active count."""
        self.registered.add(trainer)
        self.last_seen[trainer] = time.monotonic()
        self.last_local[trainer] = int(local_step)
        self.finals.discard(trainer)
        return len(self.active())

    async def unregister(self, trainer: str, drained: bool = True) -> bool:
        """A trainer stopped; ``drained=False`` means it was lost (its worker died).

        Returns True when that cost a gradient: the trainer had its weights and was computing.
        """
        lost = False
        if trainer in self.registered:
            self.registered.discard(trainer)
            if not drained and self.computing.get(trainer):
                # It had the weights and was computing a gradient that will never arrive.
                self.lost_in_flight += 1
                lost = True
            self.computing[trainer] = False
        return lost

    # -- the one round trip ------------------------------------------------------------------------
    def _apply(self, grad: np.ndarray, lr: float) -> None:
        momentum_sgd_(self.w, self.v, grad, self.decay, lr, self.hp.momentum)

    def _reply(self) -> Reply:
        bn = None if self.bn is None else self.bn.copy()
        return to_wire(self.w, self.hp.wire_dtype), bn, self.version

    async def pull(self, trainer: str | None = None) -> Reply:
        """Current weights (a fresh buffer in the wire dtype), batch-norm statistics and version."""
        if trainer is not None:
            self.computing[trainer] = True
            self.last_seen[trainer] = time.monotonic()
        return self._reply()

    async def push_pull(
        self,
        *,
        trainer: str,
        grad: np.ndarray,
        base_version: int,
        local_step: int,
        loss: float = 0.0,
        images: int = 0,
        bn_delta: np.ndarray | None = None,
        final: bool = False,
    ) -> Reply:
        """Apply one gradient (one global step) and return the new weights.

        ``base_version`` is the version the gradient was computed from (its staleness is the
        difference); ``local_step`` counts the trainer's gradients from 1, so a jump means lost
        gradients; ``final`` marks the last push of a trainer that is draining. With an emulated
        PS capacity, the push first waits for its service slot (:class:`ServicePacer`).
        """
        if self._ps_capacity is not None:
            await self._pace_service()
        t_work = time.perf_counter()
        active = max(1, len(self.active()))
        grad = from_wire(grad, self.hp.wire_dtype)
        if self.opt is None:
            lr = self.hp.lr_at(self.version, active)
            self._apply(grad, lr)
        else:  # the user's optimizer; its LR follows the active workers as the paper's does
            self.opt.step(grad, lr_scale(active, self.hp.scale_lr_by_active_workers))
            lr = self.opt.lr
        if bn_delta is not None and self.bn is not None:
            self.bn += bn_delta
        stale = max(0, self.version - int(base_version))
        self.version += 1
        self.accepted[trainer] = self.accepted.get(trainer, 0) + 1
        last = self.last_local.get(trainer, 0)
        if local_step > last + 1:
            self.gaps += local_step - last - 1
        self.last_local[trainer] = max(last, int(local_step))
        self.computing[trainer] = not final
        self.last_seen[trainer] = time.monotonic()
        if final:
            self.registered.discard(trainer)
            self.finals.add(trainer)
        else:
            self.registered.add(trainer)
        win = self._window
        win["updates"] += 1
        win["images"] += images
        win["loss"] += loss
        win["stale"] += stale
        # The most trainers active during the window (not at its posting: a window flushed at
        # the run's end, after the trainers drained, would say none).
        win["active"] = max(win["active"], len(self.active()))
        self._lr = lr
        now = time.time()
        win["last"] = now
        if self.shard == 0 and now - win["t"] >= self.hp.metrics_interval_s:
            self._post_metrics(now, lr)
        reply = self._reply()
        if self._service is not None:
            self._service.worked(time.perf_counter() - t_work)
            behind = self._service.behind()
            if behind is not None:
                self._post("emulation-behind", worker=self._host(), role="ps", **behind)
        return reply

    async def data_endpoint(self) -> dict[str, Any]:
        """Where this shard's data plane listens (:mod:`~transient_nb.training.wire`), started
        at the first ask; ``{}`` when the bytes stay on this actor (``data_plane="dask"``)."""
        if self._data_server is None:
            name = f"{self.run}-g{self.generation}-s{self.shard}"
            self._data_server = serve_ps(self, self._worker, self.hp, name) or False
        return dict(self._data_server.endpoint) if self._data_server else {}

    def _host(self) -> str:
        return str(self._worker.name) if self._worker is not None else "ps"

    async def _pace_service(self) -> None:
        if self._service is None:
            assert self._ps_capacity is not None
            scale = await cluster_time_scale_async(self._worker)
            service_s = self._ps_capacity.ps_service_s(
                self.shards, scale, self.hp.emulate_step_scale, parameters=self.parameters
            )
            if self._service is None and service_s is not None:  # another push may have won
                self._service = ServicePacer(service_s)
                self._post(
                    "emulation-paced",
                    worker=self._host(),
                    role="ps",
                    steps_per_s=1.0 / (service_s * scale / self.hp.emulate_step_scale),
                    wall_steps_per_s=1.0 / service_s,
                    time_scale=scale,
                    step_scale=self.hp.emulate_step_scale,
                )
        if self._service is not None:
            await self._service.serve()

    def _post_metrics(self, now: float, lr: float) -> None:
        """Post the window's ``metrics`` up to ``now``, dated ``now``."""
        win = self._window
        dt = now - win["t"]
        n = max(1, win["updates"])
        self._post(
            "metrics",
            time=now,
            step=self.version,
            loss=win["loss"] / n,
            lr=lr,
            active_workers=int(win["active"]) if win["updates"] else len(self.active()),
            staleness=win["stale"] / n,
            img_per_s=win["images"] / dt if dt > 0 else 0.0,
            steps_per_s=win["updates"] / dt if dt > 0 else 0.0,
            updates=win["updates"],
        )
        self._window = _window(now)

    def _post(self, kind: str, **fields: Any) -> None:
        if self._worker is not None:
            self._worker.log_event(
                TOPIC, make_event(kind, run=self.run, shard=self.shard, **fields)
            )

    # -- checkpoints: the driver takes every shard's snapshot, then has each write it -------------
    def counters(self) -> dict[str, Any]:
        """The bookkeeping that a checkpoint carries (JSON-friendly)."""
        return {
            "accepted": dict(self.accepted),
            "last_local": dict(self.last_local),
            "gaps": self.gaps,
            "lost_in_flight": self.lost_in_flight,
        }

    async def snapshot(self, align_version: int | None = None) -> dict[str, Any]:
        """Copy this shard's state for a checkpoint; returns its version and counters.

        ``align_version`` (shards 1+, given shard 0's version) sets this shard's version to the
        agreed one: a push that reached only some shards (its trainer died between them) would
        otherwise leave the shards' versions apart for good.
        """
        if align_version is not None:
            self.version = int(align_version)
        self._snapshot = {
            "step": self.version,
            "arrays": {
                "weights": self.w.copy(),
                "momentum": self.v.copy() if self.opt is None else None,
                "decay_mask": (self.decay > 0).astype(np.uint8),
                "bn": None if self.bn is None else self.bn.copy(),
                **(self.opt.state_arrays() if self.opt is not None else {}),
            },
        }
        return {"step": self.version, "counters": self.counters()}

    async def write_snapshot(self, step: int) -> dict[str, Any]:
        """Write the snapshot of version ``step`` (off the event loop); returns its manifest entry."""
        snap = self._snapshot
        if snap is None or snap["step"] != step:
            raise RuntimeError(f"Shard {self.shard} holds no snapshot of step {step}.")
        entry = await asyncio.to_thread(
            checkpoint.write_shard, self.checkpoint_url, step, self.shard, snap["arrays"]
        )
        self._snapshot = None
        self.last_checkpoint = max(self.last_checkpoint, step)
        return entry

    async def get_state(self) -> dict[str, Any]:
        """Copies of the weights, momentum, statistics and counters (evaluation, recovery)."""
        return {
            "weights": self.w.copy(),
            "momentum": self.v.copy() if self.opt is None else None,
            "bn": None if self.bn is None else self.bn.copy(),
            "opt": self.opt.state_arrays() if self.opt is not None else None,
            "step": self.version,
            "counters": self.counters(),
        }

    async def flush_metrics(self) -> int | None:
        """Post the ``metrics`` of the updates since the last one now (the driver, at a run's
        end: a run shorter than ``metrics_interval_s`` has a curve too); returns the step it
        posted at, or None when no update was waiting."""
        if self.shard != 0 or not self._window["updates"]:
            return None
        # Dated at the window's last update, not now: the run's end (its evaluation, the
        # driver's calls) is no training time, and measures of a run's pace read these times.
        self._post_metrics(self._window["last"], self._lr)
        return self.version

    async def status(self) -> dict[str, Any]:
        """Counters for the driver: version, active trainers, accepted and lost updates."""
        return {
            "step": self.version,
            "generation": self.generation,
            "active": self.active(),
            "accepted": dict(self.accepted),
            "gaps": self.gaps,
            "lost_in_flight": self.lost_in_flight,
            "drained": sorted(self.finals),
            "last_checkpoint": self.last_checkpoint,
            "uptime": time.time() - self.started,
        }
