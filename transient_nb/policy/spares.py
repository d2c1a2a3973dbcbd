"""Spares asked for ahead of predicted revocations (``replacement.at: ahead``).

A reactive cluster asks for a replacement when a worker is revoked, and trains with one worker
fewer until the replacement has booted and joined (the paper measured 81-98 s of start-up). When
the lifetime model predicts a revocation, the cluster can ask earlier: a *spare* requested when a
worker's odds of being revoked within the time a new worker takes to join reach ``AHEAD_ODDS``,
so that the spare has joined when the old worker goes, and the replacement that would follow is
not needed. The paper's curves make this sharp near GCE's 24 h limit on preemptible VMs, where
every survivor is revoked.

A spare costs a second VM while both run. It is asked for only where the hazard *rises* with age
(the odds at this age at least ``RISE`` times those of a new VM): under a memoryless model every
worker is as likely to go as its spare would be, and a spare buys nothing.
"""

from __future__ import annotations

from typing import Any

from transient_nb.catalog.lifetimes import revoked_within

#: Odds of a revocation within the lead time at which a spare is asked for.
AHEAD_ODDS = 0.5
#: How much likelier than a new VM's the old one's revocation must be: the hazard rises.
RISE = 2.0
#: Wall seconds a new worker takes to join once its VM runs (import torch, connect), before the
#: cluster has measured its own.
JOIN_S = 10.0


def due_for_spare(
    model: Any, gpu: str | None, age_s: float, lead_s: float, zone: str | None = None
) -> float | None:
    """The odds that a ``gpu`` VM in ``zone``, ``age_s`` old, is revoked within ``lead_s``
    (simulated seconds), when they call for a spare; else None.

    Examples
    --------
    >>> from transient_nb.catalog.lifetimes import Exponential, PaperLifetimesByGpu
    >>> paper = PaperLifetimesByGpu()
    >>> due_for_spare(paper, "k80", 3600, 600) is None  # young: no
    True
    >>> round(due_for_spare(paper, "k80", 24 * 3600 - 600, 600), 2)  # at GCE's 24 h limit
    1.0
    >>> due_for_spare(Exponential("exp", 600), "k80", 24 * 3600, 600) is None  # memoryless
    True
    """
    odds = revoked_within(model, gpu, age_s, lead_s, zone)
    if odds >= AHEAD_ODDS and odds >= RISE * revoked_within(model, gpu, 0.0, lead_s, zone):
        return odds
    return None
