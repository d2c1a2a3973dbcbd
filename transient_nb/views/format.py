"""How the views write money and durations (one place, so that every view writes them alike)."""

from __future__ import annotations

import math


def money(x: float | None, digits: int = 4) -> str:
    """Dollars with ``digits`` decimals; a dash when unknown.

    Examples
    --------
    >>> money(0.12345), money(None)
    ('$0.1235', '–')
    """
    return "–" if x is None or not math.isfinite(x) else f"${x:,.{digits}f}"


def duration(seconds: float | None) -> str:
    """A duration as people read it: ``42 s``, ``3 min 05 s``, ``2 h 07 min``.

    Examples
    --------
    >>> duration(42), duration(185), duration(7620)
    ('42 s', '3 min 05 s', '2 h 07 min')
    """
    if seconds is None or not math.isfinite(seconds):
        return "–"
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds // 60:.0f} min {seconds % 60:02.0f} s"
    return f"{seconds // 3600:.0f} h {seconds % 3600 // 60:02.0f} min"
