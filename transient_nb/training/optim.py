"""The PS's update rule, as one function that the PS and the benchmarks share."""

from __future__ import annotations

import numpy as np


def momentum_sgd_(
    w: np.ndarray,
    v: np.ndarray,
    grad: np.ndarray,
    decay: np.ndarray,
    lr: float,
    momentum: float,
    scratch: np.ndarray,
) -> None:
    """One TF-style momentum SGD step with per-entry L2, in place and without temporaries.

    ``v = momentum * v + (grad + decay * w)``, then ``w -= lr * v``. ``decay`` holds the weight
    decay of each entry (0 for biases and batch-norm parameters); ``scratch`` is a float32 buffer
    of ``w``'s shape that the caller owns (so a multi-MB update allocates nothing).

    Examples
    --------
    >>> w = np.ones(3, np.float32); v = np.zeros(3, np.float32)
    >>> momentum_sgd_(w, v, np.ones(3, np.float32), np.zeros(3, np.float32), 0.1, 0.9,
    ...               np.empty(3, np.float32))
    >>> w.tolist()
    [0.8999999761581421, 0.8999999761581421, 0.8999999761581421]
    """
    np.multiply(v, momentum, out=v)
    if grad.dtype == np.float32:
        v += grad
    else:  # a float16 gradient from the wire: widen it into the scratch buffer, not a new array
        scratch[...] = grad
        v += scratch
    np.multiply(decay, w, out=scratch)
    v += scratch
    np.multiply(v, lr, out=scratch)
    w -= scratch
