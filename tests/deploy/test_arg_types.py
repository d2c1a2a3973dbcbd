"""Tests for transient_nb.deploy.arg_types: the option table's types, each error saying what to
type (tests/deploy/test_options.py checks that both surfaces use the same ones)."""

from __future__ import annotations

import argparse
import re

import pytest

from transient_nb.deploy import arg_types


def test_names_are_split_on_commas_and_trimmed() -> None:
    assert arg_types.names(" t4, v100 ,") == ["t4", "v100"]


def test_workers_take_a_count_or_a_mix_and_a_mix_of_zeros_on_demand_is_none() -> None:
    assert arg_types.workers(1)("3") == 3
    assert arg_types.workers(1)("k80=2,v100=1") == {"k80": 2, "v100": 1}
    assert arg_types.on_demand("v100=0") == {}
    assert arg_types.on_demand("2") == 2
    with pytest.raises(argparse.ArgumentTypeError, match=re.escape("at least 1; type e.g. 4")):
        arg_types.workers(1)("0")


def test_a_renamed_flag_stores_under_the_new_name_and_warns_with_it() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--memory")
    parser.add_argument("--history", dest="memory", action=arg_types.Renamed)
    with pytest.warns(DeprecationWarning, match="--history is now --memory"):
        ns = parser.parse_args(["--history", "/tmp/m"])
    assert ns.memory == "/tmp/m"
