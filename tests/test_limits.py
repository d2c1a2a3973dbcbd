"""Limits: what a cluster may cost and hold, checked before anything is spent, and the one rule
that stops a cluster or a run on its budget or deadline."""

from __future__ import annotations

import dask.config
import pytest

from transient_nb.limits import Limits, dollars, duration


def test_defaults_come_from_the_config_and_arguments_win():
    limits = Limits.from_config()
    assert (limits.max_workers, limits.max_hourly_cost, limits.budget) == (64, None, None)
    assert limits.deadline_s is None and limits.join_timeout_s == 600.0
    with dask.config.set({"transient.limits.max-workers": 3, "transient.limits.budget": 2.5}):
        from_config = Limits.from_config()
        assert (from_config.max_workers, from_config.budget) == (3, 2.5)
        assert Limits.from_config(max_workers=5).max_workers == 5
    assert Limits.from_config(deadline="90s", join_timeout="2 minutes").deadline_s == 90
    assert Limits.from_config(join_timeout="2 minutes").join_timeout_s == 120


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"max_workers": 0}, r"max_workers=0 must be a whole number of at least 1"),
        ({"max_workers": True}, r"max_workers=True"),
        ({"max_workers": 2.5}, r"max_workers=2.5"),
        ({"budget": -1}, r"budget"),
        ({"deadline": "soon"}, r"deadline='soon'"),
        ({"max_hourly_cost": "lots"}, r"max_hourly_cost"),
    ],
)
def test_bad_limits_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Limits.from_config(**kwargs)


def test_too_many_workers_is_refused_with_how_to_allow_them():
    limits = Limits(max_workers=8)
    limits.check_workers(8)
    with pytest.raises(ValueError, match=r"9 workers is above max_workers=8") as info:
        limits.check_workers(9)
    assert "max_workers=9" in str(info.value) and "transient.limits.max-workers" in str(info.value)


def test_an_hourly_cost_above_the_limit_says_how_many_workers_fit():
    limits = Limits(max_hourly_cost=1.0)
    limits.check_hourly_cost(3, worker_hourly=0.25, ps_hourly=0.25)  # exactly $1.00/h: allowed
    with pytest.raises(ValueError, match=r"\$1\.25/h .* ask for at most 3 workers"):
        limits.check_hourly_cost(4, worker_hourly=0.25, ps_hourly=0.25)
    Limits().check_hourly_cost(1000, worker_hourly=9.0, ps_hourly=1.0)  # no limit, no refusal


def test_the_budget_and_the_deadline_are_reached_at_their_values_not_before():
    limits = Limits(budget=5.0, deadline_s=60.0)
    assert limits.reached(spent=4.99, elapsed_s=59.9) is None
    assert limits.reached(spent=5.0, elapsed_s=0) == "budget"
    assert limits.reached(spent=0, elapsed_s=60.0) == "deadline"
    assert limits.reached(spent=6.0, elapsed_s=61.0) == "budget"  # money first
    assert Limits().reached(spent=1e9, elapsed_s=1e9) is None


def test_the_parsers_name_what_they_read():
    assert dollars(None, "budget") is None and dollars(3, "budget") == 3.0
    assert duration(None, "deadline") is None and duration("1h", "deadline") == 3600
    with pytest.raises(ValueError, match="budget"):
        dollars(0, "budget")
    with pytest.raises(ValueError, match="deadline"):
        duration(-5, "deadline")
