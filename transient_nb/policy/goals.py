"""A transient-aware policy's goal: a deadline, a budget, or the cheapest steps, as every surface
writes it (``deadline:2h``, ``budget:20``, ``cost-per-step``, ``off``), checked in one place."""

from __future__ import annotations

from typing import Any

from transient_nb import limits
from transient_nb.policy.planner import GOALS


def parse_goal(text: str) -> tuple[str | None, dict[str, Any]]:
    """Read a goal as typed in the magic and the CLI: ``GOAL[:VALUE]``, or ``off``.

    Examples
    --------
    >>> parse_goal("deadline:2h")
    ('deadline', {'deadline': '2h'})
    >>> parse_goal("budget:20")
    ('budget', {'budget': 20.0})
    >>> parse_goal("cost-per-step"), parse_goal("off")
    (('cost-per-step', {}), (None, {}))
    """
    goal, _, value = str(text).strip().partition(":")
    goal = goal.strip().lower()
    if goal in ("off", "none", "stop"):
        return None, {}
    if goal == "deadline" and value:
        return goal, {"deadline": value.strip()}
    if goal == "budget" and value:
        try:
            return goal, {"budget": float(value)}
        except ValueError:
            pass
    if goal == "cost-per-step" and not value:
        return goal, {}
    raise ValueError(
        f"goal {text!r}: write deadline:DURATION (e.g. deadline:2h), budget:DOLLARS (e.g. "
        "budget:20), cost-per-step, or off."
    )


def check_goal(
    goal: Any, deadline: Any = None, budget: Any = None
) -> tuple[float | None, float | None]:
    """Check a goal and its limit; returns ``(deadline_s, budget)``, or a ``ValueError`` that
    names the bad value and says what to give."""
    if goal not in GOALS:
        raise ValueError(f"goal={goal!r}: use one of {', '.join(GOALS)}.")
    deadline_s: float | None = None
    if goal == "deadline":
        try:
            deadline_s = limits.duration(deadline, "deadline", "2h")
        except ValueError:
            deadline_s = None
        if deadline_s is None:
            raise ValueError(
                f"goal='deadline' needs deadline= a positive duration such as '2h', "
                f"not {deadline!r}."
            )
    if goal == "budget":
        try:
            dollars = limits.dollars(budget, "budget")
        except ValueError:
            dollars = None
        if dollars is None:
            raise ValueError(
                f"goal='budget' needs budget= a positive number of dollars, not {budget!r}."
            )
        return deadline_s, dollars
    return deadline_s, None
