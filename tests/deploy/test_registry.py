"""Tests for transient_nb.deploy.registry: entries on disk, stale detection, lookups."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import dask.config
import pytest

from transient_nb.deploy import registry

TLS = ("ca", "cert", "key")


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


# -- issue 30: the folder is this user's alone, and entries are checked -------------------------
def test_the_folder_is_made_private_and_an_older_open_one_is_closed(tmp_path: Path) -> None:
    folder = Path(registry.registry_dir())
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    folder.chmod(0o755)  # made by an older version: readable by others, writable by us only
    registry.register("ok", {})
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700


def test_a_folder_others_may_write_to_is_refused(tmp_path: Path) -> None:
    folder = Path(registry.registry_dir())
    folder.chmod(0o777)
    with pytest.raises(ValueError, match=rf"{folder} may be written by others.*chmod 700"):
        registry.entries()
    with pytest.raises(ValueError, match="may be written by others"):
        registry.register("demo", {})
    assert not (folder / "demo.json").exists()


def test_a_folder_of_another_user_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = registry.registry_dir()
    me = os.getuid()
    monkeypatch.setattr(registry.os, "getuid", lambda: me + 1)  # as that other user sees it
    with pytest.raises(ValueError, match=rf"{folder} belongs to user id {me}, not to you"):
        registry.entries()


def _plant(name: str, entry: dict[str, Any]) -> None:
    folder = Path(registry.registry_dir())
    (folder / f"{name}.json").write_text(json.dumps({"pid": None, **entry}))


def test_planted_entries_are_skipped_and_never_acted_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from transient_nb import connect

    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "thesis.tex").write_text("years of work")
    head = {"project": "p", "zone": "us-central1-a", "instance": "x-head"}
    planted = {
        # connect() would send this user's OAuth token to it (head_gone asks the API).
        "evil": {"name": "evil", "head_vm": {**head, "api_endpoint": "https://evil.example"}},
        # forget() would delete the folder of the "key".
        "wipe": {"name": "wipe", "tls": {k: str(precious / "thesis.tex") for k in TLS}},
        "dots": {"name": "dots", "tls": {k: f"{registry.registry_dir()}/tls/../../x" for k in TLS}},
        # The panel's connect("...") snippet would carry code into a notebook.
        "code": {"name": 'x"); import os; os.system("id"); ("'},
        "addr": {"name": "addr", "scheduler_address": "tls://h:1\nimport os"},
        "other": {"name": "someone-else"},
    }
    for fname, entry in planted.items():
        _plant(fname, entry)
    registry.register("fine", {"scheduler_address": "tcp://127.0.0.1:1"})
    assert [e["name"] for e in registry.entries()] == ["fine"]
    refused = [r.getMessage() for r in caplog.records if "Skipped the registry entry" in r.message]
    assert len(refused) == len(planted)
    assert any("'https://evil.example' is not the Compute API" in m for m in refused)
    assert any("is not under" in m for m in refused)
    with pytest.raises(ValueError, match="No transient cluster named 'evil'"):
        connect("evil")
    registry.forget(planted["wipe"])
    assert (precious / "thesis.tex").read_text() == "years of work"
    # What this user's own clusters write passes: a Compute API endpoint (the default, the
    # configured one, or a local fake that gets no credentials) and TLS files in the registry.
    paths = registry.write_client_files("mine", "KEY", "CERT", "CA")
    for endpoint in (None, "https://compute.googleapis.com", "http://127.0.0.1:8123"):
        registry.register("mine", {"head_vm": {**head, "api_endpoint": endpoint}, "tls": paths})
        assert registry.lookup("mine")["tls"] == paths
    with dask.config.set({"transient.gce.api-endpoint": "https://compute.example.corp"}):
        registry.register(
            "mine", {"head_vm": {**head, "api_endpoint": "https://compute.example.corp"}}
        )
    with pytest.raises(ValueError, match="not the Compute API"):
        registry.register(
            "mine", {"head_vm": {**head, "api_endpoint": "https://compute.example.corp"}}
        )
    registry.unregister("mine")
    assert not os.path.exists(os.path.dirname(paths["key"]))
