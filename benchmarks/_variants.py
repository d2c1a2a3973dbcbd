"""Proposed changes to the PS path, as drop-in variants for ``ps_throughput.py --variant proposed``.

Not used by the package: these are the measured prototypes of the changes proposed in NOTES.md
(the package's own files are edited by their owners). ``ProposedParameterServer.push_pull``
mirrors ``transient_nb/training/ps.py::ParameterServer.push_pull`` (bookkeeping unchanged); only
the arithmetic and the wire casts differ:

* the gradient's float16 -> float32 cast, the momentum update and the float32 -> float16 cast of
  the reply run in torch on the same buffers (``torch.from_numpy`` views, no copies): numpy's
  float16 conversions are not vectorised (measured 20-30x slower than torch's), and torch fuses
  ``v = mu*v + g + wd*w`` into in-place kernels without numpy's two temporaries;
* the float32 reply is a copy, so that a reply still being written to a slow socket is never
  changed by the next update (ps.py returns ``self.w`` itself).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from transient_nb.training.ps import ParameterServer


class ProposedParameterServer(ParameterServer):
    """The PS with its arithmetic and casts in torch (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._tw = torch.from_numpy(self.w)
        self._tv = torch.from_numpy(self.v)
        self._td = torch.from_numpy(self.decay)

    def _wire(self, x: np.ndarray) -> np.ndarray:
        if self.hp.wire_dtype == "float16":
            return torch.from_numpy(x).half().numpy()
        return x.copy()

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
        lr = self.hp.lr_at(self.version, max(1, len(self.active)))
        # v = mu*v + (g + wd*w); w -= lr*v, in place; add_ casts a float16 gradient on the fly.
        self._tv.mul_(self.hp.momentum).add_(torch.from_numpy(grad)).addcmul_(self._td, self._tw)
        self._tw.sub_(self._tv, alpha=lr)
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


def cast_gradient(grad: np.ndarray, wire: str, proposed: bool) -> np.ndarray:
    """The Trainer's cast of its float32 gradient for the wire (``Trainer.run``)."""
    if wire != "float16":
        return grad
    if proposed:
        return torch.from_numpy(grad).half().numpy()
    return grad.astype(np.float16)


def merge_replies(replies: list[Any], proposed: bool) -> np.ndarray:
    """The Trainer's merge of the shards' weights (``Trainer._merge``)."""
    if proposed:
        return torch.cat([torch.from_numpy(np.asarray(r[0])) for r in replies]).float().numpy()
    return np.concatenate([np.asarray(r[0], dtype=np.float32) for r in replies])
