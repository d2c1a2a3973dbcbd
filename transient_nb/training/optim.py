"""The PS's update rule, as one function that the PS and the benchmarks share."""

from __future__ import annotations

import numpy as np
import torch


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
    gradient from the wire is widened on the fly (numpy's float16 casts are not vectorised: 64 ms
    against 0.15 ms for the 1.86M model, benchmarks/NOTES.md), as is a bfloat16 one (a tensor:
    numpy has no bfloat16).

    Examples
    --------
    >>> w = np.ones(3, np.float32); v = np.zeros(3, np.float32)
    >>> momentum_sgd_(w, v, np.ones(3, np.float16), np.zeros(3, np.float32), 0.1, 0.9)
    >>> w.tolist()
    [0.8999999761581421, 0.8999999761581421, 0.8999999761581421]
    """
    tw, tv = torch.from_numpy(w), torch.from_numpy(v)
    g = grad if isinstance(grad, torch.Tensor) else torch.from_numpy(grad)
    tv.mul_(momentum).add_(g).addcmul_(torch.from_numpy(decay), tw)
    tw.sub_(tv, alpha=lr)
