"""Resuming a run: where it stopped, and its record joined with the earlier one.

``train(cluster, resume=RUN_ID_OR_CHECKPOINT_URL)`` continues a run from its newest complete
checkpoint, on the same cluster or a new one (its head may have died, or the notebook that owned
it). The resumed run keeps its id and its checkpoint folder (``URL/<run id>/`` under the
``checkpoint_url`` it was given), so the step count goes on, and it loads only checkpoints whose
manifest names that run (:func:`~transient_nb.training.checkpoint.check_owner`); its
``train-started`` event names the record it continues (``resumed_from``), the step it resumed at
and the steps lost since the last step known. :func:`summarize_run` and :func:`run_history`
follow that chain back and join the records into one run: steps go on, wall time and money add up.
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from transient_nb import config
from transient_nb.catalog.prices import BILLING_MINIMUM_S
from transient_nb.eventlog.folds import Event, summarize, training_curve
from transient_nb.eventlog.records import read_run_record
from transient_nb.training import checkpoint
from transient_nb.training.hparams import HParams

#: What a run id looks like (``TrainingRun.id``).
RUN_ID = checkpoint.RUN_ID
#: Summary keys that add up over the joined records.
ADDED = (
    "wall_s",
    "cost",
    "cost_on_demand",
    "preemptions",
    "replacements",
    "ps_recoveries",
    "steps_lost",
    "trainer_failures",
)


@dataclass
class ResumePoint:
    """Where a run is resumed from.

    Attributes
    ----------
    run_id
        The run's id (the resumed run keeps it).
    checkpoint_url
        Its own checkpoint folder (``URL/<run id>/``, or its default in the run's folder); the
        newest complete checkpoint there is the starting point.
    record
        The run record (``events.jsonl``) of its latest attempt, if known.
    last_step
        The last step that record shows (the steps after the checkpoint are lost).
    settings
        ``model``, ``data``, ``shards``, ``steps`` and ``hparams`` of the earlier run.
    """

    run_id: str
    checkpoint_url: str
    record: str | None = None
    last_step: int | None = None
    settings: dict[str, Any] = field(default_factory=dict)


def _records(run_dir: str) -> list[str]:
    paths = glob.glob(os.path.join(run_dir, "*", "events.jsonl"))
    return sorted(paths, key=os.path.getmtime, reverse=True)  # the newest attempt first


def _run_events(path: str, run_id: str) -> list[Event]:
    return [e for e in read_run_record(path) if e.get("run") in (None, run_id)]


def _last_step(events: Iterable[Mapping[str, Any]], run_id: str) -> int | None:
    last = None
    for e in events:
        if e.get("run") != run_id:
            continue
        if (
            e.get("kind") in ("metrics", "train-finished", "checkpoint")
            and e.get("step") is not None
        ):
            last = max(int(e["step"]), last or 0)
        elif e.get("kind") == "train-started" and e.get("resumed_step") is not None:
            last = max(int(e["resumed_step"]), last or 0)
    return last


def find(resume: str, run_dir: str | None = None, checkpoint_url: str | None = None) -> ResumePoint:
    """The point to resume ``resume`` (a run id or a checkpoint URL) from.

    A run id is looked up in the run records under ``run_dir`` (default ``transient.run-dir``);
    with no record of it, in its folder under ``checkpoint_url`` (``URL/<run id>/``), if given. Its
    newest complete checkpoint must be that run's.

    A URL is a run's own folder (it holds the ``step-*`` folders), or a ``checkpoint_url`` that
    runs share: the one run under it is taken; with several, the error lists them.

    Raises
    ------
    ValueError
        Nothing to resume: no record of that run, no complete checkpoint, a shared URL with
        several runs, or a checkpoint of another run.
    """
    if not isinstance(resume, str) or not resume:
        raise ValueError(
            f"resume={resume!r}: give a run id such as 'run-1a2b3c4d' or a checkpoint URL."
        )
    if RUN_ID.match(resume):
        base = os.path.expanduser(run_dir or config.get("run-dir"))
        for path in _records(base):
            events = read_run_record(path)
            started = [
                e for e in events if e.get("kind") == "train-started" and e.get("run") == resume
            ]
            if not started:
                continue
            s = started[-1]
            point = ResumePoint(
                run_id=resume,
                checkpoint_url=str(s["checkpoint_url"]),
                record=path,
                last_step=_last_step(events, resume),
                settings={
                    "model": s.get("model"),
                    "data": s.get("data"),
                    "shards": s.get("shards"),
                    "steps": s.get("steps"),
                    "hparams": json.loads(s.get("hparams") or "{}"),
                    "model_ref": s.get("model_ref"),
                    "optimizer": s.get("optimizer"),
                    "target_accuracy": s.get("target_accuracy"),
                },
            )
            ck = _require_checkpoint(point.checkpoint_url, resume, run=resume)
            if point.settings["optimizer"] is None:  # a built-in run's start does not name it
                point.settings["optimizer"] = ck.meta.get("optimizer")
            return point
        if checkpoint_url is not None:
            return _from_checkpoint(checkpoint.run_url(checkpoint_url, resume), resume, resume)
        raise ValueError(
            f"resume={resume!r}: no run record under {base} has that run; pass the run's "
            "checkpoint URL instead (its train-started event names it), or its checkpoint_url= "
            "(the run's folder under it is found by its id)."
        )
    return _from_checkpoint(_run_folder(resume), resume)


def _run_folder(url: str) -> str:
    """``url`` if it is a run's folder; the one run's folder if it is a shared URL with one."""
    if checkpoint.steps(url):
        return url
    try:
        found = checkpoint.runs(url)
    except Exception:  # unreadable: _require_checkpoint says so
        return url
    if len(found) == 1:
        return checkpoint.run_url(url, found[0])
    if len(found) > 1:
        listed = ", ".join(found)
        raise ValueError(
            f"{url} holds the checkpoints of {len(found)} runs ({listed}): name one, by its "
            f"id (e.g. {found[-1]!r}) or its folder ({checkpoint.run_url(url, found[-1])!r})."
        )
    return url


def _from_checkpoint(url: str, what: str, run: str | None = None) -> ResumePoint:
    """The point of the run whose own folder is ``url``, from its newest manifest."""
    ck = _require_checkpoint(url, what, run=run)
    meta = ck.meta
    owner = str(meta.get("run") or "")
    folder = url.rstrip("/").rsplit("/", 1)[-1]
    if RUN_ID.match(folder) and owner != folder:
        # URL/<run id>/ holds another run's checkpoint: resuming it would continue that run
        # in this one's folder.
        checkpoint.check_owner(ck, folder)
    return ResumePoint(
        run_id=owner,
        checkpoint_url=url,
        settings={
            "model": meta.get("model"),
            "model_ref": meta.get("model_ref"),
            "optimizer": meta.get("optimizer"),
            "data": meta.get("data"),
            "shards": meta.get("shards"),
            "steps": (meta.get("hparams") or {}).get("steps"),
            "hparams": dict(meta.get("hparams") or {}),
        },
    )


def _require_checkpoint(url: str, what: str, run: str | None = None) -> checkpoint.Checkpoint:
    try:
        ck = checkpoint.load_latest(url, run=run)
    except checkpoint.NotOwned:
        raise  # says whose it is, and what to do
    except Exception as e:
        raise ValueError(f"resume={what!r}: its checkpoints at {url} cannot be read ({e}).") from e
    if ck is None:
        raise ValueError(
            f"resume={what!r}: there is no complete checkpoint at {url}, so nothing can be resumed."
        )
    return ck


# -- one run over several records --------------------------------------------------------------------
def earlier_events(started: Mapping[str, Any]) -> list[Event]:
    """The events of the attempt that ``started`` (a ``train-started`` event) continues ([] if none)."""
    path = started.get("resumed_from")
    if not path or not os.path.exists(str(path)):
        return []
    return _run_events(str(path), str(started.get("run")))


def _started(events: Iterable[Mapping[str, Any]]) -> Mapping[str, Any]:
    return next((e for e in events if e.get("kind") == "train-started"), {})


def summarize_run(events: Sequence[Event], minimum_s: float = BILLING_MINIMUM_S) -> dict[str, Any]:
    """:func:`~transient_nb.eventlog.folds.summarize`, joined with every earlier attempt of a resumed run.

    Steps and accuracy are the latest attempt's; wall time, money, preemptions, recoveries and
    steps lost add up (plus the steps lost between the last step known and the checkpoint
    resumed from); ``attempts`` counts the records joined.
    """
    s = summarize(events, minimum_s)
    started = _started(events)
    s["attempts"] = 1
    if not started.get("resumed_from"):
        return s
    s["steps_lost"] += int(started.get("steps_lost") or 0)
    earlier = earlier_events(started)
    if not earlier:
        return s
    e = summarize_run(earlier, minimum_s)
    for key in ADDED:
        s[key] = (s.get(key) or 0) + (e.get(key) or 0)
    s["attempts"] += e["attempts"]
    if s.get("accuracy") is None:
        s["accuracy"] = e.get("accuracy")
    s["saved"] = s["cost_on_demand"] - s["cost"]
    s["saved_fraction"] = s["saved"] / s["cost_on_demand"] if s["cost_on_demand"] > 0 else 0.0
    batch = int(started.get("batch_size") or 0)
    done = max(0, int(s["steps"]) - int(started.get("resumed_step") or 0)) + int(e["steps"] or 0)
    s["img_per_s"] = done * batch / s["wall_s"] if s["wall_s"] > 0 else 0.0
    return s


def run_history(
    events: Sequence[Event], t0: float, minimum_s: float = BILLING_MINIMUM_S
) -> pd.DataFrame:
    """:func:`~transient_nb.eventlog.folds.training_curve`, with the earlier attempts' rows first
    (``run.history``).

    Time and money go on from where the earlier attempt's rows end.
    """
    later = training_curve(events, t0=t0, minimum_s=minimum_s)
    started = _started(events)
    earlier = earlier_events(started) if started.get("resumed_from") else []
    if not earlier:
        return later
    e_started = _started(earlier)
    before = run_history(earlier, t0=float(e_started.get("time", t0)), minimum_s=minimum_s)
    if before.empty:
        return later
    last = before.iloc[-1]
    later = later.copy()
    later["time"] += float(last["time"])
    later["cost"] += float(last["cost"])
    later["cost_on_demand"] += float(last["cost_on_demand"])
    return pd.concat([before, later], ignore_index=True)


def settings(
    point: ResumePoint,
    model: Any,
    data: Any,
    shards: int | None,
    steps: int | None,
    hparams: dict[str, Any],
) -> tuple[Any, Any, int, int | None, dict[str, Any]]:
    """The earlier run's settings, with what the caller gave checked against them."""
    earlier = point.settings
    for key, given in (("model", model), ("data", data), ("shards", shards)):
        if (
            isinstance(given, (str, int))
            and earlier.get(key) is not None
            and given != earlier[key]
            and not (key == "model" and given == earlier.get("model_ref"))
        ):
            raise ValueError(
                f"{key}={given!r} differs from the run being resumed ({earlier[key]!r}): its "
                f"checkpoint holds that {key}'s weights. Drop {key}= to resume, or start a new run."
            )
    merged = {
        k: v
        for k, v in dict(earlier.get("hparams") or {}).items()
        if k in HParams.__dataclass_fields__ and k != "steps"
    }
    merged.update(hparams)
    # Here, not at the top: a client that only reads a run (the CLI, connect()) never imports torch.
    from transient_nb.training.models import MODELS
    from transient_nb.training.workload import is_builtin_data

    if model is None:
        model = earlier.get("model_ref") or earlier.get("model") or "resnet32"
        if not earlier.get("model_ref") and ":" not in str(model) and model not in MODELS:
            raise ValueError(
                f"resume: the run's model ({model}) was defined in a notebook and travelled "
                "by value; pass model= again (the same class or factory)."
            )
    if data is None:
        if "data" in earlier and earlier["data"] is None:  # a checkpoint of data by value
            raise ValueError("resume: the run's data travelled by value; pass data= again.")
        data = earlier.get("data") or "synthetic"
        if not is_builtin_data(data) and ":" not in str(data):
            raise ValueError(
                f"resume: the run's data ({data}) travelled by value; pass data= again."
            )
    return (
        model,
        data,
        int(shards or earlier.get("shards") or 1),
        (steps if steps is not None else earlier.get("steps")),
        merged,
    )


def check_optimizer(point: ResumePoint, optimizer: Any) -> None:
    """Refuse to resume a run of a user's optimizer without it, or the paper's SGD with one:
    its checkpoint holds that optimizer's state, which another would silently drop.

    Examples
    --------
    >>> point = ResumePoint("run-1", "memory://x", settings={"optimizer": "partial(AdamW, lr=0.001)"})
    >>> check_optimizer(point, None)
    Traceback (most recent call last):
    ...
    ValueError: resume: run-1 trained with optimizer=partial(AdamW, lr=0.001), whose state is in its checkpoint: pass the same optimizer= again.
    """
    used = point.settings.get("optimizer")
    own = used not in (None, "sgd")
    given = optimizer not in (None, "sgd")
    if own and not given:
        raise ValueError(
            f"resume: {point.run_id} trained with optimizer={used}, whose state is in its "
            "checkpoint: pass the same optimizer= again."
        )
    if given and used == "sgd":
        raise ValueError(
            f"resume: {point.run_id} trained with the paper's SGD (its momentum is in the "
            "checkpoint): drop optimizer= to resume it, or start a new run."
        )
