"""How every view writes money, durations and the policy's line."""

from __future__ import annotations

import math

from transient_nb.eventlog.format import (
    cost_text,
    duration,
    money,
    percent,
    policy_text,
    rate,
    training_text,
)


def test_money_and_its_unknowns():
    assert money(0.12345) == "$0.1235" and money(1234.5, 2) == "$1,234.50"
    assert money(None) == money(math.nan) == money(math.inf) == "–"


def test_durations_at_their_boundaries():
    assert [duration(s) for s in (0, 59.4, 60, 3599, 3600, 7620)] == [
        "0 s",
        "59 s",
        "1 min 00 s",
        "59 min 59 s",
        "1 h 00 min",
        "2 h 07 min",
    ]
    assert duration(-3) == "0 s" and duration(None) == duration(math.inf) == "–"


def test_the_policy_line_for_each_goal_and_its_odds():
    assert policy_text(None) == policy_text({}) == ""
    waiting = {"goal": "cost-per-step", "deadline_s": None, "budget": None, "decision": None}
    assert policy_text(waiting) == "Policy: cost-per-step (waiting for a training run to plan for)"
    decision = {"reason": "8 k80 in us-central1-a, 1 PS shard: ETA 0.49 h", "p_lose_1h": [0.5]}
    deadline = {"goal": "deadline", "deadline_s": 5400, "decision": decision}
    assert policy_text(deadline) == (
        "Policy: deadline in 1 h 30 min · 8 k80 in us-central1-a, 1 PS shard: ETA 0.49 h"
        " · P(losing ≥1 workers within 1 h): 50%"
    )
    no_odds = {"goal": "budget", "budget": 7.5, "decision": {"reason": "r", "p_lose_1h": []}}
    assert policy_text(no_odds) == "Policy: budget $7.50 · r"


def test_rates_shares_and_a_bills_figures():
    assert rate(0.1234) == "$0.123/h" and rate(None) == "–"
    assert percent(0.4213) == "42%" and percent(0.4213, 1) == "42.1%" and percent(math.nan) == "–"
    bill = {"cost": 1.5, "saved": 0.5, "saved_fraction": 0.25, "rate_per_hour": 2.0, "x": None}
    assert cost_text(bill) == {
        "cost": "$1.5000",
        "saved": "$0.5000",
        "saved_fraction": "25%",
        "rate_per_hour": "$2.000/h",
        "x": "–",
    }


def test_the_training_line():
    assert training_text(None) == ""
    running = {"model": "Net", "parameters": 385, "step": 50, "steps": 100, "eta_s": 42,
               "metrics": {"mae": 0.3}, "accuracy": None, "finished": False}  # fmt: skip
    assert training_text(running) == (
        "Training: Net (385 parameters) · step 50/100 · mae 0.3 · ETA 42 s"
    )
    finished = {**running, "model": None, "metrics": {}, "accuracy": 0.9, "finished": True}
    assert training_text(finished) == "Training: step 50/100 · accuracy 90.0% · finished (done)"
