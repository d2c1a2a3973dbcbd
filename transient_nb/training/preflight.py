"""Checked before anything is spent: what the user gives ``train()``, tried on this CPU.

:func:`preflight` does, in the calling process, what would otherwise fail on a rented cluster:

1. build the model once and count its parameters (trainable and frozen);
2. send the model, the data and every callable through a serialisation round trip (what
   travels to the workers, by value for things defined in a notebook), refusing tensors that
   live on a device (a worker may have none) and a data pair too large to ship by value;
3. draw one batch, run it forward and backward, through the loss and every metric; build the
   optimizer on a stand-in shard, take one step, and write and read its state.

Every failure is one ``ValueError`` that names the bad value and says what to do. Nothing has
started when it is raised, so nothing is left behind. :func:`~transient_nb.training.spec.
check_train_args` is the entry point that ``train()`` and every surface call.
"""

from __future__ import annotations

import io
import math
import pickle
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import cloudpickle
import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset

from transient_nb.training.flat import flat_layout
from transient_nb.training.hparams import HParams
from transient_nb.training.models import build_model
from transient_nb.training.optim import ShardOptimizer
from transient_nb.training.workload import Workload, batch_size_of

#: A ``(train, test)`` pair given by value travels to every worker once; above this many bytes
#: (pickled) it is refused: a factory then builds it where it runs.
DATA_BY_VALUE_LIMIT = 200 * 2**20
#: Items of the batch that the pre-flight check runs (at most; fewer for a smaller batch size).
CHECK_BATCH = 32
#: Hyperparameters that only the paper's SGD reads (a user's optimizer has its own settings).
SGD_ONLY = ("lr", "momentum", "weight_decay", "warmup_steps", "decay_at", "decay_factors")


@dataclass
class Checked:
    """What :func:`preflight` found: the workload and its facts, for the run's events.

    Attributes
    ----------
    workload
        The resolved workload.
    parameters, frozen
        Trainable parameters (what the PS holds) and frozen ones (``requires_grad=False``).
    data_bytes
        Bytes of the data when it travels by value (0 otherwise).
    stop_at
        Metric -> ``(">=" or "<=", threshold)``: when the run stops.
    seconds
        How long the checks took.
    """

    workload: Workload
    parameters: int = 0
    frozen: int = 0
    data_bytes: int = 0
    stop_at: dict[str, tuple[str, float]] = field(default_factory=dict)
    seconds: float = 0.0


def check_optimizer_settings(optimizer: Any, given: Mapping[str, Any]) -> None:
    """Refuse the paper's SGD settings beside a user's optimizer (it has its own)."""
    if isinstance(optimizer, str):
        return
    clash = [k for k in SGD_ONLY if given.get(k) is not None]
    if clash:
        raise ValueError(
            f"{clash[0]}={given[clash[0]]!r} sets the paper's SGD, but optimizer= is your own: "
            "put its settings in the factory, e.g. functools.partial(torch.optim.AdamW, lr=1e-3) "
            "(its learning rate still follows the active workers)."
        )


@contextmanager
def refusing(failed: str, then: str = ".", catch: type[Exception] = Exception) -> Iterator[None]:
    """Turn an exception of ``catch`` raised inside into the one ``ValueError`` the user reads:
    ``failed``, the error's type and first line in parentheses, then ``then`` (what to do).

    The library's traceback underneath is dropped (``from None``): the message says it all.

    Examples
    --------
    >>> with refusing("the data factory f failed"):
    ...     1 / 0
    Traceback (most recent call last):
    ...
    ValueError: the data factory f failed (ZeroDivisionError: division by zero).
    """
    try:
        yield
    except catch as e:
        lines = str(e).splitlines() or [""]
        error = lines[0] + (" ..." if len(lines) > 1 else "")
        raise ValueError(f"{failed} ({type(e).__name__}: {error}){then}") from None


# -- serialisation ----------------------------------------------------------------------------------
class _DeviceCheck(cloudpickle.Pickler):
    """cloudpickle that refuses tensors off the CPU: a worker may have no such device."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor) and obj.device.type != "cpu":
            raise _OffCPU(obj.device)
        return super().reducer_override(obj)


class _OffCPU(Exception):
    def __init__(self, device: Any):
        super().__init__(str(device))
        self.device = device


def dumps(obj: Any, what: str) -> bytes:
    """``obj`` as bytes that a worker (or a detached cluster's head) rebuilds, checked by a round
    trip; a ValueError that names ``what`` and says what to do when it cannot travel."""
    buf = io.BytesIO()
    try:
        _DeviceCheck(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    except _OffCPU as e:
        kind = "CUDA" if e.device.type == "cuda" else f"{e.device.type}"
        raise ValueError(
            f"`{what}` captured a {kind} tensor (on {e.device}): build it inside the factory "
            f"(e.g. {what}=make_{what}), or move it to the CPU first (.cpu()); each worker puts "
            "it on its own device."
        ) from None
    except Exception as e:
        raise ValueError(
            f"`{what}` cannot be sent to the workers ({type(e).__name__}: {e}). Define it at the "
            "top level of a notebook cell or a module, and create what cannot travel (open "
            "files, locks, clients, generators) inside a zero-argument factory."
        ) from None
    data = buf.getvalue()
    with refusing(
        f"`{what}` does not come back from serialisation",
        "; define it in a notebook cell or an importable module.",
    ):
        cloudpickle.loads(data)
    return data


def payload(workload: Workload) -> bytes:
    """The workload as the bytes that travel (once) to every worker."""
    return dumps(workload, "workload")


# -- the checks --------------------------------------------------------------------------------------
def preflight(
    workload: Workload,
    hparams: HParams,
    *,
    given: Mapping[str, Any] | None = None,
) -> Checked:
    """Check ``workload`` on this machine's CPU before anything starts (see the module's text).

    ``given`` are the hyperparameters passed explicitly (the paper's SGD's may not be given
    with a user's optimizer). Built-in models on built-in data skip the batch: they are known
    to work, and a CIFAR-10 read is not free.

    Examples
    --------
    >>> checked = preflight(Workload("resnet8", "digits"), HParams(steps=10))
    >>> checked.parameters, checked.frozen
    (78042, 0)
    """
    t0 = time.perf_counter()
    given = dict(given or {})
    check_optimizer_settings(workload.optimizer, given)
    checked = Checked(workload)
    if workload.builtin:
        # All 3 built-in sets have 10 classes: counting needs no data (a CIFAR-10 read is not free).
        model = build_model(workload.model, num_classes=10)
        checked.parameters = sum(p.numel() for p in flat_layout(model)[0])
        checked.seconds = time.perf_counter() - t0
        return checked
    model = _built(workload)
    params = [p for p in model.parameters() if p.requires_grad]
    checked.parameters = sum(p.numel() for p in params)
    checked.frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    if not params:
        raise ValueError(
            f"model {workload.model_name} has no parameter with requires_grad=True: nothing to "
            "train."
        )
    _check_dtypes(model, workload.model_name)
    if workload.model_by_value:
        dumps(workload.model, "model")
    pair = _datasets(workload)
    if not workload.builtin_data:
        if not isinstance(workload.data, str):
            checked.data_bytes = len(dumps(workload.data, "data"))
            if checked.data_bytes > DATA_BY_VALUE_LIMIT and not callable(workload.data):
                raise ValueError(
                    f"data is {checked.data_bytes / 2**20:.0f} MB pickled, above the "
                    f"{DATA_BY_VALUE_LIMIT / 2**20:.0f} MB that travel by value to every worker: "
                    "pass a zero-argument factory instead (data=make_data) that builds or reads "
                    "the pair where it runs (from the worker's disk or a bucket)."
                )
        _check_items(pair, hparams.batch_size)
    for what in ("loss", "collate_fn"):
        value = getattr(workload, what)
        if value is not None and not isinstance(value, str):
            dumps(value, what)
    for name, fn in workload.metrics.items():
        if not isinstance(fn, str):
            dumps(fn, f"metrics['{name}']")
    _one_batch(workload, model, hparams.batch_size)
    if not isinstance(workload.optimizer, str):
        dumps(workload.optimizer, "optimizer")
        check_optimizer(workload.optimizer)
    checked.seconds = time.perf_counter() - t0
    return checked


def _built(workload: Workload) -> nn.Module:
    name = workload.model_name
    try:
        model = workload.build_model()
    except ValueError as e:
        if "import path" in str(e) or "cannot be imported" in str(e) or "no attribute" in str(e):
            raise
        raise ValueError(f"building the model {name} failed: {e}") from None
    except TypeError as e:
        raise ValueError(
            f"model={name} could not be called without arguments ({e}): pass a zero-argument "
            f"factory, e.g. functools.partial({name}, ...) or lambda: {name}(...)."
        ) from None
    except Exception as e:
        raise ValueError(f"building the model {name} failed ({type(e).__name__}: {e}).") from None
    if not isinstance(model, nn.Module):
        raise ValueError(
            f"model={name} returned a {type(model).__name__}, not an nn.Module: the factory must "
            "return the network."
        )
    for pname, t in [*model.named_parameters(), *model.named_buffers()]:
        if t.device.type != "cpu":
            kind = "CUDA" if t.device.type == "cuda" else t.device.type
            raise ValueError(
                f"`model` captured a {kind} tensor ({pname!r} on {t.device}): build it inside "
                "the factory on the CPU (model=make_model), or call .cpu() first; each worker "
                "puts it on its own device."
            )
    return model


def _check_dtypes(model: nn.Module, name: str) -> None:
    for (pname, t), what in [
        *((pp, "parameter") for pp in model.named_parameters() if pp[1].requires_grad),
        *((bb, "buffer") for bb in model.named_buffers() if bb[1].dtype.is_floating_point),
    ]:
        if t.dtype != torch.float32:
            raise ValueError(
                f"model {name} has a {t.dtype} {what} {pname!r}: the PS holds float32; call "
                ".float() on the model in its factory."
            )


def _datasets(workload: Workload) -> tuple[Any, Any]:
    try:
        pair = workload.datasets()
    except ValueError:
        raise
    except Exception as e:
        raise ValueError(
            f"the data factory {workload.data_name} failed ({type(e).__name__}: {e})."
        ) from None
    what = "the data factory returned" if callable(workload.data) else "data is"
    if not isinstance(pair, (tuple, list)) or len(pair) != 2:
        size = f" of {len(pair)} items" if hasattr(pair, "__len__") else ""
        raise ValueError(
            f"{what} a {type(pair).__name__}{size}, not a (train, test) pair of Datasets: "
            "return (train_set, test_set)."
        )
    if workload.builtin_data:
        return pair[0], pair[1]
    if all(isinstance(ds, (torch.Tensor, np.ndarray)) for ds in pair):
        raise ValueError(
            f"{what} a pair of {type(pair[0]).__name__}s (inputs and targets?), not (train, test) "
            "Datasets: give e.g. (TensorDataset(x_train, y_train), TensorDataset(x_test, y_test))."
        )
    for role, ds in zip(("train", "test"), pair, strict=True):
        if isinstance(ds, IterableDataset) or not (
            hasattr(ds, "__getitem__") and hasattr(ds, "__len__")
        ):
            raise ValueError(
                f"{what} a {type(ds).__name__} as the {role} set: each must be a map-style "
                "torch Dataset (with __getitem__ and __len__), e.g. TensorDataset(x, y)."
            )
        if len(ds) == 0:
            raise ValueError(f"the {role} set of {workload.data_name} is empty.")
    return pair[0], pair[1]


def _check_items(pair: tuple[Any, Any], batch_size: int) -> None:
    train, _ = pair
    item = train[0]
    if not isinstance(item, (tuple, list)) or len(item) != 2:
        raise ValueError(
            f"the train set's item 0 is a {type(item).__name__}, not an (input, target) pair: "
            "its __getitem__ must return (x, y)."
        )
    if len(train) < batch_size:
        raise ValueError(
            f"batch_size={batch_size} is larger than the train set ({len(train)} items): "
            f"pass batch_size={max(1, len(train) // 4)} or fewer."
        )


def _shape(t: Any) -> str:
    if isinstance(t, torch.Tensor):
        return f"shape {tuple(t.shape)}"
    return f"a {type(t).__name__}"


def _one_batch(workload: Workload, model: nn.Module, batch_size: int) -> None:
    """One batch forward and backward, through the loss and every metric."""
    n = min(batch_size, CHECK_BATCH)
    if workload.builtin_data:
        x, y = next(workload.train_batches(n, seed=0))
    else:
        train, _ = workload.datasets()
        with refusing(
            f"the first {n} items of the train set cannot be made into a batch",
            "; pass collate_fn= to combine them.",
        ):
            loader = DataLoader(
                train, batch_size=min(n, len(train)), collate_fn=workload.collate_fn
            )
            x, y = next(iter(loader))
    model.train()
    with refusing(f"the model {workload.model_name} fails on a batch of inputs of {_shape(x)}"):
        out = model(x)
    _check_loss_shapes(workload, out, y)
    with refusing(
        f"loss={workload.describe()['loss']!r} fails on the model's output of {_shape(out)} "
        f"and targets of {_shape(y)}"
    ):
        loss = workload.loss_fn()(out, y)
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        raise ValueError(
            f"the loss returned {_shape(loss)}: it must return a scalar tensor (e.g. .mean())."
        )
    if not loss.requires_grad:
        raise ValueError(
            "the loss does not depend on the model's parameters (no gradient): compute it from "
            "the model's output."
        )
    if not math.isfinite(float(loss.detach())):
        raise ValueError(
            f"the loss is {float(loss.detach())} on the first batch: check the data's scale."
        )
    loss.backward()
    if not any(p.grad is not None for p in model.parameters() if p.requires_grad):
        raise ValueError("no trainable parameter got a gradient from the loss.")
    with torch.no_grad():
        for name, fn in workload.metric_fns().items():
            metric = workload.metrics[name]
            if metric == "accuracy":
                _need_classes(out, y, f"metric {name!r} (accuracy)")
            if metric == "mse":
                _need_same_shape(out, y, f"metric {name!r} (mse)")
            with refusing(
                f"metric {name!r} fails on the first batch",
                "; it must return a number from (output, target).",
            ):
                value = float(fn(out.detach() if isinstance(out, torch.Tensor) else out, y))
            if math.isnan(value):
                raise ValueError(f"metric {name!r} is nan on the first batch.")
    if batch_size_of(y) != batch_size_of(x):
        raise ValueError(
            f"a batch has {batch_size_of(x)} inputs but {batch_size_of(y)} targets: each item "
            "must be one (input, target) pair."
        )


def _check_loss_shapes(workload: Workload, out: Any, y: Any) -> None:
    if workload.loss == "cross_entropy":
        _need_classes(out, y, "loss='cross_entropy'")
    elif workload.loss == "mse":
        _need_same_shape(out, y, "loss='mse'")


def _need_classes(out: Any, y: Any, what: str) -> None:
    if not isinstance(out, torch.Tensor) or out.dim() != 2:
        raise ValueError(
            f"the model returns {_shape(out)}: with {what} it must return (N, classes) scores; "
            "for regression use loss='mse'."
        )
    if not isinstance(y, torch.Tensor) or y.dtype.is_floating_point or y.dim() != 1:
        raise ValueError(
            f"the model returns shape {tuple(out.shape)} but the targets have {_shape(y)}"
            f"{f' and dtype {y.dtype}' if isinstance(y, torch.Tensor) else ''}: with {what} they "
            f"must be class indices of shape ({out.shape[0]},), integers in [0, {out.shape[1]}); "
            "for regression use loss='mse'."
        )
    if len(y) and (int(y.min()) < 0 or int(y.max()) >= out.shape[1]):
        raise ValueError(
            f"the targets go from {int(y.min())} to {int(y.max())} but the model returns "
            f"{out.shape[1]} class scores: with {what} they must be in [0, {out.shape[1]})."
        )


def _need_same_shape(out: Any, y: Any, what: str) -> None:
    if not isinstance(out, torch.Tensor) or not isinstance(y, torch.Tensor):
        raise ValueError(f"with {what} the model's output and the targets must be tensors.")
    if tuple(out.shape) != tuple(y.shape):
        raise ValueError(
            f"the model returns shape {tuple(out.shape)} but the targets have shape "
            f"{tuple(y.shape)}: with {what} they must match."
        )


def check_optimizer(factory: Any) -> None:
    """Build the optimizer on a stand-in shard, take a step, and write and read its state."""
    name = getattr(factory, "__name__", None) or repr(factory)
    w = np.ones(4, dtype=np.float32)
    try:
        opt = ShardOptimizer(factory, w)
        opt.step(np.full(4, 0.1, dtype=np.float32), 0.5)
        state = opt.state_arrays()
        ShardOptimizer(factory, w.copy(), state)
    except TypeError as e:
        raise ValueError(
            f"optimizer={name}: {e}; pass a torch.optim class or a factory of the parameters, "
            "e.g. functools.partial(torch.optim.AdamW, lr=1e-3)."
        ) from None
    except Exception as e:
        raise ValueError(
            f"optimizer={name} fails on a stand-in shard ({type(e).__name__}: {e})."
        ) from None
