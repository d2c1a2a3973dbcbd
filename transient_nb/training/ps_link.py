"""A trainer's link to the parameter server: finding the current PS, calling every shard at
once, and rejoining when a call is slow, fails or is overtaken by a new PS.

:class:`PSLink` is the part of :class:`~transient_nb.training.trainer.Trainer` that talks to
the PS; the run's Dask ``Variable`` says which PS generation is current (:func:`lookup_ps`).
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from distributed import Variable
from distributed.actor import Actor

from transient_nb.training.emulation import cross_region
from transient_nb.training.flat import FlatModel
from transient_nb.training.hparams import HParams
from transient_nb.training.ps import ParameterServer, shard_bounds
from transient_nb.training.wire.client import connect_shards

#: How long a trainer waits on a PS call before it looks whether the PS was replaced (seconds).
WAIT_SLICE_S = 0.5
#: First and longest pause between attempts to rejoin the PS (seconds; doubled each attempt).
REJOIN_FIRST_S = 0.2
REJOIN_MAX_S = 5.0


def _published(variable: str, timeout: float) -> dict[str, Any]:
    # The driver publishes JSON text (``{"generation": g, "shards": [[address, key], ...],
    # "ps_zone": zone}``).
    return dict(json.loads(Variable(variable).get(timeout=timeout)))


def lookup_ps(variable: str, timeout: float) -> tuple[int, list[Actor], str | None]:
    """The current PS generation, shard handles and zone, from the run's Dask Variable."""
    info = _published(variable, timeout)
    actors = [Actor(ParameterServer, addr, key) for addr, key in info["shards"]]
    zone = info.get("ps_zone")
    return int(info["generation"]), actors, None if zone is None else str(zone)


def current_generation(variable: str, timeout: float = 5.0) -> int:
    """The generation published in the run's Variable, or -1 when it cannot be read."""
    try:
        return int(_published(variable, timeout)["generation"])
    except Exception:
        return -1


class PSUnavailable(RuntimeError):
    """A call to the PS did not complete: slow, failed, or the PS was replaced meanwhile."""


class PSLost(RuntimeError):
    """No PS answered for ``ps_lost_after_s``: the trainer gives up (the driver restarts it)."""


class _Stopped(Exception):
    """The trainer was stopped while it waited for the PS."""


#: Locates the current PS: ``locate(timeout) -> (generation, shard handles)``, or with the PS's
#: zone as a third item (where the driver moved the PS).
Locator = Callable[[float], tuple[Any, ...]]


class PSLink:
    """Calls to every PS shard, and rejoining the current PS, for a trainer.

    The trainer sets up what it reads: its name, hyperparameters, the run's Variable, the shard
    bounds, its look-up of the PS, its stop and drain events.
    """

    name: str
    hp: HParams
    variable: str
    bounds: list[tuple[int, int]]
    worker: Any
    zone: str | None
    ps_zone: str | None
    generation: int
    local_step: int
    accepted: int
    data_plane: str
    _locate: Locator
    _custom_locate: bool
    _stop: threading.Event
    _draining: threading.Event
    _links: list[Any] | None
    _repace: bool

    def _stopping(self) -> bool:
        return self._stop.is_set() and not self._draining.is_set()

    def _gather(self, futures: list[Any]) -> list[Any]:
        """Every shard's reply, or :class:`PSUnavailable` within ``call_timeout_s``."""
        t0 = time.monotonic()
        out = []
        try:
            for f in futures:
                while True:
                    try:
                        out.append(f.result(timeout=WAIT_SLICE_S))
                        break
                    except (TimeoutError, asyncio.TimeoutError):
                        # A slow PS, or one whose worker died (such a call can wait forever):
                        # look whether a new PS was published meanwhile, give up at the bound.
                        waited = time.monotonic() - t0
                        if waited > self.hp.call_timeout_s:
                            raise PSUnavailable(f"no reply within {waited:.1f} s") from None
                        if self._newer_generation():
                            raise PSUnavailable("a new parameter server was published") from None
                        if self._stopping():
                            raise _Stopped() from None
        except (PSUnavailable, _Stopped):
            raise
        except Exception as e:  # lost worker, erred or missing actor, closed comm
            raise PSUnavailable(repr(e)[:300]) from e
        return out

    def _newer_generation(self) -> bool:
        if self._custom_locate:
            try:
                gen = self._locate(1.0)[0]
            except Exception:
                return False
            return gen > self.generation
        return current_generation(self.variable, timeout=2.0) > self.generation

    def _send(
        self,
        shards: list[Any],
        grad: np.ndarray,
        version: int,
        loss: float,
        images: int,
        bn_delta: np.ndarray | None,
        final: bool,
    ) -> list[Any]:
        """Push one gradient to every shard; returns the calls' futures (not waited on)."""
        return [
            ps.push_pull(
                trainer=self.name,
                grad=grad[a:b],
                base_version=version,
                local_step=self.local_step,
                loss=loss,
                images=images,
                bn_delta=bn_delta if i == 0 else None,
                final=final,
            )
            for i, (ps, (a, b)) in enumerate(zip(self._links or shards, self.bounds, strict=True))
        ]

    def _connect(self, shards: list[Any]) -> list[Any] | None:
        """Data-plane connections to the shards (:mod:`~transient_nb.training.wire`), or None
        when the actor carries the bytes; an unreachable data plane is an unavailable PS."""
        self._disconnect()
        if self.hp.data_plane == "dask":
            return None
        endpoints = self._gather([ps.data_endpoint() for ps in shards])
        try:
            self._links = connect_shards(
                endpoints,
                getattr(self.worker, "security", None),
                timeout=min(self.hp.call_timeout_s, 5.0),
            )
        except OSError as e:
            raise PSUnavailable(f"data plane: {e!r}"[:300]) from e
        self.data_plane = self._links[0].transport if self._links else "dask"
        return self._links

    def _disconnect(self) -> None:
        for link in self._links or []:
            link.close()
        self._links = None

    def _accept(self, flat: FlatModel, pieces: list[np.ndarray], bn: np.ndarray | None) -> None:
        """A push was accepted: train on from the weights that came back."""
        self.accepted += 1
        flat.load(pieces, self.bounds, bn)

    def _rejoin(self, flat: FlatModel) -> tuple[list[Any], int]:
        """Find the current PS, take its weights and register; retry with backoff.

        Raises :class:`PSLost` when no PS has answered for ``ps_lost_after_s``, and
        :class:`_Stopped` when stopped (or draining: a draining trainer that has no PS has
        nothing left to push).
        """
        t0 = time.monotonic()
        delay = REJOIN_FIRST_S
        last_error = ""
        while True:
            if self._stop.is_set():  # stopped, or draining with no PS to push the last gradient to
                raise _Stopped()
            try:
                located = self._locate(min(self.hp.call_timeout_s, 5.0))
                gen, shards = located[0], located[1]
                if not shards:
                    raise PSUnavailable("no parameter server published yet")
                self.generation = gen
                if len(shards) != len(self.bounds):
                    # The PS gained a shard (a new generation): the same vector, cut anew.
                    self.bounds = shard_bounds(self.bounds[-1][1], len(shards))
                links = self._connect(shards)
                pieces, bn, version = _merge(
                    self._gather([ps.pull(self.name) for ps in links or shards])
                )
                self._gather([ps.register(self.name, self.local_step) for ps in shards])
            except (
                PSUnavailable,
                TimeoutError,
                asyncio.TimeoutError,
                OSError,
                ValueError,
                KeyError,
            ) as e:
                last_error = repr(e)[:300]
                waited = time.monotonic() - t0
                if waited >= self.hp.ps_lost_after_s:
                    raise PSLost(
                        f"no parameter server answered for {waited:.0f} s (last: {last_error})"
                    ) from None
                # Exponential backoff with jitter: many trainers must not stampede a PS that
                # is just coming back.
                pause = min(delay, self.hp.ps_lost_after_s - waited) * random.uniform(0.5, 1.0)
                if self._stop.wait(pause):
                    raise _Stopped() from None
                delay = min(delay * 2, REJOIN_MAX_S)
                continue
            flat.load(pieces, self.bounds, bn)
            moved_to = located[2] if len(located) > 2 else None
            if moved_to and moved_to != self.ps_zone:
                # The driver moved the PS (to the region of most workers): a paced trainer
                # steps at the speed of its distance from where the PS is now.
                self._repace = self._repace or cross_region(self.zone, moved_to) != cross_region(
                    self.zone, self.ps_zone
                )
                self.ps_zone = str(moved_to)
            return shards, version


def _merge(replies: list[Any]) -> tuple[list[np.ndarray], np.ndarray | None, int]:
    """The shards' weight pieces (as they came), shard 0's statistics and version."""
    return [r[0] for r in replies], replies[0][1], int(replies[0][2])
