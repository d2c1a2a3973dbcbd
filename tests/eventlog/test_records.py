"""Tests for transient_nb.eventlog.records: run records read back, and as a table."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from transient_nb.eventlog.records import events_frame, read_run_record
from transient_nb.eventlog.vocabulary import make_event


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
