"""The PS's update rules: the paper's momentum SGD (one function that the PS and the benchmarks
share), and any ``torch.optim`` optimizer over a shard of the flat parameters."""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from transient_nb.training.checkpoint import META_KEY, STATE_PREFIX

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


def lr_scale(active_workers: int, scale_by_active: bool = True) -> float:
    """The paper's rule: the learning rate divided by sqrt(number of ACTIVE workers).

    Examples
    --------
    >>> lr_scale(4), lr_scale(1), lr_scale(4, scale_by_active=False)
    (0.5, 1.0, 1.0)
    """
    if scale_by_active and active_workers > 1:
        return 1.0 / math.sqrt(active_workers)
    return 1.0


class ShardOptimizer:
    """A ``torch.optim`` optimizer over one PS shard's slice of the flat parameter vector.

    The shard's weights stay the PS's numpy buffer: the optimizer updates a tensor that shares
    its memory. Each step sets every param group's learning rate to its base (what the factory
    gave) times ``scale`` (the paper's rule, :func:`lr_scale`). The optimizer's state comes out
    as plain arrays and JSON (:meth:`state_arrays`), the form a checkpoint keeps, and goes back
    in with :meth:`load_arrays`: a PS re-created from a checkpoint resumes the optimizer too.

    Parameters
    ----------
    factory
        A ``torch.optim.Optimizer`` class or a callable ``(params) -> optimizer``, such as
        ``functools.partial(torch.optim.AdamW, lr=1e-3)``.
    weights
        The shard's float32 weights (updated in place).
    state
        :meth:`state_arrays` of an earlier optimizer of the same shard, to resume.

    Examples
    --------
    >>> import functools
    >>> w = np.ones(3, np.float32)
    >>> opt = ShardOptimizer(functools.partial(torch.optim.SGD, lr=0.5), w)
    >>> opt.step(np.ones(3, np.float32), scale=0.5)
    >>> w.tolist()
    [0.75, 0.75, 0.75]
    """

    def __init__(
        self,
        factory: Any,
        weights: np.ndarray,
        state: Mapping[str, np.ndarray] | None = None,
    ):
        self.param = torch.from_numpy(weights)
        self.opt = factory([self.param])
        if not isinstance(self.opt, torch.optim.Optimizer):
            raise TypeError(
                f"the optimizer factory returned a {type(self.opt).__name__}, not a "
                "torch.optim.Optimizer"
            )
        for group in self.opt.param_groups:
            if "lr" not in group:
                raise TypeError(
                    f"{type(self.opt).__name__} has no 'lr' in its param groups: the learning "
                    "rate cannot follow the active workers"
                )
        self.base_lrs = [float(g["lr"]) for g in self.opt.param_groups]
        if state:
            self.load_arrays(state)

    def step(self, grad: np.ndarray | torch.Tensor, scale: float = 1.0) -> None:
        """Apply one gradient (any float dtype; a bfloat16 one from the wire is a tensor) with
        every group's LR at base times ``scale``."""
        for group, base in zip(self.opt.param_groups, self.base_lrs, strict=True):
            group["lr"] = base * scale
        g = grad if isinstance(grad, torch.Tensor) else torch.from_numpy(np.asarray(grad))
        self.param.grad = g if g.dtype == self.param.dtype else g.to(self.param.dtype)
        with torch.no_grad():
            self.opt.step()
        self.param.grad = None

    @property
    def lr(self) -> float:
        """The learning rate of the first param group, as last applied."""
        return float(self.opt.param_groups[0]["lr"])

    def state_arrays(self) -> dict[str, np.ndarray]:
        """The optimizer's state as arrays: tensors of the parameter's shape or any other,
        under ``opt.NAME``; numbers and the param groups' settings as JSON under ``opt_meta``."""
        sd = self.opt.state_dict()
        per_param = sd["state"].get(0, {})
        arrays: dict[str, np.ndarray] = {}
        scalars: dict[str, Any] = {}
        for key, value in per_param.items():
            if isinstance(value, torch.Tensor):
                arrays[STATE_PREFIX + key] = value.detach().cpu().numpy().copy()
            elif isinstance(value, (bool, int, float)) or value is None:
                scalars[key] = value
            else:
                raise TypeError(
                    f"optimizer state {key!r} is a {type(value).__name__}: only tensors and "
                    "numbers can go into a checkpoint"
                )
        groups = [{k: v for k, v in g.items() if k != "params"} for g in sd["param_groups"]]
        meta = {"groups": groups, "base_lrs": self.base_lrs, "scalars": scalars}
        try:
            text = json.dumps(meta)
        except TypeError as e:
            raise TypeError(f"optimizer settings cannot be written as JSON: {e}") from None
        arrays[META_KEY] = np.frombuffer(text.encode(), dtype=np.uint8).copy()
        return arrays

    def load_arrays(self, state: Mapping[str, np.ndarray]) -> None:
        """Resume from :meth:`state_arrays` (of this shard's slice)."""
        meta = json.loads(bytes(np.asarray(state[META_KEY], dtype=np.uint8)).decode())
        per_param: dict[str, Any] = dict(meta.get("scalars") or {})
        for key, value in state.items():
            if key.startswith(STATE_PREFIX):
                per_param[key[len(STATE_PREFIX) :]] = torch.from_numpy(np.array(value, copy=True))
        groups = [{**_tuples(g), "params": [i]} for i, g in enumerate(meta["groups"])]
        self.opt.load_state_dict(
            {"state": {0: per_param} if per_param else {}, "param_groups": groups}
        )
        self.base_lrs = [float(x) for x in meta.get("base_lrs") or self.base_lrs]


def _tuples(group: Mapping[str, Any]) -> dict[str, Any]:
    # JSON turned tuples (Adam's betas) into lists; torch wants them back as tuples.
    return {k: tuple(v) if isinstance(v, list) else v for k, v in group.items()}


def optimizer_state(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The optimizer's part of a shard's arrays (``opt.*`` and ``opt_meta``)."""
    return {k: v for k, v in arrays.items() if k.startswith(STATE_PREFIX) or k == META_KEY}
