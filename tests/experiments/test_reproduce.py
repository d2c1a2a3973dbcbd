"""Tests for transient_nb.experiments.reproduce: the tables' own arithmetic. The tables' runs are
exercised by tests/test_paper_benchmarks.py (paper_emulation --tiny) and
tests/test_reproduce_notebook.py."""

from __future__ import annotations

from transient_nb.experiments import reproduce
from transient_nb.experiments.setups import MIXED_SETUPS, TODAY_SETUPS


def test_every_setup_asks_this_host_for_a_k80s_wall_rate_at_most() -> None:
    # The mix's fastest type (a V100) gets the pace at which it steps as fast as a K80 would.
    mix = MIXED_SETUPS[1]
    assert reproduce._pace(mix, 1.2) == 1.2 * 4.56 / 15.6
    assert reproduce._pace(MIXED_SETUPS[0], 1.2) == 1.2  # 4 K80: the pace itself
    assert all(reproduce._pace(s, 1.0) <= 1.0 for s in TODAY_SETUPS)


def test_each_types_share_of_the_steps() -> None:
    by_gpu = {"k80": {"steps": 30}, "v100": {"steps": 70}}
    assert reproduce._steps_share(by_gpu) == "k80 30%, v100 70%"
    assert reproduce._steps_share({}) == ""
