"""Tests for transient_nb.backends.gce.preload: the metadata watcher inside the VM."""

from __future__ import annotations

import asyncio

import pytest

from tests.backends.gce.fake_gce import FakeMetadata
from tests.backends.gce.gce_helpers import PROJECT
from tests.conftest import wait_for
from transient_nb.backends.gce.preload import wait_for_preemption


def test_metadata_watcher_sees_notices_given_at_any_time(monkeypatch: pytest.MonkeyPatch) -> None:
    md = FakeMetadata({"name": "vm", "metadata": {"items": []}, "_zone": "z"}, PROJECT)
    monkeypatch.setenv("GCE_METADATA_HOST", md.host)

    async def notice_while_hanging() -> None:
        task = asyncio.ensure_future(wait_for_preemption())
        await wait_for(lambda: any("wait_for_change=true" in r for r in md.requests), 10)
        assert not task.done()
        md.preempt()
        await asyncio.wait_for(task, 10)

    async def notice_already_given() -> None:
        await asyncio.wait_for(wait_for_preemption(), 10)

    try:
        asyncio.run(notice_while_hanging())
        n = len(md.requests)
        asyncio.run(notice_already_given())
        assert len(md.requests) == n + 1  # one plain GET, no hanging one
    finally:
        md.close()
