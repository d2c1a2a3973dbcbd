"""Tests for transient_nb.worker.preload: the notice handler inside a worker."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
from distributed import Worker
from distributed.core import Status, rpc
from distributed.utils_test import gen_cluster

from tests.conftest import wait_for
from transient_nb.eventlog.vocabulary import TOPIC
from transient_nb.worker import drain, preload


@pytest.fixture(autouse=True)
def _no_leftover_hooks() -> Iterator[None]:
    yield
    drain._hooks.clear()


@gen_cluster(client=True, nthreads=[])
async def test_notice_drains_posts_and_closes_the_worker(c: Any, s: Any) -> None:
    ran: list[float] = []

    async def hook(deadline: float) -> None:
        await asyncio.sleep(0.05)
        ran.append(deadline)

    drain.register_drain_hook(hook)
    async with Worker(s.address, name="w-3", nthreads=1) as w:
        preload.dask_setup(w)
        deadline = time.time() + 5
        async with rpc(w.address) as r:
            assert await r.transient_notice(deadline=deadline) == "draining"
            # A second notice does not drain twice.
            assert await r.transient_notice(deadline=deadline) == "draining"
        await wait_for(lambda: w.status in (Status.closing, Status.closed), timeout=30)
        await wait_for(lambda: w.status == Status.closed, timeout=30)
    assert ran == [deadline]
    drained = [m for _, m in s.get_events(TOPIC) if m.get("kind") == "drained"]
    assert len(drained) == 1
    assert drained[0]["hooks"] == 1 and list(drained[0]["errors"]) == []
    assert drained[0]["worker"] == w.address  # the scheduler stamps the sender's address
    assert 0 < drained[0]["seconds"] < 5
    await wait_for(lambda: not s.workers, timeout=30)


def test_every_worker_preload_imports() -> None:
    """The preloads named on worker command lines (strings) import, and are Dask preloads."""
    import importlib

    for name in (*preload.WORKER_PRELOADS, "transient_nb.backends.gce.preload"):
        assert callable(importlib.import_module(name).dask_setup), name
