"""A periodic callback on a Tornado event loop that survives its own errors.

The live views (control panel, dashboard) and remote handles (which copy a cluster's event log
through its scheduler's RPC) refresh on a cluster's event loop with a :class:`Ticker`. It lives in
the core package, not in the views, so that the core (``connect``) does not depend on ipywidgets
or Bokeh.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)


class Ticker:
    """Calls ``fn()`` every ``interval_s`` seconds on ``loop`` (a Tornado IOLoop) until stopped.

    ``fn`` runs in the loop's thread; when it returns an awaitable, that is awaited before the
    next tick. An exception is logged, never raised into the loop; after
    ``max_errors`` in a row the ticker stops, so a broken view cannot flood the log.

    Examples
    --------
    >>> ticker = Ticker(cluster.loop, panel.update, 0.25).start()  # doctest: +SKIP
    >>> ticker.stop()  # doctest: +SKIP
    """

    def __init__(
        self, loop: Any, fn: Callable[[], Any], interval_s: float = 0.25, max_errors: int = 20
    ):
        self.loop = loop
        self.fn = fn
        self.interval_s = interval_s
        self.max_errors = max_errors
        self.errors = 0
        self._pc: Any = None
        self._stopped = False

    @property
    def running(self) -> bool:
        """True while the periodic callback is scheduled and not asked to stop."""
        return not self._stopped and self._pc is not None and self._pc.is_running()

    def start(self) -> Ticker:
        """Start ticking (safe from any thread)."""
        self._stopped = False
        self._call(self._start)
        return self

    def _call(self, fn: Callable[[], Any]) -> None:
        if self.loop is None:
            return
        try:
            self.loop.add_callback(fn)
        except RuntimeError:  # the loop is closed: its callbacks died with it
            self._pc = None

    def _start(self) -> None:
        from tornado.ioloop import PeriodicCallback

        if self._stopped or self.running:
            return
        self._pc = PeriodicCallback(self._tick, self.interval_s * 1000)
        self._pc.start()

    def _tick(self) -> Any:
        if self._stopped:  # a stop whose callback was lost (e.g. the loop was stopping)
            self._stop()
            return None
        try:
            result = self.fn()
        except Exception:
            self._failed()
            return None
        if inspect.isawaitable(result):
            # PeriodicCallback awaits what its callback returns, and skips ticks meanwhile.
            return self._await(result)
        self.errors = 0
        return None

    async def _await(self, result: Any) -> None:
        try:
            await result
            self.errors = 0
        except Exception:
            self._failed()

    def _failed(self) -> None:
        self.errors += 1
        logger.exception("Live view update failed (%d in a row)", self.errors)
        if self.errors >= self.max_errors:
            self._stop()

    def _stop(self) -> None:
        if self._pc is not None:
            self._pc.stop()
            self._pc = None

    def stop(self) -> None:
        """Stop ticking (safe from any thread, also after the loop closed)."""
        self._stopped = True
        self._call(self._stop)
