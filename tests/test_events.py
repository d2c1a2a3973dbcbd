"""Tests for transient_nb.events: the event vocabulary, frames, run records, VM states."""

from __future__ import annotations

import json
import time
from pathlib import Path

import msgpack
import pandas as pd
import pytest

from transient_nb.events import (
    BILLING_ENDS,
    CLUSTER_EVENTS,
    EVENTS,
    LIFECYCLE,
    TRAINING_EVENTS,
    UndeclaredEvent,
    events_frame,
    make_event,
    read_run_record,
    strict,
    vm_states,
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


def test_events_frame_orders_columns_and_keeps_order() -> None:
    events = [
        {"kind": "started", "time": 10.0, "cluster": "c"},
        {"kind": "requested", "time": 11.0, "worker": "w-0", "gpu": "t4"},
        {"kind": "running", "time": 12.0, "worker": "w-0"},
    ]
    df = events_frame(events)
    assert list(df.columns[:4]) == ["time", "timestamp", "kind", "worker"]
    assert list(df["kind"]) == ["started", "requested", "running"]
    assert df["timestamp"].iloc[1] == pd.Timestamp(11.0, unit="s", tz="UTC")
    assert pd.isna(df["worker"].iloc[0]) and df["gpu"].iloc[1] == "t4"
    # No worker column at all (only cluster events) still gives one.
    assert "worker" in events_frame([{"kind": "started", "time": 1.0}])
    assert list(events_frame([]).columns) == ["time", "timestamp", "kind", "worker"]


def test_read_run_record_skips_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    events = [make_event("started"), make_event("requested", worker="w-0")]
    text = "".join(json.dumps(e) + "\n" for e in events)
    path.write_text(text + "\n" + '{"kind": "runn')  # blank line, then a crash mid-write
    assert read_run_record(path) == events


def test_vm_states() -> None:
    events = [
        {"kind": "started", "time": 0.0},
        {"kind": "requested", "time": 1.0, "worker": "w-0", "role": "worker", "gpu": "t4",
         "zone": "z", "spot": True, "price": 0.2},
        {"kind": "running", "time": 2.0, "worker": "w-0"},
        {"kind": "joined", "time": 3.0, "worker": "w-0", "address": "tcp://a"},
        {"kind": "requested", "time": 1.0, "worker": "w-1", "role": "worker", "gpu": "t4"},
        {"kind": "running", "time": 2.0, "worker": "w-1"},
        {"kind": "preempted", "time": 5.0, "worker": "w-1"},
        {"kind": "left", "time": 6.0, "worker": "w-1"},  # late: does not revive it
        {"kind": "replacement-requested", "time": 6.0, "worker": "w-1"},  # not a lifecycle event
    ]  # fmt: skip
    df = vm_states(events, now=10.0)
    assert df.loc["w-0", "state"] == "joined"
    assert df.loc["w-0", "seconds_in_state"] == pytest.approx(7.0)
    assert df.loc["w-0", "address"] == "tcp://a" and df.loc["w-0", "gpu"] == "t4"
    assert df.loc["w-1", "state"] == "preempted"
    assert df.loc["w-1", "since"] == 5.0
    assert vm_states([]).empty


# -- the vocabulary ---------------------------------------------------------------------------------
def _posted_kinds() -> dict[str, str]:
    """Every event kind the package's source posts, with where: calls to the posting helpers
    (``make_event``, a ``_post``/``post`` method) whose first argument is a literal."""
    import ast
    from pathlib import Path

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
