"""Limits of a cluster's spend and size, checked in one place for every backend and every client.

A limit is refused up front: :meth:`Limits.check_workers` runs in ``TransientCluster.__init__``
and in ``scale()`` (which the magic, the JupyterLab panel's control requests and the CLI all go
through), so that a typo such as ``scale 1000`` costs nothing. Every VM a cluster creates
(workers, replacements, spares, PS hosts, a PS move's new hosts, what the policy asks for) goes
through :meth:`Limits.check_fleet` too, priced at its own placement beside every VM the cluster
runs or asks for. The budget and the deadline stop a running cluster; the join deadline deletes
a VM that runs but whose worker never joins.

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


class LimitError(ValueError):
    """A VM (or a change asked for) that the cluster's limits do not allow.

    ``limit`` names the one it would break: ``"max_workers"`` or ``"max_hourly_cost"``.
    """

    def __init__(self, message: str, limit: str):
        super().__init__(message)
        self.limit = limit


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
    transient_nb.limits.LimitError: 9 workers is above max_workers=8 ...
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
            raise LimitError(
                f"{n} workers is above max_workers={self.max_workers} (transient.limits."
                "max-workers): ask for fewer, or raise the limit, e.g. "
                f"TransientCluster(..., max_workers={n}) or dask.config.set("
                f"{{'transient.limits.max-workers': {n}}}).",
                "max_workers",
            )

    def check_hourly_cost(
        self, n: int, worker_hourly: float, ps_hourly: float, hosts: str = "the PS hosts"
    ) -> None:
        """Refuse ``n`` workers whose hourly cost (with the PS hosts) is above ``max_hourly_cost``.

        ``worker_hourly`` is the dearest hourly price a worker may be placed at; ``ps_hourly``
        what ``hosts`` (the PS hosts, and a head VM) cost per hour.
        """
        if self.max_hourly_cost is None:
            return
        hourly = n * worker_hourly + ps_hourly
        if hourly > self.max_hourly_cost:
            if not worker_hourly:
                raise LimitError(
                    f"{hosts} could cost ${ps_hourly:.2f}/h, above max_hourly_cost="
                    f"${self.max_hourly_cost:.2f}/h: raise max_hourly_cost "
                    "(transient.limits.max-hourly-cost).",
                    "max_hourly_cost",
                )
            most = max(0, int((self.max_hourly_cost - ps_hourly) // worker_hourly))
            raise LimitError(
                f"{n} workers could cost ${hourly:.2f}/h (${worker_hourly:.3f}/h each at the "
                f"dearest allowed placement, plus ${ps_hourly:.3f}/h for {hosts}), above "
                f"max_hourly_cost=${self.max_hourly_cost:.2f}/h: ask for at most {most} "
                "workers, or raise max_hourly_cost (transient.limits.max-hourly-cost).",
                "max_hourly_cost",
            )

    def check_fleet(self, workers: int, hourly: float, what: str) -> None:
        """Refuse ``what`` (a new VM) if the cluster would then hold more than ``max_workers`` GPU
        workers, or cost more than ``max_hourly_cost`` per hour.

        ``workers`` and ``hourly`` count every VM the cluster runs or is asking for (GPU workers,
        PS hosts, a head VM), at each one's own price, ``what`` included; VMs on their way out
        (at their notice) are not counted. The one check every VM a cluster creates goes
        through, whatever asked for it.

        Examples
        --------
        >>> Limits(max_workers=2, max_hourly_cost=1.0).check_fleet(2, 1.0, "VM w-1")
        >>> Limits(max_workers=2).check_fleet(3, 0.5, "a spare w-2")
        Traceback (most recent call last):
        ...
        transient_nb.limits.LimitError: a spare w-2 would make 3 GPU workers, above max_workers=2 ...
        """
        if workers > self.max_workers:
            raise LimitError(
                f"{what} would make {workers} GPU workers, above max_workers={self.max_workers} "
                "(transient.limits.max-workers): the cluster goes on without it. Raise the limit "
                f"to allow it, e.g. TransientCluster(..., max_workers={workers}).",
                "max_workers",
            )
        if self.max_hourly_cost is not None and hourly > self.max_hourly_cost + 1e-9:
            raise LimitError(
                f"{what} would bring the cluster to ${hourly:.2f}/h, above max_hourly_cost="
                f"${self.max_hourly_cost:.2f}/h (transient.limits.max-hourly-cost): the cluster "
                "goes on without it. Raise the limit to allow it.",
                "max_hourly_cost",
            )
