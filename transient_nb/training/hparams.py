"""The training hyperparameters, in one typed config (after Li et al. §1 / T2T resnet_cifar_32_vanilla)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from transient_nb.training.emulation import parse_emulation

#: Wire formats of gradients and weights between trainers and the PS.
WIRE_DTYPES = ("float32", "float16", "bfloat16")
#: Where the gradients and weights travel: the backend's choice, a Unix socket, TLS, or the actor.
DATA_PLANES = ("auto", "unix", "tls", "dask")


def _whole(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}={value!r} must be a whole number of at least {minimum}.")


def _positive(name: str, value: Any, *, zero_ok: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not zero_ok):
        bound = "0 or more" if zero_ok else "above 0"
        raise ValueError(f"{name}={value!r} must be a finite number {bound}.")


@dataclass(frozen=True)
class HParams:
    """Hyperparameters of one asynchronous PS training run.

    The paper's values are the defaults: batch 128 per worker step, SGD momentum 0.9 (no
    Nesterov), L2 weight decay 1e-4 on weights (not biases or batch-norm parameters), base LR 0.1
    with a 100-step linear warm-up, x0.1 at 32K and x0.01 at 48K of 64K global steps; every
    worker push counts one global step; the LR is divided by sqrt(number of ACTIVE workers).
    The decay points are kept as fractions of the run's length (32K/64K = 0.5, 48K/64K = 0.75)
    so that shorter runs get the same shape, and so are the default checkpoint and evaluation
    intervals (the paper's 4K of 64K: 1/16).

    ``emulate`` paces the run to emulated GPUs and PS (:mod:`transient_nb.training.emulation`):
    ``train(cluster, ..., emulate="paper", emulate_step_scale=64000 / steps)`` makes every
    trainer step at its VM's GPU type's rate and the PS serve at most a 4-vCPU PS's capacity,
    both divided by the cluster's ``time_scale``.

    Examples
    --------
    >>> hp = HParams(steps=1000, warmup_steps=0).validate()
    >>> hp.checkpoint_interval, hp.eval_interval
    (62, 50)
    >>> round(hp.lr_at(600, active_workers=4), 4)
    0.005
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
    checkpoint_every: int = 0  # global steps between PS checkpoints; 0: steps // 16 (paper: 4K)
    eval_every: int = 0  # global steps between evaluations; 0: steps // 20
    eval_images: int | None = None  # evaluate on at most this many test images (None: all)
    metrics_interval_s: float = 1.0  # how often the PS posts a ``metrics`` event
    call_timeout_s: float = (
        30.0  # bound of every actor call: a slow call is retried, never waited on forever
    )
    ps_lost_after_s: float = 120.0  # a PS that answers nothing for this long is declared lost
    trainer_restarts: int = (
        3  # restarts of a failing trainer (with backoff) before its worker is given up
    )
    wire_dtype: str = "float32"  # gradients and weights on the wire: float32, float16, bfloat16
    # The trainer <-> PS bytes (transient_nb.training.wire): "auto" (the backend's: a Unix socket
    # on the local backend, TLS on GCE), "unix", "tls", or "dask" (on the Dask actor, as before).
    data_plane: str = "auto"
    pipeline: bool = False  # overlap step k's push with step k+1's compute (+1 staleness)
    # Paced emulation of GPU step times and of the PS's capacity (see transient_nb.training.emulation):
    # None, "paper", or a table such as "k80=4.56,ps=45" (a dict is accepted and kept as text).
    emulate: str | None = None
    emulate_step_scale: float = 1.0  # emulated steps each global step stands for (64000/steps)

    def __post_init__(self) -> None:
        # A dict table becomes its canonical text: HParams stays hashable and JSON-friendly.
        if self.emulate is not None and not isinstance(self.emulate, str):
            emu = parse_emulation(self.emulate)
            object.__setattr__(self, "emulate", emu.spec if emu is not None else None)

    @property
    def checkpoint_interval(self) -> int:
        """Global steps between checkpoints (``checkpoint_every``, or steps // 16)."""
        return self.checkpoint_every or max(1, self.steps // 16)

    @property
    def eval_interval(self) -> int:
        """Global steps between evaluations (``eval_every``, or steps // 20)."""
        return self.eval_every or max(1, self.steps // 20)

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
        """Raise a ``ValueError`` that names the bad value, for every field that cannot work."""
        _whole("steps", self.steps, 1)
        _whole("batch_size", self.batch_size, 1)
        _positive("lr", self.lr)
        if not isinstance(self.momentum, (int, float)) or not 0 <= self.momentum < 1:
            raise ValueError(f"momentum={self.momentum!r} must be in [0, 1), e.g. 0.9.")
        _positive("weight_decay", self.weight_decay, zero_ok=True)
        _whole("warmup_steps", self.warmup_steps, 0)
        if len(self.decay_at) != len(self.decay_factors):
            raise ValueError(
                f"decay_at={self.decay_at!r} and decay_factors={self.decay_factors!r} "
                "must have the same length."
            )
        for frac in self.decay_at:
            if not isinstance(frac, (int, float)) or not 0 < frac <= 1:
                raise ValueError(
                    f"decay_at={self.decay_at!r}: each point is a fraction of the run in (0, 1]."
                )
        if list(self.decay_at) != sorted(self.decay_at):
            raise ValueError(f"decay_at={self.decay_at!r} must be in increasing order.")
        for factor in self.decay_factors:
            _positive("decay_factors", factor)
        if not isinstance(self.scale_lr_by_active_workers, bool):
            raise ValueError(
                f"scale_lr_by_active_workers={self.scale_lr_by_active_workers!r} must be True or False."
            )
        _whole("checkpoint_every", self.checkpoint_every, 0)
        _whole("eval_every", self.eval_every, 0)
        if self.eval_images is not None:
            _whole("eval_images", self.eval_images, 1)
        _positive("metrics_interval_s", self.metrics_interval_s)
        _positive("call_timeout_s", self.call_timeout_s)
        _positive("ps_lost_after_s", self.ps_lost_after_s)
        if self.ps_lost_after_s < self.call_timeout_s:
            raise ValueError(
                f"ps_lost_after_s={self.ps_lost_after_s!r} must be at least "
                f"call_timeout_s={self.call_timeout_s!r}: a slow call is not a lost PS."
            )
        _whole("trainer_restarts", self.trainer_restarts, 0)
        if not isinstance(self.pipeline, bool):
            raise ValueError(f"pipeline={self.pipeline!r} must be True or False.")
        if self.emulate is not None:
            parse_emulation(self.emulate)  # raises a ValueError that names the bad item
        _positive("emulate_step_scale", self.emulate_step_scale)
        if self.wire_dtype not in WIRE_DTYPES:
            raise ValueError(
                f"wire_dtype={self.wire_dtype!r}: use one of {', '.join(map(repr, WIRE_DTYPES))}."
            )
        if self.data_plane not in DATA_PLANES:
            raise ValueError(
                f"data_plane={self.data_plane!r}: use one of {', '.join(map(repr, DATA_PLANES))}."
            )
        return self

    def to_dict(self) -> dict[str, Any]:
        """Plain values (for checkpoints and events)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> HParams:
        """The inverse of :meth:`to_dict` (lists from JSON become tuples); unknown keys are refused.

        Examples
        --------
        >>> HParams.from_dict(HParams(steps=10).to_dict()) == HParams(steps=10)
        True
        """
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(
                f"Unknown hyperparameter(s) {', '.join(map(repr, unknown))}: "
                f"use some of {', '.join(sorted(known))}."
            )
        clean = dict(values)
        for key in ("decay_at", "decay_factors"):
            if key in clean:
                clean[key] = tuple(clean[key])
        return cls(**clean)

    def with_(self, **changes: Any) -> HParams:
        """A copy with some values changed."""
        return replace(self, **changes)
