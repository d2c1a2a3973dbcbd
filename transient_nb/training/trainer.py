"""Trainers: one Dask actor on every preemptible worker, also on replacements.

A trainer's :meth:`Trainer.run` is its training loop (it occupies the worker's actor thread for
the whole run): draw a batch, forward/backward, push the gradient to every PS shard and get the new
weights back (one round trip), repeat. When the worker gets a preemption notice, the drain hook
lets the current step finish, pushes that last gradient and leaves the PS cleanly. When the PS is
lost, every call times out or fails, and the trainer looks the PS up again by itself (a Dask
``Variable`` holds the current one) and goes on from its weights.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from distributed import Variable, get_worker
from distributed.actor import Actor

from transient_nb.agent import register_drain_hook, unregister_drain_hook
from transient_nb.events import TOPIC, make_event
from transient_nb.training.data import BatchStream, load_dataset
from transient_nb.training.hparams import HParams
from transient_nb.training.models import build_model
from transient_nb.training.ps import ParameterServer

logger = logging.getLogger(__name__)


#: How long a trainer waits on a PS call before it looks whether the PS was replaced (seconds).
WAIT_SLICE_S = 0.5
#: How often a trainer checks that it still talks to the current PS (seconds).
GENERATION_CHECK_S = 2.0


class PSLost(RuntimeError):
    """The parameter server did not answer; look it up again."""


def flat_layout(model: torch.nn.Module) -> tuple[list[torch.nn.Parameter], list[torch.Tensor]]:
    """The model's parameters and its float batch-norm buffers, in a fixed order."""
    params = [p for p in model.parameters() if p.requires_grad]
    buffers = [b for name, b in model.named_buffers() if b.dtype.is_floating_point]
    return params, buffers


def decay_mask(model: torch.nn.Module) -> np.ndarray:
    """1 for entries that get weight decay (weights of convs and dense layers), else 0."""
    params, _ = flat_layout(model)
    return np.concatenate(
        [np.full(p.numel(), 1 if p.dim() > 1 else 0, dtype=np.uint8) for p in params]
    )


def get_flat(tensors: Sequence[torch.Tensor]) -> np.ndarray:
    """Concatenate tensors into one float32 numpy vector (on the host)."""
    if not tensors:
        return np.zeros(0, dtype=np.float32)
    return torch.cat([t.detach().reshape(-1) for t in tensors]).float().cpu().numpy()


def set_flat(tensors: Sequence[torch.Tensor], flat: np.ndarray) -> None:
    """Copy a flat vector back into tensors (any device)."""
    src = torch.from_numpy(np.ascontiguousarray(flat, dtype=np.float32))
    device = tensors[0].device if tensors else "cpu"
    src = src.to(device, non_blocking=True)
    offset = 0
    with torch.no_grad():
        for t in tensors:
            n = t.numel()
            t.copy_(src[offset : offset + n].view_as(t))
            offset += n


def lookup_ps(variable: str, timeout: float) -> tuple[int, list[Actor]]:
    """The current PS generation and shard handles, from the run's Dask Variable."""
    value = Variable(variable).get(timeout=timeout)
    info = json.loads(value) if isinstance(value, str) else value
    actors = [Actor(ParameterServer, addr, key) for addr, key in info["shards"]]
    return int(info["generation"]), actors


class Trainer:
    """The training loop of one worker, as a Dask actor.

    Parameters
    ----------
    run
        Run id.
    model, data
        Model name and data spec (see :func:`~transient_nb.training.data.load_dataset`).
    hparams
        :class:`HParams` as a dict.
    variable
        Name of the Dask Variable that holds the current PS shards.
    bounds
        Shard slices of the flat parameter vector.
    seed
        Base seed; each worker draws its own batches.
    device
        "cuda", "cpu" or None (CUDA when available).
    """

    def __init__(
        self,
        run: str,
        model: str,
        data: str,
        hparams: dict[str, Any],
        variable: str,
        bounds: list[tuple[int, int]],
        seed: int = 0,
        device: str | None = None,
    ):
        self.run_id = run
        self.model_name = model
        self.data = data
        self.hp = HParams(
            **{
                **hparams,
                "decay_at": tuple(hparams["decay_at"]),
                "decay_factors": tuple(hparams["decay_factors"]),
            }
        )
        self.variable = variable
        self.bounds = bounds
        self.worker = get_worker()
        try:
            self.name = str(json.loads(os.environ["TRANSIENT_NB_VM"])["name"])
        except (KeyError, ValueError):
            self.name = str(self.worker.name)
        self.seed = (seed * 1_000_003 + zlib.crc32(self.name.encode())) % 2**31
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self._stop = threading.Event()
        self._draining = threading.Event()
        self._done = threading.Event()
        self.local_step = 0
        self.accepted = 0
        self.ps_failures = 0
        self._generation = 0
        self.state = "created"
        register_drain_hook(self._drain)

    # -- control (coroutines: they answer at once, even while run() holds the actor thread) --------
    async def stop(self) -> None:
        """Stop after the current step (no final push)."""
        self._stop.set()

    async def status(self) -> dict[str, Any]:
        """Counters of this trainer."""
        return {
            "worker": self.name,
            "state": self.state,
            "local_step": self.local_step,
            "accepted": self.accepted,
            "ps_failures": self.ps_failures,
        }

    async def _drain(self, deadline: float) -> None:
        # Preemption notice: finish this step, push its gradient, leave; then the worker goes.
        self._draining.set()
        self._stop.set()
        while not self._done.is_set() and time.time() < deadline:
            await asyncio.sleep(0.02)

    # -- the loop -------------------------------------------------------------------------------------
    def _post(self, kind: str, **fields: Any) -> None:
        self.worker.log_event(TOPIC, make_event(kind, run=self.run_id, **fields))

    def _call_all(
        self, shards: list[Actor], method: str, *args_per_shard: Any, **kwargs: Any
    ) -> list[Any]:
        futures = []
        for i, ps in enumerate(shards):
            args = [a[i] if isinstance(a, list) else a for a in args_per_shard]
            futures.append(getattr(ps, method)(*args, **kwargs))
        t0 = time.monotonic()
        out = []
        try:
            for f in futures:
                while True:
                    try:
                        out.append(f.result(timeout=WAIT_SLICE_S))
                        break
                    except (TimeoutError, asyncio.TimeoutError):
                        # A call to a PS whose worker died can wait forever: look whether the
                        # driver has published a new PS meanwhile, and give up at the timeout.
                        if time.monotonic() - t0 > self.hp.call_timeout_s:
                            raise
                        if self._current_generation() > self._generation:
                            raise PSLost("a new parameter server was published") from None
        except PSLost:
            raise
        except Exception as e:  # timeouts, lost worker, erred actor: all mean "PS lost"
            raise PSLost(repr(e)) from e
        return out

    def _current_generation(self) -> int:
        try:
            value = Variable(self.variable).get(timeout=5)
            return int(json.loads(value)["generation"])
        except Exception:
            return -1

    def _connect(self, min_generation: int) -> tuple[int, list[Actor]]:
        """Wait until a PS of at least ``min_generation`` is published, then return it."""
        while not self._stop.is_set() or self._draining.is_set():
            try:
                gen, shards = lookup_ps(self.variable, timeout=self.hp.call_timeout_s)
            except Exception:
                gen, shards = -1, []
            if gen >= min_generation and shards:
                self._generation = gen
                return gen, shards
            if self._draining.is_set():
                break
            time.sleep(0.2)
        raise PSLost("stopped while waiting for the parameter server")

    def _join_ps(
        self, min_generation: int, params: list[torch.nn.Parameter], buffers: list[torch.Tensor]
    ) -> tuple[int, list[Actor], int]:
        """Find the current PS, take its weights and register with it; retries while the PS is
        being replaced under our feet."""
        while True:
            gen, shards = self._connect(min_generation)
            try:
                w, bn, version = self._pull(shards)
                self._call_all(shards, "register", self.name, self.local_step)
            except PSLost:
                min_generation = gen + 1
                continue
            set_flat(params, w)
            if bn is not None and buffers:
                set_flat(buffers, bn)
            return gen, shards, version

    def _pull(self, shards: list[Actor]) -> tuple[np.ndarray, np.ndarray | None, int]:
        replies = self._call_all(shards, "pull", self.name)
        return self._merge(replies)

    @staticmethod
    def _merge(replies: list[Any]) -> tuple[np.ndarray, np.ndarray | None, int]:
        w = np.concatenate([np.asarray(r[0], dtype=np.float32) for r in replies])
        return w, replies[0][1], int(replies[0][2])

    def run(self) -> dict[str, Any]:
        """Train until stopped; returns this trainer's counters."""
        torch.manual_seed(self.seed)
        threads = int(getattr(self.worker.state, "nthreads", 1) or 1)
        torch.set_num_threads(max(1, threads))
        dataset = load_dataset(self.data, train=True)
        model = build_model(self.model_name, num_classes=dataset.num_classes).to(self.device)
        model.train()
        params, buffers = flat_layout(model)
        stream = BatchStream(dataset, self.hp.batch_size, seed=self.seed)
        shards: list[Actor] = []
        t_report, imgs = time.time(), 0
        t_generation = time.time()
        try:
            gen, shards, version = self._join_ps(0, params, buffers)
            self.state = "training"
            while not self._stop.is_set() or self._draining.is_set():
                x, y = next(stream)
                x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
                bn_before = get_flat(buffers) if buffers else None
                loss = F.cross_entropy(model(x), y)
                model.zero_grad(set_to_none=False)
                loss.backward()
                grad = get_flat([p.grad for p in params])  # type: ignore[misc]
                bn_delta = (get_flat(buffers) - bn_before) if bn_before is not None else None
                if self.hp.wire_dtype == "float16":
                    grad = grad.astype(np.float16)
                self.local_step += 1
                final = self._draining.is_set()
                pieces = [grad[a:b] for a, b in self.bounds]
                try:
                    replies = self._call_all(
                        shards,
                        "push_pull",
                        self.name,
                        pieces,
                        version,
                        self.local_step,
                        float(loss.detach()),
                        int(x.shape[0]),
                        bn_delta,
                        final,
                    )
                except PSLost as e:
                    self.ps_failures += 1
                    self._post(
                        "trainer-ps-lost", worker=self.name, step=version, error=str(e)[:200]
                    )
                    gen, shards, version = self._join_ps(gen + 1, params, buffers)
                    continue
                self.accepted += 1
                w, bn, version = self._merge(replies)
                now = time.time()
                if now - t_generation >= GENERATION_CHECK_S:
                    # The driver may have re-created the PS while the old one still answers.
                    t_generation = now
                    if self._current_generation() > gen:
                        gen, shards, version = self._join_ps(gen + 1, params, buffers)
                        continue
                set_flat(params, w)
                if bn is not None and buffers:
                    set_flat(buffers, bn)
                imgs += int(x.shape[0])
                now = time.time()
                if now - t_report >= 2.0:
                    self._post(
                        "worker-metrics",
                        worker=self.name,
                        step=version,
                        img_per_s=imgs / (now - t_report),
                        local_step=self.local_step,
                    )
                    t_report, imgs = now, 0
                if final or version >= self.hp.steps:
                    break  # drained, or the run has all its steps: no more pushes
        except PSLost:
            pass  # stopped while the PS was away
        finally:
            self.state = "drained" if self._draining.is_set() else "stopped"
            if not self._draining.is_set() and shards:
                try:
                    self._call_all(shards, "unregister", self.name, True)
                except PSLost:
                    pass
            unregister_drain_hook(self._drain)
            self._done.set()
        return {
            "worker": self.name,
            "local_step": self.local_step,
            "accepted": self.accepted,
            "ps_failures": self.ps_failures,
            "state": self.state,
        }
