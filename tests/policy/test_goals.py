"""Tests for transient_nb.policy.goals: a goal as every surface writes it, checked once."""

from __future__ import annotations

import re
from typing import Any

import pytest

from transient_nb.policy.goals import check_goal, parse_goal


def test_goal_limits_are_accepted_down_to_the_smallest_positive_value():
    """A deadline of one second and a budget of a dollar or less are goals, a budget of $0 is
    not; and a goal gives only its own limit back."""
    assert check_goal("deadline", deadline=1) == (1, None)
    assert check_goal("budget", budget=1) == (None, 1.0)
    assert check_goal("budget", budget=0.5) == (None, 0.5)
    assert check_goal("cost-per-step") == (None, None)
    with pytest.raises(ValueError, match="needs budget= a positive number of dollars, not 0"):
        check_goal("budget", budget=0)


@pytest.mark.parametrize(
    "text, goal",
    [
        ("deadline:2h", ("deadline", {"deadline": "2h"})),
        (" Budget: 20 ", ("budget", {"budget": 20.0})),
        ("cost-per-step", ("cost-per-step", {})),
        ("OFF", (None, {})),
        ("none", (None, {})),
        ("stop", (None, {})),
    ],
)
def test_a_goal_is_read_as_typed(text: str, goal: tuple[str | None, dict[str, Any]]):
    """``GOAL[:VALUE]`` as the magic and the CLI take it, any case, spaces around."""
    assert parse_goal(text) == goal


@pytest.mark.parametrize("text", ["deadline", "budget:lots", "budget", "cost-per-step:1", "fast"])
def test_a_goal_typed_wrong_is_refused_with_how_to_write_one(text: str):
    """A goal without its value, with a bad one, or unknown: the user is told what to write."""
    advice = (
        f"goal {text!r}: write deadline:DURATION (e.g. deadline:2h), budget:DOLLARS (e.g. "
        "budget:20), cost-per-step, or off."
    )
    with pytest.raises(ValueError, match=re.escape(advice)):
        parse_goal(text)
