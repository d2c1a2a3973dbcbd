"""The cell form of the magic: ``%%transient_cluster`` and its YAML body.

The body is a ``cluster:`` mapping (TransientCluster's keyword arguments) and an optional
``train:`` mapping (train()'s). :func:`cell_spec` reads it, every unknown key refused;
:func:`check_train` checks the ``train:`` block as train() will, before anything starts.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping
from typing import Any

import yaml
from IPython.core.error import UsageError

from transient_nb import config, limits
from transient_nb.notebook.magic_parsers import _usage_errors

#: Keyword arguments of the local backend that a ``cluster:`` mapping may also give.
BACKEND_OPTIONS = ("stockouts", "nthreads", "cuda", "death_timeout")


def _signature_names(func: Any, drop: tuple[str, ...]) -> list[str]:
    return [
        p.name
        for p in inspect.signature(func).parameters.values()
        if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and p.name not in drop
    ]


def _settings(body: Any, what: str, allowed: list[str]) -> dict[str, Any]:
    if body is None:
        return {}
    if not isinstance(body, Mapping):
        raise UsageError(
            f"`{what}:` must be a mapping of settings, e.g. `{what}:` then `  workers: 4` "
            "on the next line."
        )
    out: dict[str, Any] = {}
    for key, value in body.items():
        name = str(key).replace("-", "_")
        if name not in allowed:
            raise UsageError(f"Unknown {what} setting {key!r}: use some of {', '.join(allowed)}.")
        out[name] = value
    return out


def cell_spec(cell: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The cell's ``cluster:`` settings and its ``train:`` settings (``None`` without one)."""
    from transient_nb.deploy.settings import ClusterSettings

    try:
        spec = yaml.safe_load(cell)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or "not valid YAML"
        raise UsageError(
            f"The cell is not valid YAML{where} ({problem}): write `cluster:` then indented "
            "`key: value` lines."
        ) from None
    if spec is None:
        raise UsageError(
            "The cell is empty: write a `cluster:` mapping (e.g. `workers: 4`) and, "
            "optionally, a `train:` mapping."
        )
    if not isinstance(spec, Mapping):
        raise UsageError(
            "The cell must be a YAML mapping with `cluster:` and, optionally, `train:`."
        )
    unknown = [k for k in spec if k not in ("cluster", "train")]
    if unknown:
        raise UsageError(
            f"Unknown section {unknown[0]!r}: the cell takes `cluster:` and `train:` only."
        )
    allowed = [
        *_signature_names(ClusterSettings.from_arguments, ("cluster_id",)),
        "detached",
    ]
    cluster_kwargs = _settings(spec.get("cluster"), "cluster", [*allowed, *BACKEND_OPTIONS])
    if spec.get("train") is None and "train" not in spec:
        return cluster_kwargs, None
    from transient_nb.training.hparams import HParams
    from transient_nb.training.run import train

    # train()'s own arguments and, through its **hparams, every HParams field.
    hparam_names = [f.name for f in dataclasses.fields(HParams)]
    train_kwargs = _settings(
        spec.get("train") or {},
        "train",
        [*_signature_names(train, ("cluster",)), *hparam_names],
    )
    return cluster_kwargs, train_kwargs


def check_train(train_kwargs: dict[str, Any], cluster_kwargs: dict[str, Any]) -> None:
    """Check a ``train:`` block as train() checks it (the model built, one batch run, the
    hyperparameters validated), before anything starts: a typo costs nothing."""
    from transient_nb.training.run import check_checkpoint_url, check_train_args

    with _usage_errors("train: "):
        not_checked = ("budget", "checkpoint_url", "seed", "device", "wait", "resume")
        check_train_args(**{k: v for k, v in train_kwargs.items() if k not in not_checked})
        # On a cloud backend: shared storage, probed with a write, before any VM is made.
        check_checkpoint_url(
            train_kwargs.get("checkpoint_url"),
            str(config.get("backend", override_with=cluster_kwargs.get("backend"))),
        )
        limits.dollars(train_kwargs.get("budget"), "budget")
