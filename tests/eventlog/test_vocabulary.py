"""Tests for transient_nb.eventlog.vocabulary: the event vocabulary, frames, run records, VM states."""

from __future__ import annotations

import time
from pathlib import Path

import msgpack
import pytest

from transient_nb.eventlog.vocabulary import (
    BILLING_ENDS,
    CLUSTER_EVENTS,
    EVENTS,
    LIFECYCLE,
    TRAINING_EVENTS,
    UndeclaredEvent,
    make_event,
    strict,
)


def test_make_event() -> None:
    t0 = time.time()
    e = make_event("notice", worker="w-1", deadline=5.0)
    assert e["kind"] == "notice" and e["worker"] == "w-1" and e["deadline"] == 5.0
    assert t0 <= e["time"] <= time.time()
    # Events travel over the scheduler's comms: they must survive msgpack.
    assert msgpack.unpackb(msgpack.packb(e)) == e


def test_vocabulary() -> None:
    assert LIFECYCLE.index("running") < LIFECYCLE.index("preempted")
    assert set(BILLING_ENDS) <= set(LIFECYCLE)


def _posted_kinds() -> dict[str, str]:
    """Every event kind the package's source posts, with where: calls to the posting helpers
    (``make_event``, a ``_post``/``post`` method) whose first argument is a literal."""
    import ast

    import transient_nb

    helpers = {"make_event", "_post", "_post_safely", "post", "_post_event"}
    found: dict[str, str] = {}
    root = Path(transient_nb.__file__).parent
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and node.args):
                continue
            fn = node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", None)
            first = node.args[0]
            if name in helpers and isinstance(first, ast.Constant) and isinstance(first.value, str):
                found.setdefault(first.value, f"{path.relative_to(root)}:{node.lineno}")
    return found


def test_every_posted_kind_is_declared() -> None:
    posted = _posted_kinds()
    # The reader found the posting sites (a broken reader would pass vacuously).
    assert {"started", "notice", "metrics", "drained", "control", "limit-reached"} <= set(posted)
    undeclared = {k: where for k, where in posted.items() if k not in EVENTS}
    assert not undeclared, f"posted but not declared in events.EVENTS: {undeclared}"


def test_vocabulary_declares_fields_and_groups() -> None:
    assert set(LIFECYCLE) <= set(EVENTS)
    assert set(CLUSTER_EVENTS) <= set(EVENTS) and set(TRAINING_EVENTS) <= set(EVENTS)
    assert set(LIFECYCLE) | set(CLUSTER_EVENTS) | set(TRAINING_EVENTS) | {"drained"} == set(EVENTS)
    for kind in ("trainer-failed", "trainer-restarted", "ps-rejoined", "trainer-ps-lost"):
        assert kind in TRAINING_EVENTS
    assert {"worker", "error", "attempt"} <= set(EVENTS["trainer-failed"])
    assert {"worker", "attempt", "delay_s"} <= set(EVENTS["trainer-restarted"])
    assert {"reason", "error", "checkpoint_step"} <= set(EVENTS["train-finished"])
    assert {"worker", "generation"} <= set(EVENTS["ps-rejoined"])
    assert {"step", "path"} <= set(EVENTS["checkpoint"])
    assert {"source", "steps_lost"} <= set(EVENTS["ps-recovered"])
    assert all(isinstance(f, tuple) and all(isinstance(x, str) for x in f) for f in EVENTS.values())


def test_strict_mode_refuses_undeclared_kinds(monkeypatch: pytest.MonkeyPatch) -> None:
    # The suite runs strict (conftest), so that a cluster posting an undeclared kind fails a test.
    assert strict()
    with pytest.raises(UndeclaredEvent, match="'preemptd' is not declared"):
        make_event("preemptd", worker="w-1")
    monkeypatch.setenv("TRANSIENT_NB_STRICT_EVENTS", "0")
    assert make_event("preemptd")["kind"] == "preemptd"  # users' runs never crash on it
