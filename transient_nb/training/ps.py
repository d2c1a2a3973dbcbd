"""The parameter server: a Dask actor on the never-preemptible ``ps`` worker.

Asynchronous data-parallel training as in Li et al.: every trainer pushes its gradient and gets
the new weights back in the same call (one round trip per step); each accepted push is one global
step. The server applies momentum SGD with L2 weight decay and the paper's learning-rate schedule,
divided by sqrt of the number of ACTIVE trainers, and records each update's staleness. Several
shards split the flat parameter vector when one server is the bottleneck.

Methods are coroutines, so Dask runs them on the worker's event loop: no thread hop per call, and
each update is atomic with respect to the others.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import numpy as np
from distributed import get_worker

from transient_nb.events import TOPIC, make_event
from transient_nb.training import checkpoint
from transient_nb.training.hparams import HParams

logger = logging.getLogger(__name__)


def shard_bounds(n: int, shards: int) -> list[tuple[int, int]]:
    """Contiguous, nearly equal slices of a vector of length ``n``."""
    edges = np.linspace(0, n, shards + 1).round().astype(int)
    return [(int(edges[i]), int(edges[i + 1])) for i in range(shards)]


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
    model
        Model name (recorded in checkpoints).
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
    ):
        self.run = run
        self.shard = shard
        self.shards = shards
        self.hp = HParams(
            **{
                **hparams,
                "decay_at": tuple(hparams["decay_at"]),
                "decay_factors": tuple(hparams["decay_factors"]),
            }
        )
        self.w = np.array(weights, dtype=np.float32, copy=True)
        self.decay = np.asarray(decay_mask, dtype=np.float32) * self.hp.weight_decay
        self.v = np.zeros_like(self.w) if momentum is None else np.array(momentum, dtype=np.float32)
        self.bn = None if bn is None else np.array(bn, dtype=np.float32, copy=True)
        self.version = int(version)
        self.checkpoint_url = checkpoint_url
        self.model = model
        self.generation = generation
        self.started = time.time()
        try:
            self._worker: Any = get_worker()
        except ValueError:  # built outside a worker (unit tests)
            self._worker = None
        self.active: set[str] = set()
        self.accepted: dict[str, int] = {}
        self.last_local: dict[str, int] = {}
        self.gaps = 0  # local steps that never arrived (lost gradients), over all trainers
        self.computing: dict[str, bool] = {}
        self.lost_in_flight = 0
        self.finals: set[str] = set()  # trainers whose last gradient arrived with a notice
        self.last_checkpoint = self.version
        self._window = {"t": time.time(), "updates": 0, "images": 0, "loss": 0.0, "stale": 0}
        self._ckpt_task: asyncio.Future[Any] | None = None

    # -- membership ------------------------------------------------------------------------------
    async def register(self, trainer: str, local_step: int = 0) -> int:
        """A trainer starts pushing after its gradient number ``local_step``; returns the number
        of active trainers."""
        self.active.add(trainer)
        self.last_local[trainer] = max(self.last_local.get(trainer, 0), local_step)
        return len(self.active)

    async def unregister(self, trainer: str, drained: bool = True) -> bool:
        """A trainer stopped; ``drained=False`` means it was lost (its worker died).

        Returns True when that cost a gradient: the trainer had its weights and was computing.
        """
        lost = False
        if trainer in self.active:
            self.active.discard(trainer)
            if not drained and self.computing.get(trainer):
                # It had the weights and was computing a gradient that will never arrive.
                self.lost_in_flight += 1
                lost = True
            self.computing[trainer] = False
        return lost

    # -- the one round trip ------------------------------------------------------------------------
    def _wire(self, x: np.ndarray) -> np.ndarray:
        return x.astype(np.float16) if self.hp.wire_dtype == "float16" else x

    async def pull(self, trainer: str | None = None) -> tuple[np.ndarray, np.ndarray | None, int]:
        """Current weights, batch-norm statistics and version."""
        if trainer is not None:
            self.computing[trainer] = True
        return self._wire(self.w), self.bn, self.version

    async def push_pull(
        self,
        trainer: str,
        grad: np.ndarray,
        base_version: int,
        local_step: int,
        loss: float = 0.0,
        images: int = 0,
        bn_delta: np.ndarray | None = None,
        final: bool = False,
    ) -> tuple[np.ndarray, np.ndarray | None, int]:
        """Apply one gradient (one global step) and return the new weights.

        ``local_step`` counts the trainer's gradients from 1; a jump means lost gradients.
        """
        g = grad.astype(np.float32, copy=False)
        lr = self.hp.lr_at(self.version, max(1, len(self.active)))
        # TF-style momentum SGD with L2 on weights: v = mu*v + (g + wd*w); w -= lr*v
        self.v *= self.hp.momentum
        self.v += g
        self.v += self.decay * self.w
        self.w -= lr * self.v
        if bn_delta is not None and self.bn is not None:
            self.bn += bn_delta
        stale = max(0, self.version - base_version)
        self.version += 1
        self.accepted[trainer] = self.accepted.get(trainer, 0) + 1
        last = self.last_local.get(trainer, 0)
        if local_step > last + 1:
            self.gaps += local_step - last - 1
        self.last_local[trainer] = max(last, local_step)
        self.computing[trainer] = not final
        self.active.add(trainer)
        if final:
            self.active.discard(trainer)
            self.finals.add(trainer)
        win = self._window
        win["updates"] += 1
        win["images"] += images
        win["loss"] += loss
        win["stale"] += stale
        now = time.time()
        if self.shard == 0 and now - win["t"] >= self.hp.metrics_interval_s:
            self._post_metrics(now, lr)
        if self.version % self.hp.checkpoint_every == 0:
            self._start_checkpoint()
        return self._wire(self.w), self.bn, self.version

    def _post_metrics(self, now: float, lr: float) -> None:
        win = self._window
        dt = now - win["t"]
        n = max(1, win["updates"])
        self._post(
            "metrics",
            step=self.version,
            loss=win["loss"] / n,
            lr=lr,
            active_workers=len(self.active),
            staleness=win["stale"] / n,
            img_per_s=win["images"] / dt if dt > 0 else 0.0,
            steps_per_s=win["updates"] / dt if dt > 0 else 0.0,
            updates=win["updates"],
        )
        self._window = {"t": now, "updates": 0, "images": 0, "loss": 0.0, "stale": 0}

    def _post(self, kind: str, **fields: Any) -> None:
        if self._worker is not None:
            self._worker.log_event(
                TOPIC, make_event(kind, run=self.run, shard=self.shard, **fields)
            )

    # -- checkpoints -------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """A complete, self-contained copy of this shard (a checkpoint's content)."""
        return {
            "format": checkpoint.FORMAT,
            "run": self.run,
            "model": self.model,
            "shard": self.shard,
            "shards": self.shards,
            "step": self.version,
            "weights": self.w.copy(),
            "momentum": self.v.copy(),
            "decay_mask": (self.decay > 0).astype(np.uint8),
            "bn": None if self.bn is None else self.bn.copy(),
            "hparams": self.hp.to_dict(),
            "time": time.time(),
        }

    def _start_checkpoint(self) -> None:
        if self._ckpt_task is not None and not self._ckpt_task.done():
            return  # the previous one is still being written; the next boundary catches up
        state = self.state()
        self._ckpt_task = asyncio.ensure_future(self._write(state))

    async def _write(self, state: dict[str, Any]) -> str:
        path = await asyncio.to_thread(checkpoint.save, self.checkpoint_url, state)
        self.last_checkpoint = int(state["step"])
        self._post("checkpoint", step=state["step"], path=path)
        return path

    async def checkpoint(self) -> str:
        """Write a checkpoint now and return its path."""
        if self._ckpt_task is not None and not self._ckpt_task.done():
            await self._ckpt_task
        return await self._write(self.state())

    async def get_state(self) -> dict[str, Any]:
        """Weights, statistics and version (for evaluation)."""
        return {"weights": self.w, "bn": self.bn, "step": self.version}

    async def status(self) -> dict[str, Any]:
        """Counters for the driver: version, active trainers, accepted and lost updates."""
        return {
            "step": self.version,
            "generation": self.generation,
            "active": sorted(self.active),
            "accepted": dict(self.accepted),
            "gaps": self.gaps,
            "lost_in_flight": self.lost_in_flight,
            "drained": sorted(self.finals),
            "last_checkpoint": self.last_checkpoint,
            "uptime": time.time() - self.started,
        }
