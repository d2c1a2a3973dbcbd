from __future__ import annotations

import math

import pytest

from transient_nb.training.hparams import HParams


def test_paper_schedule_shape():
    hp = HParams()  # the paper's: 64K steps, x0.1 at 32K, x0.01 at 48K, 100-step warm-up
    assert hp.lr_at(0, 1) == pytest.approx(0.1 / 100)
    assert hp.lr_at(99, 1) == pytest.approx(0.1)
    assert hp.lr_at(31_999, 1) == pytest.approx(0.1)
    assert hp.lr_at(32_000, 1) == pytest.approx(0.01)
    assert hp.lr_at(48_000, 1) == pytest.approx(0.001)


def test_lr_follows_active_workers():
    hp = HParams(steps=1000, warmup_steps=0)
    assert hp.lr_at(10, 4) == pytest.approx(0.1 / 2)
    assert hp.lr_at(10, 9) == pytest.approx(0.1 / 3)
    assert HParams(scale_lr_by_active_workers=False, warmup_steps=0).lr_at(10, 4) == pytest.approx(
        0.1
    )
    # Decay points scale with the run's length.
    assert hp.lr_at(500, 1) == pytest.approx(0.01)
    assert hp.lr_at(750, 4) == pytest.approx(0.001 / math.sqrt(4))


@pytest.mark.parametrize(
    "changes, word",
    [
        ({"steps": 0}, "steps=0"),
        ({"steps": -5}, "steps=-5"),
        ({"batch_size": 0}, "batch_size"),
        ({"momentum": 1.0}, "momentum"),
        ({"wire_dtype": "int8"}, "int8"),
    ],
)
def test_bad_values_are_named(changes, word):
    with pytest.raises(ValueError, match=word):
        HParams(**changes).validate()
