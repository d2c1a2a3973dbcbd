"""Tests for transient_nb.experiments.setups: the paper's setups, figures and speed model."""

from __future__ import annotations

import pytest

from transient_nb.experiments.setups import (
    PAPER_TABLE,
    paper_speed,
    revoked_by,
)


def test_revoked_by_follows_the_papers_k80_curve():
    assert revoked_by("k80", 0) == 0
    assert revoked_by("k80", 1) == pytest.approx(0.078)
    assert revoked_by("k80", 2) == pytest.approx(0.141)
    assert revoked_by("k80", 1.5) == pytest.approx((0.078 + 0.141) / 2)
    assert revoked_by("k80", 30) == 1.0


def test_paper_speed_is_linear_then_the_ps_plateau():
    assert paper_speed("k80", 8, 1) == pytest.approx(8 * 4.56)  # under 45: linear
    assert paper_speed("v100", 8, 1) == 45.0
    assert paper_speed("v100", 8, 2) == pytest.approx(45 * 1.75)
    assert PAPER_TABLE["4 transient K80"]["hours"] == 1.05


def test_setups_of_the_mixed_and_growing_experiments():
    from transient_nb.experiments.reproduce import (
        DYNAMIC_SETUPS,
        MIXED_SETUPS,
        Setup,
        grow_marks,
        model_speed,
    )

    slow, mix, dear = MIXED_SETUPS
    assert mix.types == {"k80": 2, "p100": 1, "v100": 1} and mix.workers == 4
    assert slow.types == {"k80": 4} and dear.types == {"v100": 4}
    # The paper's model: the mix asks for 36.9 global steps/s, under one PS's 45; 4 V100 hit it.
    assert model_speed(mix) == pytest.approx(2 * 4.56 + 12.2 + 15.6)
    assert model_speed(dear) == 45.0 and model_speed(slow) == pytest.approx(4 * 4.56)
    static, growing, big = DYNAMIC_SETUPS
    assert static.bill_ps is True and static.most_workers == 1
    assert growing.most_workers == 4 and big.most_workers == 4
    # One worker more at each quarter, as the paper's one more every 16K of 64K steps.
    assert grow_marks(growing, 64000) == [16000, 32000, 48000]
    assert grow_marks(growing, 640) == [160, 320, 480]
    assert grow_marks(static, 640) == [] and grow_marks(
        Setup("2->3", "t4", 2, True, grow_to=3), 90
    ) == [45]


def test_a_growing_cluster_bills_its_ps_from_the_start():
    from transient_nb.experiments.reproduce import DYNAMIC_SETUPS, TABLE_SETUPS

    static, growing, big = DYNAMIC_SETUPS
    assert static.bills_ps and growing.bills_ps and big.bills_ps
    assert not TABLE_SETUPS[0].bills_ps  # the paper's one-GPU baseline had no PS
