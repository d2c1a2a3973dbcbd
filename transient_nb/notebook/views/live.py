"""What every live notebook view shares: the cluster's event log, folded as it grows, and redraws.

A :class:`LiveState` feeds a :class:`~transient_nb.eventlog.folds.ClusterState` with the events a cluster's
log has gained, on the cluster's event loop (a :class:`~transient_nb.ticker.Ticker`: the thread
where the scheduler appends events, so it reads a list nobody else writes at the same time, and
which keeps going while a notebook cell blocks the kernel's own loop). It calls the view's
``draw`` on news, on demand, and at least once a second (money and times in state move between
events), and stops once the view says that nothing will change any more.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from transient_nb.eventlog.folds import ClusterState, event_log, is_closed
from transient_nb.ticker import Ticker

Event = Mapping[str, Any]
#: ``draw(new, now, closed)``: redraw after ``new`` events at wall time ``now``; returns whether
#: the view is done (nothing it shows will change any more).
Draw = Callable[[Sequence[Event], float, bool], bool]

#: Longest time between two redraws while the view is live (seconds).
REDRAW_S = 1.0


class LiveState:
    """Keeps ``state`` up to date with ``cluster``'s event log and calls ``draw``.

    Parameters
    ----------
    cluster
        A :class:`~transient_nb.TransientCluster` or a connected handle (anything
        :func:`~transient_nb.eventlog.folds.event_log` reads, with a ``loop``).
    state
        The fold the view shows.
    draw
        See :data:`Draw`.
    interval
        Seconds between two looks at the event log.
    """

    def __init__(self, cluster: Any, state: ClusterState, draw: Draw, interval: float = 0.25):
        self.cluster = cluster
        self.state = state
        self._draw = draw
        self._lock = threading.Lock()
        self._drawn_at = 0.0
        #: True once the view said that nothing will change any more.
        self.done = False
        self.ticker = Ticker(cluster.loop, self.update, interval)

    def start(self) -> LiveState:
        """Follow the log (unless the view is done already)."""
        if not self.done:
            self.ticker.start()
        return self

    def stop(self) -> None:
        """Stop following the log (the view keeps what it shows)."""
        self.ticker.stop()

    def update(self, force: bool = False, now: float | None = None) -> bool:
        """Read new events and redraw if needed; returns whether the view was redrawn.

        Safe to call from any thread; ``now`` pins the wall time shown (tests).
        """
        with self._lock:
            log = event_log(self.cluster)
            new = self.state.follow(log)
            closed = is_closed(self.cluster, log)
            now = time.time() if now is None else now
            if not (new or force or closed or now - self._drawn_at >= REDRAW_S):
                return False
            self.done = bool(self._draw(new, now, closed))
            self._drawn_at = now
        if self.done:
            self.ticker.stop()  # nothing will change any more
        return True


class LiveView:
    """The live part of a view widget: :meth:`update` and :meth:`stop`, driven by a
    :class:`LiveState` over the view's ``state``; the view draws in ``_draw`` (see :data:`Draw`)."""

    state: ClusterState
    _live: LiveState

    def _follow(self, cluster: Any, interval: float, start: bool) -> None:
        """Draw what the log holds now, then (``start``) follow it on ``cluster``'s loop."""
        self._live = LiveState(cluster, self.state, self._draw, interval)
        self.update(force=True)
        if start:
            self._live.start()

    def _draw(self, new: Sequence[Event], now: float, closed: bool) -> bool:
        raise NotImplementedError

    @property
    def _ticker(self) -> Ticker:
        return self._live.ticker

    def update(self, force: bool = False, now: float | None = None) -> bool:
        """Read new events and redraw what changed; returns whether anything was redrawn.

        Called by the periodic callback; safe to call from any thread. ``now`` is the wall time
        to show (tests pin it).
        """
        return self._live.update(force, now)

    def stop(self) -> None:
        """Stop following the event log (the view keeps what it shows)."""
        self._live.stop()
