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
        ({"warmup_steps": -1}, "warmup_steps=-1"),
        ({"eval_images": 0}, "eval_images=0"),
        ({"call_timeout_s": 0}, "call_timeout_s=0"),
        ({"call_timeout_s": float("nan")}, "call_timeout_s=nan"),
        ({"ps_lost_after_s": 1.0}, "ps_lost_after_s=1.0"),
        ({"lr": -0.1}, "lr=-0.1"),
        ({"weight_decay": -1e-4}, "weight_decay"),
        ({"decay_at": (0.75, 0.5)}, "increasing"),
        ({"decay_at": (0.5, 1.5)}, "fraction"),
        ({"decay_at": (0.5,)}, "same length"),
        ({"decay_factors": (0.1, 0.0)}, "decay_factors"),
        ({"checkpoint_every": -1}, "checkpoint_every=-1"),
        ({"eval_every": 2.5}, "eval_every=2.5"),
        ({"metrics_interval_s": 0}, "metrics_interval_s"),
        ({"trainer_restarts": -1}, "trainer_restarts"),
        ({"batch_size": True}, "batch_size=True"),
        ({"scale_lr_by_active_workers": "yes"}, "scale_lr_by_active_workers"),
    ],
)
def test_bad_values_are_named(changes, word):
    with pytest.raises(ValueError, match=word):
        HParams(**changes).validate()


def test_defaults_are_valid_and_intervals_follow_the_run_length():
    hp = HParams().validate()
    assert hp.checkpoint_interval == 4000 and hp.eval_interval == 3200
    assert HParams(steps=100, checkpoint_every=7).checkpoint_interval == 7


def test_from_dict_round_trips_and_names_unknown_keys():
    hp = HParams(steps=10, decay_at=(0.3, 0.6))
    assert HParams.from_dict(hp.to_dict()) == hp
    assert HParams.from_dict({**hp.to_dict(), "decay_at": [0.3, 0.6]}) == hp  # JSON lists
    with pytest.raises(ValueError, match="'batchsize'"):
        HParams.from_dict({"batchsize": 3})
