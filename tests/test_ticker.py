"""Tests for transient_nb.ticker: the periodic callback of live views and remote handles."""

from __future__ import annotations

import time

from tests.conftest import wait_for_sync
from transient_nb.ticker import Ticker


def test_ticker_calls_on_the_loop_and_gives_up_on_errors() -> None:
    from distributed.utils import LoopRunner

    runner = LoopRunner()
    runner.start()
    try:
        calls: list[float] = []
        ticker = Ticker(runner.loop, lambda: calls.append(time.time()), 0.02).start()
        wait_for_sync(lambda: len(calls) >= 3, timeout=10)
        ticker.stop()
        wait_for_sync(lambda: not ticker.running, timeout=10)

        def boom() -> None:
            raise RuntimeError("broken view")

        bad = Ticker(runner.loop, boom, 0.01, max_errors=3).start()
        wait_for_sync(lambda: bad.errors >= 3 and not bad.running, timeout=10)
    finally:
        runner.stop()
