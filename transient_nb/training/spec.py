"""What the user gives ``train()``, checked before anything is spent.

:func:`resolve` turns ``model=``, ``data=``, ``loss=``, ``metrics=`` and ``optimizer=`` into a
:class:`~transient_nb.training.workload.Workload`; :func:`preflight` then does, on the CPU of the
calling process, what would otherwise fail on a rented cluster:

1. build the model once and count its parameters (trainable and frozen);
2. send the model, the data and every callable through a serialisation round trip (what
   travels to the workers, by value for things defined in a notebook);
3. draw one batch, run it forward and backward, through the loss and every metric; build the
   optimizer on a stand-in shard and take one step.

Every failure is one ``ValueError`` that names the bad value and says what to do. Nothing has
started when it is raised, so nothing is left behind. :func:`check_train_args` is the one entry
point that ``train()`` and every surface (the magics, the CLI, a detached cluster's handle) call.
"""

from __future__ import annotations

import io
import math
import pickle
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import cloudpickle
import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset

from transient_nb import limits
from transient_nb.eventlog.folds import HISTORY_COLUMNS
from transient_nb.training.data import check_data_spec
from transient_nb.training.flat import flat_layout
from transient_nb.training.hparams import HParams
from transient_nb.training.models import MODELS, build_model
from transient_nb.training.optim import ShardOptimizer
from transient_nb.training.workload import (
    LOSSES,
    METRICS,
    Workload,
    batch_size_of,
    import_path,
    is_builtin_data,
    lower_is_better,
)

#: A ``(train, test)`` pair given by value travels to every worker once; above this many bytes
#: (pickled) it is refused: a factory then builds it where it runs.
DATA_BY_VALUE_LIMIT = 200 * 2**20
#: Items of the batch that the pre-flight check runs (at most; fewer for a smaller batch size).
CHECK_BATCH = 32
#: Names a metric may not have: they are columns of ``run.history`` already.
RESERVED_METRIC_NAMES = (*(c for c in HISTORY_COLUMNS if c != "accuracy"), "test_loss")
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


# -- resolving what was given -----------------------------------------------------------------------
def resolve(
    model: Any = None,
    data: Any = None,
    *,
    loss: Any = None,
    metrics: Any = None,
    optimizer: Any = None,
    collate_fn: Any = None,
    num_workers: int | None = None,
) -> Workload:
    """A :class:`~transient_nb.training.workload.Workload` from ``train()``'s arguments (their
    forms checked; nothing is built or called yet).

    Examples
    --------
    >>> resolve("resnet8", "digits").builtin
    True
    >>> resolve("resnet8", "digits", loss="mse").metrics
    {'mse': 'mse'}
    >>> resolve("resnet1000")
    Traceback (most recent call last):
    ...
    ValueError: Unknown model 'resnet1000': use one of resnet8, resnet20, resnet32, resnet32-t2t. Or give your own: an nn.Module, a zero-argument factory that returns one, or an import path 'package.module:attr'.
    """
    model = "resnet32" if model is None else model
    data = "synthetic" if data is None else data
    _check_model_form(model)
    _check_data_form(data)
    # Import paths of callables ("mypkg.losses:huber"): what a CLI or a YAML cell can name.
    loss, optimizer, collate_fn = (
        import_path(v, what) if isinstance(v, str) and ":" in v else v
        for v, what in ((loss, "loss"), (optimizer, "optimizer"), (collate_fn, "collate_fn"))
    )
    loss = "cross_entropy" if loss is None else loss
    if isinstance(loss, str) and loss not in LOSSES:
        raise ValueError(
            f"Unknown loss {loss!r}: use {' or '.join(map(repr, LOSSES))}, or a callable "
            "(output, target) -> scalar tensor."
        )
    if not isinstance(loss, str) and not callable(loss):
        raise ValueError(
            f"loss={loss!r} is neither a name nor a callable: use 'cross_entropy', 'mse' or "
            "(output, target) -> scalar tensor."
        )
    metrics = _metrics(metrics, loss)
    optimizer = "sgd" if optimizer is None else optimizer
    if isinstance(optimizer, str) and optimizer != "sgd":
        raise ValueError(
            f"Unknown optimizer {optimizer!r}: use 'sgd' (the paper's momentum SGD and schedule) "
            "or a torch.optim class or factory, e.g. functools.partial(torch.optim.AdamW, lr=1e-3)."
        )
    if not isinstance(optimizer, str) and not callable(optimizer):
        raise ValueError(
            f"optimizer={optimizer!r} is not callable: give a torch.optim class or factory, e.g. "
            "functools.partial(torch.optim.AdamW, lr=1e-3)."
        )
    if collate_fn is not None and not callable(collate_fn):
        raise ValueError(f"collate_fn={collate_fn!r} is not callable: give a function or None.")
    workers = 0 if num_workers is None else num_workers
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        raise ValueError(f"num_workers={num_workers!r} must be a whole number, 0 or more.")
    if (collate_fn is not None or workers) and is_builtin_data(data):
        raise ValueError(
            f"collate_fn and num_workers apply to a Dataset pair; data={data!r} is a built-in "
            "set with its own batches: drop them, or pass your own (train, test) Datasets."
        )
    return Workload(model, data, loss, metrics, optimizer, collate_fn, workers)


def _check_model_form(model: Any) -> None:
    if isinstance(model, str):
        if ":" in model:
            return  # an import path, resolved by preflight
        if model not in MODELS:
            raise ValueError(
                f"Unknown model {model!r}: use one of {', '.join(MODELS)}. Or give your own: an "
                "nn.Module, a zero-argument factory that returns one, or an import path "
                "'package.module:attr'."
            )
        return
    if not isinstance(model, nn.Module) and not callable(model):
        raise ValueError(
            f"model={model!r} is a {type(model).__name__}: give an nn.Module, a zero-argument "
            "factory that returns one (a class or a function), an import path "
            f"'package.module:attr', or one of {', '.join(MODELS)}."
        )


def _check_data_form(data: Any) -> None:
    if isinstance(data, str):
        if is_builtin_data(data):
            check_data_spec(data)
        elif ":" not in data:
            check_data_spec(data)  # names the built-in forms
        return
    if isinstance(data, (tuple, list)) or callable(data):
        return
    raise ValueError(
        f"data={type(data).__name__} is not a (train, test) pair of Datasets: give the pair, a "
        "zero-argument factory that returns it, an import path 'package.module:attr', or a "
        "built-in spec such as 'digits'."
    )


def _metrics(metrics: Any, loss: Any) -> dict[str, Any]:
    if metrics is None:
        if loss == "cross_entropy":
            return {"accuracy": "accuracy"}
        return {"mse": "mse"} if loss == "mse" else {}
    if isinstance(metrics, str):
        metrics = [metrics]
    if isinstance(metrics, (list, tuple)):
        unknown = [m for m in metrics if m not in METRICS]
        if unknown:
            raise ValueError(
                f"Unknown metric {unknown[0]!r}: name one of {', '.join(METRICS)}, or give a "
                "mapping {'name': (output, target) -> float}."
            )
        metrics = {m: m for m in metrics}
    if not isinstance(metrics, Mapping):
        raise ValueError(
            f"metrics={metrics!r}: give a mapping {{'name': (output, target) -> float}} or the "
            f"names {', '.join(METRICS)}."
        )
    out: dict[str, Any] = {}
    for name, fn in metrics.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"metric name {name!r} must be a word such as 'mae' or 'top5'.")
        if name in RESERVED_METRIC_NAMES:
            raise ValueError(
                f"metric name {name!r} is taken by a column of run.history; call it e.g. "
                f"'test_{name}'."
            )
        if isinstance(fn, str) and ":" in fn:
            fn = import_path(fn, f"metrics[{name!r}]")
        if isinstance(fn, str) and fn not in METRICS:
            raise ValueError(
                f"metric {name!r}: unknown built-in {fn!r}; use {', '.join(METRICS)} or a callable."
            )
        if not isinstance(fn, str) and not callable(fn):
            raise ValueError(f"metric {name!r} is not callable: give (output, target) -> float.")
        out[name] = fn
    return out


# -- the text forms of the CLI and the magics ----------------------------------------------------------
def metrics_from_text(text: str, lookup: Any = None) -> dict[str, Any]:
    """``--metrics`` as typed: ``accuracy,mae=mypkg.metrics:mae,mypkg.metrics:f1``.

    Each item is a built-in name, ``NAME=REF`` or a REF named by its last part; a REF is an
    import path, or what ``lookup`` (a notebook's namespace) finds under that name.

    Examples
    --------
    >>> sorted(metrics_from_text("accuracy,mae=math:fabs"))
    ['accuracy', 'mae']
    >>> metrics_from_text("f1", lookup={"f1": len}.get)["f1"] is len
    True
    """
    out: dict[str, Any] = {}
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        name, sep, ref = item.partition("=")
        if not sep:
            ref, name = name, name.rpartition(":")[2].rpartition(".")[2]
        found = lookup(ref) if lookup is not None and ref.isidentifier() else None
        out[name.strip()] = found if found is not None else ref.strip()
    return out


def stop_at_from_text(text: str) -> dict[str, str]:
    """``--stop-at`` as typed: ``mae=0.3`` (the metric's direction), ``f1>=0.8``, ``loss<=2``.

    Examples
    --------
    >>> stop_at_from_text("mae=0.3,f1>=0.8")
    {'mae': '0.3', 'f1': '>=0.8'}
    """
    out: dict[str, str] = {}
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        for op in ("<=", ">=", "="):
            name, sep, value = item.partition(op)
            if sep:
                out[name.strip()] = (op if op != "=" else "") + value.strip()
                break
        else:
            raise ValueError(
                f"--stop-at {item!r}: write METRIC=VALUE, METRIC<=VALUE or METRIC>=VALUE."
            )
    return out


# -- stop conditions and the optimizer's settings --------------------------------------------------
def stop_conditions(
    stop_at: Mapping[str, Any] | None,
    metrics: Mapping[str, Any],
    target_accuracy: float | None = None,
) -> dict[str, tuple[str, float]]:
    """``stop_at`` (and ``target_accuracy``) as metric -> (``">="`` or ``"<="``, threshold).

    A number stops the run when the metric reaches it in its direction (:func:`lower_is_better`:
    loss-like names go down); ``"<=0.3"`` or ``">=0.9"`` says the direction outright.

    Examples
    --------
    >>> stop_conditions({"mae": 0.3}, {"mae": abs})
    {'mae': ('<=', 0.3)}
    >>> stop_conditions({"f1": "<=0.5"}, {"f1": abs}, target_accuracy=None)
    {'f1': ('<=', 0.5)}
    >>> stop_conditions(None, {"accuracy": "accuracy"}, target_accuracy=0.9)
    {'accuracy': ('>=', 0.9)}
    """
    out: dict[str, tuple[str, float]] = {}
    if target_accuracy is not None:
        if "accuracy" not in metrics:
            raise ValueError(
                f"target_accuracy={target_accuracy!r} needs the accuracy metric, and this run's "
                f"metrics are {sorted(metrics) or 'none'}: use stop_at={{'metric': value}} instead."
            )
        out["accuracy"] = (">=", float(target_accuracy))
    if stop_at is None:
        return out
    if not isinstance(stop_at, Mapping):
        raise ValueError(f"stop_at={stop_at!r}: give a mapping such as {{'mae': 0.3}}.")
    known = [*metrics, "test_loss"]
    for name, value in stop_at.items():
        if name not in known:
            raise ValueError(
                f"stop_at names {name!r}, which is not a metric of this run: use one of "
                f"{', '.join(known)}."
            )
        op = "<=" if lower_is_better(str(name), metrics.get(name)) else ">="
        text = value.strip() if isinstance(value, str) else None
        if text is not None and text[:2] in ("<=", ">="):
            op, text = text[:2], text[2:]
        try:
            threshold = float(text if text is not None else value)
        except (TypeError, ValueError):
            threshold = math.nan
        if isinstance(value, bool) or not math.isfinite(threshold):
            raise ValueError(
                f"stop_at[{name!r}]={value!r} must be a number, or '<=X' / '>=X' to give the "
                "direction."
            )
        out[str(name)] = (op, threshold)
    return out


def reached(stop_at: Mapping[str, tuple[str, float]], values: Mapping[str, Any]) -> str | None:
    """The first condition of ``stop_at`` that ``values`` meets, as text (``"mae<=0.3"``).

    Examples
    --------
    >>> reached({"mae": ("<=", 0.3)}, {"mae": 0.29}), reached({"mae": ("<=", 0.3)}, {"mae": 0.4})
    ('mae<=0.3', None)
    """
    for name, (op, threshold) in stop_at.items():
        value = values.get(name)
        if value is None or not math.isfinite(float(value)):
            continue
        if (op == "<=" and value <= threshold) or (op == ">=" and value >= threshold):
            return f"{name}{op}{threshold:g}"
    return None


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
    try:
        cloudpickle.loads(data)
    except Exception as e:
        raise ValueError(
            f"`{what}` does not come back from serialisation ({type(e).__name__}: {e}); "
            "define it in a notebook cell or an importable module."
        ) from None
    return data


def payload(workload: Workload) -> bytes:
    """The workload as the bytes that travel (once) to every worker."""
    return dumps(workload, "workload")


# -- the checks --------------------------------------------------------------------------------------
def preflight(
    workload: Workload,
    hparams: HParams,
    *,
    stop_at: Mapping[str, Any] | None = None,
    target_accuracy: float | None = None,
    given: Mapping[str, Any] | None = None,
) -> Checked:
    """Check ``workload`` on this machine's CPU before anything starts (see the module's text).

    ``given`` are the hyperparameters passed explicitly (the paper's SGD's may not be given
    with a user's optimizer). Built-in models on built-in data skip the batch: they are known
    to work, and a CIFAR-10 read is not free.

    Examples
    --------
    >>> checked = preflight(resolve("resnet8", "digits"), HParams(steps=10))
    >>> checked.parameters, checked.frozen
    (78042, 0)
    """
    t0 = time.perf_counter()
    given = dict(given or {})
    check_optimizer_settings(workload.optimizer, given)
    stops = stop_conditions(stop_at, workload.metrics, target_accuracy)
    checked = Checked(workload, stop_at=stops)
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
        try:
            loader = DataLoader(
                train, batch_size=min(n, len(train)), collate_fn=workload.collate_fn
            )
            x, y = next(iter(loader))
        except Exception as e:
            raise ValueError(
                f"the first {n} items of the train set cannot be made into a batch "
                f"({type(e).__name__}: {e}); pass collate_fn= to combine them."
            ) from None
    model.train()
    try:
        out = model(x)
    except Exception as e:
        raise ValueError(
            f"the model {workload.model_name} fails on a batch of inputs of {_shape(x)} "
            f"({type(e).__name__}: {e})."
        ) from None
    _check_loss_shapes(workload, out, y)
    try:
        loss = workload.loss_fn()(out, y)
    except Exception as e:
        raise ValueError(
            f"loss={workload.describe()['loss']!r} fails on the model's output of {_shape(out)} "
            f"and targets of {_shape(y)} ({type(e).__name__}: {e})."
        ) from None
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
            try:
                value = float(fn(out.detach() if isinstance(out, torch.Tensor) else out, y))
            except Exception as e:
                raise ValueError(
                    f"metric {name!r} fails on the first batch ({type(e).__name__}: {e}); it must "
                    "return a number from (output, target)."
                ) from None
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


# -- the arguments of train() that need no cluster -----------------------------------------------------
def check_train_args(
    *,
    model: Any = "resnet32",
    data: Any = "synthetic",
    steps: int = HParams.steps,
    shards: int = 1,
    target_accuracy: float | None = None,
    deadline: Any = None,
    loss: Any = None,
    metrics: Any = None,
    optimizer: Any = None,
    stop_at: Mapping[str, Any] | None = None,
    collate_fn: Any = None,
    num_workers: int | None = None,
    **hparams: Any,
) -> HParams:
    """Check the arguments of :func:`~transient_nb.train` that need no cluster; returns the
    :class:`HParams`. The model, data, loss, metrics and optimizer go through :func:`preflight`.

    The ``%%transient_cluster`` cell magic and the CLI call it before they start anything.

    Examples
    --------
    >>> check_train_args(model="resnet8", data="digits", steps=100).steps
    100
    >>> check_train_args(model="resnet8", data="digits", eval_images=0)
    Traceback (most recent call last):
    ...
    ValueError: eval_images=0 must be a whole number of at least 1.
    """
    return check_workload(
        model=model,
        data=data,
        steps=steps,
        shards=shards,
        target_accuracy=target_accuracy,
        deadline=deadline,
        loss=loss,
        metrics=metrics,
        optimizer=optimizer,
        stop_at=stop_at,
        collate_fn=collate_fn,
        num_workers=num_workers,
        **hparams,
    )[0]


def check_workload(
    *,
    model: Any = "resnet32",
    data: Any = "synthetic",
    steps: int = HParams.steps,
    shards: int = 1,
    target_accuracy: float | None = None,
    deadline: Any = None,
    loss: Any = None,
    metrics: Any = None,
    optimizer: Any = None,
    stop_at: Mapping[str, Any] | None = None,
    collate_fn: Any = None,
    num_workers: int | None = None,
    **hparams: Any,
) -> tuple[HParams, Checked]:
    """:func:`check_train_args`, with what :func:`preflight` found."""
    if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
        raise ValueError(f"shards={shards!r} must be a whole number of at least 1.")
    if target_accuracy is not None and not 0 < target_accuracy <= 1:
        raise ValueError(f"target_accuracy={target_accuracy!r} must be in (0, 1], e.g. 0.9.")
    if deadline is not None and not hasattr(deadline, "timestamp"):
        limits.duration(deadline, "deadline", "2h")
    workload = resolve(
        model,
        data,
        loss=loss,
        metrics=metrics,
        optimizer=optimizer,
        collate_fn=collate_fn,
        num_workers=num_workers,
    )
    given = {k: v for k, v in hparams.items() if v is not None}
    hp = HParams.from_dict({"steps": steps, **given}).validate()
    checked = preflight(workload, hp, stop_at=stop_at, target_accuracy=target_accuracy, given=given)
    return hp, checked


__all__ = [
    "DATA_BY_VALUE_LIMIT",
    "Checked",
    "check_optimizer",
    "check_train_args",
    "check_workload",
    "dumps",
    "import_path",
    "payload",
    "preflight",
    "reached",
    "resolve",
    "stop_conditions",
]
