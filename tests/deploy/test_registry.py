"""Tests for transient_nb.deploy.registry: entries on disk, stale detection, lookups."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import dask.config
import pytest

from transient_nb.deploy import registry


def test_register_lookup_unregister(tmp_path: Path) -> None:
    folder = tmp_path / "clusters"
    assert dask.config.get("transient.registry-dir") == str(folder)  # the conftest isolation
    assert registry.entries() == []
    path = registry.register("demo-1", {"scheduler_address": "tcp://127.0.0.1:1"})
    assert path == str(folder / "demo-1.json")
    assert not [p for p in os.listdir(folder) if p.startswith(".tmp-")]  # written atomically
    entry = registry.lookup("demo-1")
    assert entry["pid"] == os.getpid()
    assert entry["scheduler_address"] == "tcp://127.0.0.1:1"
    assert entry["stale"] is False
    registry.unregister("demo-1")
    registry.unregister("demo-1")  # twice is fine
    assert registry.entries() == []


def test_explicit_folder(tmp_path: Path) -> None:
    other = tmp_path / "elsewhere"
    registry.register("x", {}, path=str(other))
    assert [e["name"] for e in registry.entries(str(other))] == ["x"]
    assert registry.entries() == []


def test_lookup_lists_known_names() -> None:
    registry.register("alpha", {})
    registry.register("beta", {})
    with pytest.raises(KeyError, match=r"'gamma'.*known: alpha, beta"):
        registry.lookup("gamma")


def test_entry_of_a_dead_process_is_stale(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], check=True,
                          capture_output=True, text=True)  # fmt: skip
    dead_pid = int(proc.stdout)
    path = Path(registry.register("crashed", {}))
    entry = json.loads(path.read_text())
    entry["pid"] = dead_pid
    path.write_text(json.dumps(entry))
    assert registry.lookup("crashed")["stale"] is True


def test_unreadable_entries_are_skipped(tmp_path: Path) -> None:
    folder = Path(registry.registry_dir())
    (folder / "torn.json").write_text('{"name": "to')
    (folder / "notes.txt").write_text("not an entry")
    registry.register("ok", {})
    assert [e["name"] for e in registry.entries()] == ["ok"]
