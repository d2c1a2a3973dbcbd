"""Fixtures of the training unit tests."""

from __future__ import annotations

import asyncio
import threading

import pytest


async def _cancel_the_rest() -> None:
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


@pytest.fixture
def loop():
    """A private event loop in a thread: where the PS doubles' actors run.

    At the end, calls still in flight (a test may leave one on its way, as the driver does) are
    cancelled and awaited, so none is left a coroutine that was never awaited.
    """
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    asyncio.run_coroutine_threadsafe(_cancel_the_rest(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
