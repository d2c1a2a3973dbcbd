"""The PS's update rule, as one function that the PS and the benchmarks share."""

from __future__ import annotations

import threading

import numpy as np
import torch

#: Each thread's float32 buffer for gradients that arrive in float16 or bfloat16.
_scratch = threading.local()


def _widened(g: torch.Tensor) -> torch.Tensor:
    """``g`` cast to float32 in a buffer this thread keeps: torch's mixed-dtype in-place add is
    3-4x slower than the cast followed by float32 kernels (0.47M entries: 1.06 ms against 0.33;
    benchmarks/NOTES.md, round thirteen)."""
    buf = getattr(_scratch, "buf", None)
    if buf is None or buf.numel() < g.numel():
        buf = _scratch.buf = torch.empty(g.numel())
    out = buf[: g.numel()]
    out.copy_(g.reshape(-1))
    return out.view(g.shape)


def momentum_sgd_(
    w: np.ndarray,
    v: np.ndarray,
    grad: np.ndarray | torch.Tensor,
    decay: np.ndarray,
    lr: float,
    momentum: float,
) -> None:
    """One TF-style momentum SGD step with per-entry L2, in place and without temporaries.

    ``v = momentum * v + (grad + decay * w)``, then ``w -= lr * v``. ``decay`` holds the weight
    decay of each entry (0 for biases and batch-norm parameters). The arithmetic runs in torch on
    views of the numpy buffers: fused in-place kernels on all of torch's threads, and a float16
    or bfloat16 gradient from the wire (a tensor: numpy has no bfloat16) is first widened into a
    float32 buffer the thread keeps, by torch (numpy's float16 casts are not vectorised: 64 ms
    against 0.15 ms for the 1.86M model, benchmarks/NOTES.md).

    Examples
    --------
    >>> w = np.ones(3, np.float32); v = np.zeros(3, np.float32)
    >>> momentum_sgd_(w, v, np.ones(3, np.float16), np.zeros(3, np.float32), 0.1, 0.9)
    >>> w.tolist()
    [0.8999999761581421, 0.8999999761581421, 0.8999999761581421]
    """
    tw, tv = torch.from_numpy(w), torch.from_numpy(v)
    g = grad if isinstance(grad, torch.Tensor) else torch.from_numpy(grad)
    if g.dtype != tv.dtype:
        g = _widened(g)
    tv.mul_(momentum).add_(g).addcmul_(torch.from_numpy(decay), tw)
    tw.sub_(tv, alpha=lr)
