"""The training hyperparameters, in one typed config (after Li et al. §1 / T2T resnet_cifar_32_vanilla)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any


@dataclass(frozen=True)
class HParams:
    """Hyperparameters of one asynchronous PS training run.

    The paper's values are the defaults: batch 128 per worker step, SGD momentum 0.9 (no
    Nesterov), L2 weight decay 1e-4 on weights (not biases or batch-norm parameters), base LR 0.1
    with a 100-step linear warm-up, x0.1 at 32K and x0.01 at 48K of 64K global steps; every
    worker push counts one global step; the LR is divided by sqrt(number of ACTIVE workers).
    The decay points are kept as fractions of the run's length (32K/64K = 0.5, 48K/64K = 0.75)
    so that shorter runs get the same shape.
    """

    steps: int = 64_000  # global steps (accepted pushes) to train for
    batch_size: int = 128  # images per worker step
    lr: float = 0.1  # base learning rate
    momentum: float = 0.9
    weight_decay: float = 1e-4  # L2 on weights with ndim > 1 (convs, dense)
    warmup_steps: int = 100  # linear warm-up, global steps
    decay_at: tuple[float, ...] = (0.5, 0.75)  # fractions of ``steps``
    decay_factors: tuple[float, ...] = (0.1, 0.01)
    scale_lr_by_active_workers: bool = True  # the paper's fix: lr / sqrt(active workers)
    checkpoint_every: int = 4_000  # global steps between PS checkpoints (paper: 4K)
    eval_every: int = 1_000  # global steps between evaluations
    eval_images: int | None = None  # evaluate on at most this many test images (None: all)
    metrics_interval_s: float = 1.0  # how often the PS posts a ``metrics`` event
    call_timeout_s: float = 30.0  # every actor call has a timeout: a lost PS never hangs anyone
    wire_dtype: str = "float32"  # gradients and weights on the wire: float32 or float16

    def lr_at(self, step: int, active_workers: int) -> float:
        """Learning rate for global step ``step`` with ``active_workers`` pushing."""
        lr = self.lr
        if self.warmup_steps > 0 and step < self.warmup_steps:
            lr *= (step + 1) / self.warmup_steps
        for frac, factor in zip(self.decay_at, self.decay_factors, strict=True):
            if step >= frac * self.steps:
                lr = self.lr * factor
        if self.scale_lr_by_active_workers and active_workers > 1:
            lr /= math.sqrt(active_workers)
        return lr

    def validate(self) -> HParams:
        """Raise a clear ``ValueError`` for values that cannot work."""
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps <= 0:
            raise ValueError(f"steps={self.steps!r} must be a whole number above 0.")
        if self.batch_size <= 0:
            raise ValueError(f"batch_size={self.batch_size!r} must be above 0.")
        if not self.lr > 0:
            raise ValueError(f"lr={self.lr!r} must be positive.")
        if not 0 <= self.momentum < 1:
            raise ValueError(f"momentum={self.momentum!r} must be in [0, 1).")
        if self.checkpoint_every <= 0 or self.eval_every <= 0:
            raise ValueError("checkpoint_every and eval_every must be above 0.")
        if self.wire_dtype not in ("float32", "float16"):
            raise ValueError(f"wire_dtype={self.wire_dtype!r}: use 'float32' or 'float16'.")
        if len(self.decay_at) != len(self.decay_factors):
            raise ValueError("decay_at and decay_factors must have the same length.")
        return self

    def to_dict(self) -> dict[str, Any]:
        """Plain values (for checkpoints and events)."""
        return asdict(self)

    def with_(self, **changes: Any) -> HParams:
        """A copy with some values changed."""
        return replace(self, **changes)
