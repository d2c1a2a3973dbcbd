"""Tests for transient_nb.deploy.messages: every control request built and checked in one place."""

from __future__ import annotations

import pytest

from transient_nb.deploy.messages import (
    ControlRefused,
    ControlRequest,
    adapt_message,
    move_ps_message,
    preempt_message,
    scale_message,
    scale_ps_message,
    stop_message,
)


def test_scale_takes_a_number_a_mix_a_type_and_an_on_demand_share() -> None:
    assert scale_message(0) == {"action": "scale", "workers": 0}
    assert scale_message("3")["workers"] == 3
    assert scale_message({"k80": 2})["workers"] == {"k80": 2}
    assert scale_message(2, gpu=" V100")["gpu"] == "v100"
    assert scale_message(2, on_demand="v100=1")["on_demand"] == {"v100": 1}


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"workers": -1}, "workers=-1: give a whole number of workers"),
        ({"workers": 1.5}, "workers=1.5: give a whole number"),
        ({"workers": True}, "workers=True: give a whole number"),
        ({"workers": "two"}, "workers='two': give a whole number"),
        ({"workers": "k80=-1"}, "k80=-1 is not a number of workers"),
        ({"workers": 2, "gpu": 7}, "gpu=7: give a GPU type"),
        ({"workers": 2, "gpu": " "}, "give a GPU type"),
        ({"workers": 2, "on_demand": -1}, "on_demand=-1): give a whole number"),
    ],
)
def test_a_bad_scale_is_named(kwargs: dict, words: str) -> None:
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        scale_message(**kwargs)


def test_ps_hosts_moves_preemptions_goals_and_stop() -> None:
    assert scale_ps_message(2) == {"action": "scale-ps", "hosts": 2}
    for bad in (0, True, "2", 1.0):
        with pytest.raises(ValueError, match="give a whole number of PS hosts"):
            scale_ps_message(bad)
    assert move_ps_message("us-east1-c") == {"action": "move-ps", "zone": "us-east1-c"}
    with pytest.raises(ValueError, match="reason=1\\): the reason is text"):
        move_ps_message("us-east1-c", 1)
    assert preempt_message(count=1)["count"] == 1
    with pytest.raises(ValueError, match="give the name of a worker"):
        preempt_message(worker=3)
    with pytest.raises(ValueError, match="the number of workers must be at least 1"):
        preempt_message(count=0)
    with pytest.raises(ValueError, match="must be true or false"):
        preempt_message(worker="w-0", notice="yes")
    with pytest.raises(ValueError, match="one of them"):
        preempt_message(worker="w-0", count=1)
    assert adapt_message(None) == {"action": "adapt", "goal": None, "args": {}}
    with pytest.raises(ValueError, match="goal='deadline' needs deadline="):
        adapt_message("deadline")
    assert stop_message() == {"action": "stop"}


def test_a_request_finds_only_its_own_answer_and_a_refusal_raises_the_owners_words() -> None:
    a, b = ControlRequest(stop_message()), ControlRequest(stop_message())
    assert a.id != b.id and a.msg["id"] == a.id and a.action == "stop"
    answers = [
        {"kind": "control", "request": b.id, "ok": True},
        {"kind": "scale", "request": a.id},  # not an answer
    ]
    assert a.answer_in(answers) is None
    assert b.answer_in(answers) == answers[0]
    with pytest.raises(ControlRefused, match="no such worker"):
        a.answer_in([{"kind": "control", "request": a.id, "ok": False, "error": "no such worker"}])
