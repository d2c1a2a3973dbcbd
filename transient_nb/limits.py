"""Limits of a cluster's spend and size, checked in one place for every backend and every client.

A limit is refused up front: :meth:`Limits.check_workers` runs in ``TransientCluster.__init__``
and in ``scale()`` (which the magic, the JupyterLab panel's control requests and the CLI all go
through), so that a typo such as ``scale 1000`` costs nothing. The budget and the deadline stop a
running cluster; the join deadline deletes a VM that runs but whose worker never joins.

Every value comes from ``transient.limits`` in the Dask config unless given explicitly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dask.utils import parse_timedelta

from transient_nb import config


def duration(value: Any, what: str, example: str = "3h") -> float | None:
    """``value`` as positive seconds (None stays None); a ``ValueError`` naming ``what``."""
    if value is None:
        return None
    try:
        seconds = parse_timedelta(value, default="seconds")
    except (ValueError, TypeError, KeyError):
        seconds = None
    if seconds is None or not seconds > 0:
        raise ValueError(f"{what}={value!r} must be a positive duration such as {example!r}.")
    return float(seconds)


def dollars(value: Any, what: str) -> float | None:
    """``value`` as positive dollars (None stays None); a ``ValueError`` naming ``what``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{what}={value!r} must be a positive number of dollars, e.g. 5.0.")
    return float(value)


@dataclass(frozen=True)
class Limits:
    """How big and how expensive a cluster may get, and how long it may wait.

    Parameters
    ----------
    max_workers
        Most preemptible GPU workers the cluster may keep (``transient.limits.max-workers``, 64).
    max_hourly_cost
        Most dollars per hour the PS host plus ``max(workers)`` workers may cost, priced at the
        dearest placement the replacement policy may pick (None: no limit).
    budget
        Stop the cluster once it has spent this many dollars (None: no budget).
    deadline_s
        Stop the cluster after this many wall-clock seconds (None: no deadline).
    join_timeout_s
        A VM that runs but whose worker has not joined after this many seconds is deleted and
        replaced (a broken image, a firewall that keeps it out).

    Examples
    --------
    >>> limits = Limits.from_config(max_workers=8)
    >>> limits.check_workers(8)
    >>> limits.check_workers(9)
    Traceback (most recent call last):
    ...
    ValueError: 9 workers is above max_workers=8 ...
    """

    max_workers: int = 64
    max_hourly_cost: float | None = None
    budget: float | None = None
    deadline_s: float | None = None
    join_timeout_s: float = 600.0

    @classmethod
    def from_config(
        cls,
        *,
        max_workers: int | None = None,
        max_hourly_cost: float | None = None,
        budget: float | None = None,
        deadline: str | float | None = None,
        join_timeout: str | float | None = None,
    ) -> Limits:
        """Limits from explicit values, else ``transient.limits``; bad values raise ``ValueError``."""
        mw = config.get("limits.max-workers", override_with=max_workers)
        if isinstance(mw, bool) or not isinstance(mw, int) or mw < 1:
            raise ValueError(f"max_workers={mw!r} must be a whole number of at least 1.")
        join = duration(
            config.get("limits.join-timeout", override_with=join_timeout),
            "join_timeout",
            "10 minutes",
        )
        return cls(
            max_workers=mw,
            max_hourly_cost=dollars(
                config.get("limits.max-hourly-cost", override_with=max_hourly_cost),
                "max_hourly_cost",
            ),
            budget=dollars(config.get("limits.budget", override_with=budget), "budget"),
            deadline_s=duration(
                config.get("limits.deadline", override_with=deadline), "deadline", "3h"
            ),
            join_timeout_s=join if join is not None else 600.0,
        )

    def reached(self, spent: float, elapsed_s: float) -> str | None:
        """What stops a cluster or a run now: ``"budget"`` once ``spent`` dollars reach the
        budget, ``"deadline"`` once ``elapsed_s`` seconds reach the deadline, else None.

        The one rule for the cluster's limits and a training run's own (``train(budget=,
        deadline=)``), which hold a :class:`Limits` of their own.

        Examples
        --------
        >>> Limits(budget=5.0, deadline_s=60).reached(spent=4.0, elapsed_s=59)
        >>> Limits(budget=5.0, deadline_s=60).reached(spent=5.0, elapsed_s=0)
        'budget'
        >>> Limits(deadline_s=60).reached(spent=99.0, elapsed_s=60)
        'deadline'
        """
        if self.budget is not None and spent >= self.budget:
            return "budget"
        if self.deadline_s is not None and elapsed_s >= self.deadline_s:
            return "deadline"
        return None

    def check_workers(self, n: int) -> None:
        """Refuse ``n`` workers above ``max_workers``, saying how to allow more."""
        if n > self.max_workers:
            raise ValueError(
                f"{n} workers is above max_workers={self.max_workers} (transient.limits."
                "max-workers): ask for fewer, or raise the limit, e.g. "
                f"TransientCluster(..., max_workers={n}) or dask.config.set("
                f"{{'transient.limits.max-workers': {n}}})."
            )

    def check_hourly_cost(self, n: int, worker_hourly: float, ps_hourly: float) -> None:
        """Refuse ``n`` workers whose hourly cost (with the PS hosts) is above ``max_hourly_cost``.

        ``worker_hourly`` is the dearest hourly price a worker may be placed at.
        """
        if self.max_hourly_cost is None:
            return
        hourly = n * worker_hourly + ps_hourly
        if hourly > self.max_hourly_cost:
            most = max(0, int((self.max_hourly_cost - ps_hourly) // worker_hourly))
            raise ValueError(
                f"{n} workers could cost ${hourly:.2f}/h (${worker_hourly:.3f}/h each at the "
                f"dearest allowed placement, plus ${ps_hourly:.3f}/h for the PS hosts), above "
                f"max_hourly_cost=${self.max_hourly_cost:.2f}/h: ask for at most {most} "
                "workers, or raise max_hourly_cost (transient.limits.max-hourly-cost)."
            )
