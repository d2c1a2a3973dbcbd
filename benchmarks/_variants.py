"""The PS path as it was before this round, for before/after measurements (``--variant legacy``).

Not used by the package. ``LegacyParameterServer`` keeps the package's bookkeeping and changes only
what this round changed in the arithmetic and on the wire:

* the update in numpy, with its temporaries (``v *= mu; v += g; v += decay * w; w -= lr * v``);
* float16 casts in numpy (not vectorised: 20-30x slower than torch's);
* replies that hand out the live weight array (which a later update can change while the reply
  is still being sent: the defect the package fixed; kept here only to price the fix).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from transient_nb.training.ps import ParameterServer, Reply


class LegacyParameterServer(ParameterServer):
    """The PS with the previous round's arithmetic and replies (see the module docstring)."""

    def _apply(self, grad: np.ndarray, lr: float) -> None:
        g = grad.astype(np.float32, copy=False)
        self.v *= self.hp.momentum
        self.v += g
        self.v += self.decay * self.w
        self.w -= lr * self.v

    def _reply(self) -> Reply:
        w = self.w.astype(np.float16) if self.hp.wire_dtype == "float16" else self.w
        return w, self.bn, self.version


def cast_gradient(grad: np.ndarray, wire: str, legacy: bool) -> np.ndarray:
    """The Trainer's cast of its float32 gradient for the wire."""
    if wire != "float16":
        return grad
    if legacy:
        return grad.astype(np.float16)
    return torch.from_numpy(grad).half().numpy()


def merge_replies(replies: list[Any]) -> np.ndarray:
    """The Trainer's merge of the shards' weights (``trainer._merge``)."""
    return np.concatenate([np.asarray(r[0], dtype=np.float32) for r in replies])
