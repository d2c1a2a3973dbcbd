"""Run records: the event log as written to disk (JSON lines), and as a table.

The :class:`~transient_nb.deploy.monitor.TransientMonitor` writes every event of a run, one JSON
object a line, to its run record as it happens; these read it back.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd


def events_frame(events: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """Events as a DataFrame, one row each, in the order they were recorded.

    ``time`` stays UNIX seconds; ``timestamp`` is the same instant as a pandas Timestamp (UTC).
    """
    rows = list(events)
    df = pd.DataFrame(rows)
    if df.empty:
        return pd.DataFrame(columns=["time", "timestamp", "kind", "worker"])
    if "worker" not in df:
        df["worker"] = None
    df.insert(0, "timestamp", pd.to_datetime(df["time"], unit="s", utc=True))
    front = ["time", "timestamp", "kind", "worker"]
    return df[front + [c for c in df.columns if c not in front]]


def read_run_record(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read a run record (JSON lines) written by the monitor.

    A line cut short by a crash at the end of the file is skipped, since everything before it is
    intact.
    """
    out: list[dict[str, Any]] = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out
