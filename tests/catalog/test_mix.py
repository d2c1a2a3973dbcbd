"""Tests for transient_nb.catalog.mix: one parser for every surface's spelling of a worker mix."""

from __future__ import annotations

from typing import Any

import pytest

from transient_nb.catalog.mix import format_mix, parse_mix, zero_mix


@pytest.mark.parametrize(
    "workers, expected",
    [
        (3, {"t4": 3}),
        ("3", {"t4": 3}),
        ({"k80": 2, "p100": 1, "v100": 1}, {"k80": 2, "p100": 1, "v100": 1}),
        ("k80=2,p100=1,v100=1", {"k80": 2, "p100": 1, "v100": 1}),
        (" K80 = 2 , v100=1, ", {"k80": 2, "v100": 1}),
        ({"k80": 2, "p100": 0}, {"k80": 2}),
        ({"k80": "2"}, {"k80": 2}),
    ],
)
def test_parse_mix(workers: Any, expected: dict[str, int]) -> None:
    assert parse_mix(workers, "t4") == expected
    assert list(parse_mix(workers, "t4")) == list(expected)  # the user's order is kept


@pytest.mark.parametrize(
    "workers, match",
    [
        ({}, r"workers=\{\} asks for no workers"),
        ("", r"workers='' asks for no workers"),
        ({"k80": 0}, r"asks for no workers"),
        ({"k80": -1}, r"k80=-1 is not a number of workers"),
        ("k80=two", r"k80='two' is not a number of workers"),
        ({"k80": 1.5}, r"k80=1.5 is not a number of workers"),
        ("k80", r"'k80' is not TYPE=COUNT"),
        ("k80=1,K80=2", r"GPU type 'k80' is given twice"),
        (0, r"workers=0 must be a whole number of at least 1"),
        (-2, r"workers=-2 must be"),
        (True, r"workers=True"),
        (2.5, r"workers=2.5"),
        ({"": 1}, r"'' is not a GPU type"),
    ],
)
def test_bad_mixes_name_the_value(workers: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_mix(workers, "t4")


def test_format_mix_round_trips() -> None:
    mix = {"k80": 2, "p100": 1, "v100": 1}
    assert format_mix(mix) == "k80=2,p100=1,v100=1"
    assert parse_mix(format_mix(mix), "t4") == mix


def test_zero_mix_is_pairs_that_all_count_nothing():
    assert zero_mix("v100=0") and zero_mix("k80=0,v100=0")
    assert not zero_mix("v100=1") and not zero_mix("k80=0,v100=1")
    assert not zero_mix("0") and not zero_mix("2") and not zero_mix("v100=x")
