"""Tests for transient_nb.worker.drain: drain hooks, run concurrently and cut at the deadline."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
from distributed.utils_test import gen_test

from tests.conftest import wait_for
from transient_nb.worker import drain


@pytest.fixture(autouse=True)
def _no_leftover_hooks() -> Iterator[None]:
    yield
    drain._hooks.clear()


@gen_test()
async def test_drain_hooks_run_concurrently_and_errors_are_collected() -> None:
    seen: list[tuple[str, float]] = []

    def sync_hook(deadline: float) -> None:
        seen.append(("sync", deadline))

    async def async_hook(deadline: float) -> None:
        await asyncio.sleep(0.1)
        seen.append(("async", deadline))

    def failing_hook(deadline: float) -> None:
        raise RuntimeError("disk full")

    for hook in (sync_hook, async_hook, failing_hook):
        drain.register_drain_hook(hook)
    deadline = time.time() + 10
    errors = await drain.run_drain_hooks(deadline)
    assert sorted(seen) == [("async", deadline), ("sync", deadline)]
    assert len(errors) == 1 and "failing_hook" in errors[0] and "disk full" in errors[0]

    drain.unregister_drain_hook(failing_hook)
    drain.unregister_drain_hook(failing_hook)  # twice is harmless
    seen.clear()
    assert await drain.run_drain_hooks(time.time() + 10) == []
    assert len(seen) == 2


@gen_test()
async def test_slow_hook_is_cut_at_the_deadline() -> None:
    cancelled = asyncio.Event()

    async def slow(deadline: float) -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    drain.register_drain_hook(slow)
    t0 = time.monotonic()
    # The hooks get the time up to the deadline minus the margin the worker needs to close.
    errors = await drain.run_drain_hooks(time.time() + drain.CLOSE_MARGIN_S + 0.3)
    assert time.monotonic() - t0 < 5
    assert errors == ["drain hook did not finish before the deadline"]
    await wait_for(cancelled.is_set, timeout=5)
    # No time left at all: the hooks are not waited for.
    assert await drain.run_drain_hooks(time.time() - 1) == [
        "drain hook did not finish before the deadline"
    ]
