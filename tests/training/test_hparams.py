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


# -- what the mutation run (issue 17) showed unchecked ----------------------------------------------


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"steps": 0}, "steps=0 must be a whole number of at least 1."),
        ({"steps": 2.0}, "steps=2.0 must be a whole number of at least 1."),
        ({"warmup_steps": True}, "warmup_steps=True must be a whole number of at least 0."),
        ({"lr": 0}, "lr=0 must be a finite number above 0."),
        ({"lr": float("inf")}, "lr=inf must be a finite number above 0."),
        ({"lr": "0.1"}, "lr='0.1' must be a finite number above 0."),
        ({"lr": True}, "lr=True must be a finite number above 0."),
        ({"weight_decay": -1.0}, "weight_decay=-1.0 must be a finite number 0 or more."),
        ({"momentum": -0.1}, "momentum=-0.1 must be in [0, 1), e.g. 0.9."),
        ({"momentum": "0.9"}, "momentum='0.9' must be in [0, 1), e.g. 0.9."),
        (
            {"decay_at": (0.0, 0.5)},
            "decay_at=(0.0, 0.5): each point is a fraction of the run in (0, 1].",
        ),
        ({"decay_at": ("a", 0.5)}, "decay_at=('a', 0.5): each point is a fraction"),
        ({"decay_at": (0.5, 0.25)}, "decay_at=(0.5, 0.25) must be in increasing order."),
        (
            {"decay_at": (0.5,)},
            "decay_at=(0.5,) and decay_factors=(0.1, 0.01) must have the same length.",
        ),
        (
            {"decay_factors": (0.1, float("nan"))},
            "decay_factors=nan must be a finite number above 0.",
        ),
        ({"eval_images": -3}, "eval_images=-3 must be a whole number of at least 1."),
        ({"ps_lost_after_s": -1.0}, "ps_lost_after_s=-1.0 must be a finite number above 0."),
        (
            {"call_timeout_s": 10.0, "ps_lost_after_s": 9.5},
            "ps_lost_after_s=9.5 must be at least call_timeout_s=10.0: a slow call is not a lost PS.",
        ),
        ({"pipeline": 1}, "pipeline=1 must be True or False."),
        ({"metrics_interval_s": 0}, "metrics_interval_s=0 must be a finite number above 0."),
        ({"scale_lr_by_active_workers": 1}, "scale_lr_by_active_workers=1 must be True or False."),
        (
            {"wire_dtype": "bf16"},
            "wire_dtype='bf16': use one of 'float32', 'float16', 'bfloat16'.",
        ),
        (
            {"data_plane": "tcp"},
            "data_plane='tcp': use one of 'auto', 'unix', 'tls', 'dask'.",
        ),
        ({"trainer_restarts": 1.5}, "trainer_restarts=1.5 must be a whole number of at least 0."),
    ],
)
def test_messages_name_the_bad_value_and_what_would_do(changes, message):
    with pytest.raises(ValueError) as info:
        HParams(**changes).validate()
    assert str(info.value).startswith(message), str(info.value)


def test_the_edges_of_every_range_are_valid():
    edge = HParams(
        steps=1,
        batch_size=1,
        momentum=0.0,
        weight_decay=0.0,
        warmup_steps=0,
        decay_at=(0.5, 1.0),
        checkpoint_every=0,
        eval_every=0,
        eval_images=1,
        call_timeout_s=5.0,
        ps_lost_after_s=5.0,
        trainer_restarts=0,
        pipeline=True,
        wire_dtype="float16",
        scale_lr_by_active_workers=False,
    )
    assert edge.validate() is edge
    assert HParams(momentum=0.99, decay_at=(), decay_factors=()).validate().lr_at(10**6, 1) == 0.1
    assert HParams(eval_images=None).validate().eval_images is None


def test_short_runs_still_checkpoint_and_evaluate_every_step():
    hp = HParams(steps=10)
    assert hp.checkpoint_interval == 1 and hp.eval_interval == 1
    assert HParams(steps=32).checkpoint_interval == 2 and HParams(steps=40).eval_interval == 2
    assert HParams(steps=100, eval_every=3).eval_interval == 3


def test_lr_edges_of_warmup_decay_and_scaling():
    hp = HParams(steps=100, warmup_steps=4, decay_at=(0.5,), decay_factors=(0.1,))
    assert [hp.lr_at(s, 1) for s in range(5)] == pytest.approx([0.025, 0.05, 0.075, 0.1, 0.1])
    assert hp.lr_at(49, 1) == pytest.approx(0.1) and hp.lr_at(50, 1) == pytest.approx(0.01)
    # A decay point inside the warm-up wins over it; one active worker and none leave lr as is.
    assert HParams(steps=10, warmup_steps=8, decay_at=(0.2,), decay_factors=(0.5,)).lr_at(
        3, 1
    ) == pytest.approx(0.05)
    assert hp.lr_at(10, 0) == pytest.approx(0.1) and hp.lr_at(10, 2) == pytest.approx(
        0.1 / math.sqrt(2)
    )
    assert HParams(warmup_steps=0).lr_at(0, 1) == pytest.approx(0.1)


def test_from_dict_lists_the_known_names_and_converts_both_schedules():
    with pytest.raises(ValueError) as info:
        HParams.from_dict({"zeta": 1, "alpha": 2, "steps": 3})
    message = str(info.value)
    assert message.startswith("Unknown hyperparameter(s) 'alpha', 'zeta': use some of batch_size, ")
    assert message.endswith(", weight_decay, wire_dtype.")
    hp = HParams.from_dict({"decay_at": [0.2], "decay_factors": [0.3]})
    assert hp.decay_at == (0.2,) and hp.decay_factors == (0.3,)
    assert HParams.from_dict({}) == HParams()
    assert HParams(steps=5).with_(lr=0.2) == HParams(steps=5, lr=0.2)


def test_lr_at_refuses_a_schedule_of_unequal_lengths_instead_of_dropping_a_point():
    hp = HParams(steps=100, warmup_steps=0, decay_at=(0.5,), decay_factors=(0.1, 0.01))
    with pytest.raises(ValueError):
        hp.lr_at(80, 1)
