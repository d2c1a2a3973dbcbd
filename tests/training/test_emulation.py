"""Paced emulation: the tables, the PS capacity model, and the pacers' outcomes in time."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from transient_nb.training import emulation
from transient_nb.training.emulation import (
    PAPER_PS_STEPS_PER_S,
    PAPER_STEPS_PER_S,
    ServicePacer,
    StepPacer,
    cluster_time_scale,
    parse_emulation,
)
from transient_nb.training.hparams import HParams


def test_paper_table_and_estimates_and_overrides():
    emu = parse_emulation("paper")
    assert emu is not None
    assert emu.steps_per_s["k80"] == 4.56 and emu.steps_per_s["v100"] == 15.6
    assert set(emu.steps_per_s) >= {"k80", "p100", "v100", "t4", "l4", "a100"}
    assert emu.ps_steps_per_s == PAPER_PS_STEPS_PER_S
    own = parse_emulation("paper,t4=7.9,ps=none")
    assert own is not None and own.steps_per_s["t4"] == 7.9 and own.ps_steps_per_s is None
    only = parse_emulation({"k80": 5})
    assert only is not None and dict(only.steps_per_s) == {"k80": 5.0}
    assert only.ps_steps_per_s is None and only.step_s("v100") is None  # not in the table
    assert parse_emulation(None) is None and parse_emulation("none") is None


@pytest.mark.parametrize("bad", ["papr", "k80=0", "k80=-1", "ps=fast", "k80=nan", 3])
def test_bad_settings_say_what_to_type(bad):
    with pytest.raises(ValueError, match="emulate"):
        parse_emulation(bad)
    with pytest.raises(ValueError, match="emulate"):
        HParams(emulate=bad).validate()  # type: ignore[arg-type]


def test_hparams_keep_a_table_as_canonical_text_that_round_trips():
    hp = HParams(emulate={"k80": 4.56, "ps": 45}).validate()  # type: ignore[arg-type]
    assert hp.emulate == "k80=4.56,ps=45"
    assert HParams.from_dict(hp.to_dict()) == hp and hash(hp)
    with pytest.raises(ValueError, match="emulate_step_scale"):
        HParams(emulate_step_scale=0).validate()


def test_step_time_divides_by_time_scale_and_multiplies_by_step_scale():
    emu = parse_emulation("paper")
    assert emu is not None
    assert emu.step_s("k80") == pytest.approx(1 / 4.56)
    assert emu.step_s("K80", time_scale=120, step_scale=100) == pytest.approx(100 / (4.56 * 120))


def test_ps_model_fits_the_paper_one_and_two_shard_points():
    emu = parse_emulation("paper")
    assert emu is not None
    assert 1 / emu.ps_service_s(1) == pytest.approx(45.0)
    assert 1 / emu.ps_service_s(2) == pytest.approx(45.0 * 1.75)
    # More shards help less and less (the fixed cost per push stays).
    assert 2 * 45 < 1 / emu.ps_service_s(4) < 4 * 45
    assert emu.ps_service_s(1, time_scale=10, step_scale=2) == pytest.approx(2 / 450)


#: A stop event already set: a pacer's pause returns at once (these tests use a fake clock).
NO_PAUSE = threading.Event()
NO_PAUSE.set()


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_step_pacer_flags_a_host_slower_than_the_pace_and_only_then():
    clock = Clock()
    fast, slow = StepPacer(0.1, clock=clock), StepPacer(0.1, clock=clock)
    for _ in range(30):
        for pacer, work in ((fast, 0.05), (slow, 0.15)):
            pacer.begin()
            clock.t += work
            pacer.computed()
        fast.wait(NO_PAUSE), slow.wait(NO_PAUSE)
        clock.t += 0.1
    assert fast.behind() is None
    behind = slow.behind()
    assert behind is not None
    assert behind["target_steps_per_s"] == pytest.approx(10)
    assert behind["achieved_steps_per_s"] == pytest.approx(1 / 0.15)


def test_step_pacer_holds_the_paced_rate_in_real_time():
    pacer = StepPacer(0.02)
    t0 = time.monotonic()
    for _ in range(25):
        pacer.begin()
        time.sleep(0.005)  # the real work, faster than the pace
        pacer.computed()
        pacer.wait()
    rate = 25 / (time.monotonic() - t0)
    assert 50 * 0.85 <= rate <= 50 * 1.02


def test_service_pacer_caps_the_rate_of_concurrent_pushers():
    pacer = ServicePacer(0.01)  # at most 100 pushes a second

    async def pusher(n):
        for _ in range(n):
            await pacer.serve()
            pacer.worked(0.0001)

    async def main():
        t0 = time.monotonic()
        await asyncio.gather(*(pusher(15) for _ in range(4)))
        return time.monotonic() - t0

    elapsed = asyncio.run(main())
    assert 60 / elapsed <= 100 * 1.02  # the cap holds with four eager pushers
    assert 60 / elapsed >= 100 * 0.8  # and is reached (the pushers ask faster than it)


def test_service_pacer_flags_a_host_slower_than_the_capacity():
    clock = Clock()
    pacer = ServicePacer(0.001, clock=clock)
    for _ in range(10):
        pacer.worked(0.002)
    clock.t = 3.0
    behind = pacer.behind()
    assert behind is not None and behind["achieved_steps_per_s"] == pytest.approx(500)


def test_time_scale_without_a_worker_or_from_the_environment(monkeypatch):
    assert cluster_time_scale(None) == 1.0
    monkeypatch.setenv("TRANSIENT_NB_TIME_SCALE", "120")
    assert cluster_time_scale(object()) == 120.0
    assert emulation._time_scale_of([{"kind": "requested"}, {"kind": "started", "time_scale": 8}])
    assert emulation._time_scale_of([]) == 1.0


def test_paper_rates_are_the_papers():
    assert PAPER_STEPS_PER_S == {"k80": 4.56, "p100": 12.2, "v100": 15.6}


def test_a_slow_reply_counts_as_the_hosts_work_only_when_the_ps_is_not_paced():
    clock = Clock()
    own, ours = StepPacer(0.1, clock=clock), StepPacer(0.1, clock=clock, count_reply=True)
    for _ in range(10):
        own.begin(), ours.begin()
        clock.t += 0.02  # the trainer's own work
        own.computed(), ours.computed()
        clock.t += 0.2  # the reply: a paced PS's queue, or this host's slowness
        own.wait(NO_PAUSE), ours.wait(NO_PAUSE)
    assert own.behind() is None  # the emulated PS's plateau, not the host's fault
    behind = ours.behind()
    assert behind is not None and behind["achieved_steps_per_s"] == pytest.approx(1 / 0.22)


def test_a_users_model_is_paced_only_at_a_rate_given_for_it_and_its_ps_by_its_size():
    from transient_nb.training.emulation import PAPER_MODEL_PARAMETERS, parse_emulation

    emu = parse_emulation("paper,t4=30,a100-40gb=50")
    assert emu is not None and emu.given == {"t4", "a100-40gb"}
    assert emu.rate_for("k80") == 4.56 and emu.rate_for("k80", reference_model=False) is None
    assert emu.rate_for("T4", reference_model=False) == 30.0
    one = emu.ps_service_s(1)
    assert emu.ps_service_s(1, parameters=PAPER_MODEL_PARAMETERS) == pytest.approx(one)
    assert emu.ps_service_s(1, parameters=2 * PAPER_MODEL_PARAMETERS) > 1.8 * one
