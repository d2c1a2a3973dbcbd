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
from transient_nb.training.wire.codec import TORCH_DTYPES, as_numpy, from_wire, tensor


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


def cast_gradient(grad: np.ndarray, wire: str, legacy: bool, out: Any = None) -> np.ndarray:
    """The Trainer's copy of its float32 gradient into its host buffer in the wire dtype
    (``FlatModel.grads``: a copy in every dtype, a cast in float16 and bfloat16); ``out``, that
    buffer (a torch tensor of the wire dtype, kept by the caller)."""
    if legacy:
        return grad.astype(np.float16) if wire == "float16" else grad
    if out is None:
        out = torch.empty(grad.shape, dtype=TORCH_DTYPES[wire])
    out.copy_(torch.from_numpy(grad))
    return as_numpy(out)


def merge_replies(replies: list[Any], wire: str = "float32", out: Any = None) -> Any:
    """The Trainer's load of the shards' weights into its float32 vector (``FlatModel.load``:
    torch casts into a buffer it keeps; ``out``)."""
    if out is None:
        out = torch.empty(sum(int(r[0].size) for r in replies))
    o = 0
    for r in replies:
        k = int(r[0].size)
        out[o : o + k].copy_(tensor(from_wire(r[0], wire)))
        o += k
    return out
