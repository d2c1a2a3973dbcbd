"""Tests for transient_nb.worker.identity: the one reader of ``TRANSIENT_NB_VM``."""

from __future__ import annotations

import json

import pytest

from transient_nb.worker import identity


def test_vm_name_prefers_the_backend_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    class FakeWorker:
        name = "dask-name"

    monkeypatch.delenv("TRANSIENT_NB_VM", raising=False)
    assert identity.vm_name(FakeWorker()) == "dask-name"
    monkeypatch.setenv("TRANSIENT_NB_VM", json.dumps({"name": "w-7"}))
    assert identity.vm_name(FakeWorker()) == "w-7"
    monkeypatch.setenv("TRANSIENT_NB_VM", "garbage")
    assert identity.vm_name(FakeWorker()) == "dask-name"


def test_vm_gpu_and_zone_come_from_the_vm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRANSIENT_NB_VM", json.dumps({"gpu": "V100", "zone": "us-east1-c"}))
    assert identity.vm_gpu() == "v100" and identity.vm_zone() == "us-east1-c"
    monkeypatch.setenv("TRANSIENT_NB_VM", json.dumps({"gpu": None}))
    assert identity.vm_gpu() is None and identity.vm_zone() is None
    monkeypatch.setenv("TRANSIENT_NB_VM", "[1, 2]")
    assert identity.vm_field("name") is None
