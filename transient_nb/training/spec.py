"""What the user gives ``train()``: the model, data, loss, metrics, optimizer and stop
conditions, resolved and checked.

:func:`resolve` turns ``model=``, ``data=``, ``loss=``, ``metrics=`` and ``optimizer=`` into a
:class:`~transient_nb.training.workload.Workload` (their forms checked; import paths of callables
resolved); :func:`stop_conditions` reads ``stop_at=`` and ``target_accuracy=``; the text forms of
the CLI and the magics (``--metrics``, ``--stop-at``) are read here too.
:func:`check_train_args` is the one entry point that ``train()`` and every surface (the magics,
the CLI, a detached cluster's handle) call: it resolves, validates the hyperparameters and runs
:func:`~transient_nb.training.preflight.preflight` (the model built, one batch run) before
anything starts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from torch import nn

from transient_nb import limits
from transient_nb.eventlog.folds import CURVE_COLUMNS
from transient_nb.training.data import check_data_spec
from transient_nb.training.hparams import HParams
from transient_nb.training.models import MODELS
from transient_nb.training.preflight import Checked, preflight
from transient_nb.training.workload import (
    LOSSES,
    METRICS,
    Workload,
    import_path,
    is_builtin_data,
    lower_is_better,
)

#: Names a metric may not have: they are columns of ``run.history`` already.
RESERVED_METRIC_NAMES = (*(c for c in CURVE_COLUMNS if c != "accuracy"), "test_loss")


# -- resolving what was given -----------------------------------------------------------------------
#: The keyword arguments of :func:`resolve` beside the model and the data: what is trained.
WORKLOAD = ("loss", "metrics", "optimizer", "collate_fn", "num_workers")


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
    _check_named_or_callable(loss, "loss", LOSSES, "a callable (output, target) -> scalar tensor")
    metrics = _metrics(metrics, loss)
    optimizer = "sgd" if optimizer is None else optimizer
    _check_named_or_callable(
        optimizer,
        "optimizer",
        ("sgd",),
        "a torch.optim class or factory instead of the paper's momentum SGD and schedule, e.g. "
        "functools.partial(torch.optim.AdamW, lr=1e-3)",
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


def _check_named_or_callable(value: Any, what: str, names: Sequence[str], own: str) -> None:
    """``value`` is one of the built-in ``names`` of a ``what``, or a callable (``own`` says
    which)."""
    named = " or ".join(map(repr, names))
    if isinstance(value, str) and value not in names:
        raise ValueError(f"Unknown {what} {value!r}: use {named}, or {own}.")
    if not isinstance(value, str) and not callable(value):
        raise ValueError(
            f"{what}={value!r} is neither a name nor a callable: use {named}, or {own}."
        )


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


# -- stop conditions --------------------------------------------------
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


# -- the arguments of train() that need no cluster -----------------------------------------------------
def check_train_args(**train_args: Any) -> HParams:
    """Check the arguments of :func:`~transient_nb.train` that need no cluster (the keyword
    arguments of :func:`check_workload`); returns the :class:`HParams`. The model, data, loss,
    metrics and optimizer go through :func:`preflight`.

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
    return check_workload(**train_args)[0]


def check_workload(
    *,
    model: Any = "resnet32",
    data: Any = "synthetic",
    steps: int = HParams.steps,
    shards: int = 1,
    target_accuracy: float | None = None,
    deadline: Any = None,
    stop_at: Mapping[str, Any] | None = None,
    **hparams: Any,
) -> tuple[HParams, Checked]:
    """:func:`check_train_args`, with what :func:`preflight` found (the keyword arguments of
    :func:`resolve` among ``hparams`` say what is trained)."""
    if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
        raise ValueError(f"shards={shards!r} must be a whole number of at least 1.")
    if target_accuracy is not None and not 0 < target_accuracy <= 1:
        raise ValueError(f"target_accuracy={target_accuracy!r} must be in (0, 1], e.g. 0.9.")
    if deadline is not None and not hasattr(deadline, "timestamp"):
        limits.duration(deadline, "deadline", "2h")
    workload = resolve(model, data, **{k: hparams.pop(k) for k in WORKLOAD if k in hparams})
    given = {k: v for k, v in hparams.items() if v is not None}
    hp = HParams.from_dict({"steps": steps, **given}).validate()
    stops = stop_conditions(stop_at, workload.metrics, target_accuracy)  # cheap: first
    checked = preflight(workload, hp, given=given)
    checked.stop_at = stops
    return hp, checked


__all__ = [
    "check_train_args",
    "check_workload",
    "import_path",
    "metrics_from_text",
    "reached",
    "resolve",
    "stop_at_from_text",
    "stop_conditions",
]
