"""A trainer's link to the PS: the run's Variable, one call to every shard, and rejoining a PS
that is slow, fails or was replaced (the loop around them: test_trainer.py)."""

from __future__ import annotations

import concurrent.futures
import threading
import time

import numpy as np
import pytest
import torch

from transient_nb.training.hparams import HParams
from transient_nb.training.models import build_model
from transient_nb.training.ps import ParameterServer
from transient_nb.training.ps_link import PSLost
from transient_nb.training.trainer import Trainer, flat_layout, get_flat

from .doubles import TRAINER_HP as HP
from .doubles import Published
from .doubles import gatherer as _gatherer
from .doubles import ps_double as _double
from .doubles import trainer_on as _trainer


def test_lookup_ps_and_current_generation_read_the_runs_variable():
    import json

    from distributed import Client, Variable

    from transient_nb.training.ps_link import current_generation, lookup_ps

    with Client(processes=False, n_workers=1, threads_per_worker=1, dashboard_address=None):
        Variable("ps-of-r").set(
            json.dumps(
                {
                    "generation": 3,
                    "shards": [["tcp://a:1", "ps-0"], ["tcp://b:2", "ps-1"]],
                    "ps_zone": "us-east1-c",
                }
            )
        )
        generation, actors, ps_zone = lookup_ps("ps-of-r", timeout=5)
        assert generation == 3 and ps_zone == "us-east1-c"
        assert [(a._address, a.key, a._cls) for a in actors] == [
            ("tcp://a:1", "ps-0", ParameterServer),
            ("tcp://b:2", "ps-1", ParameterServer),
        ]
        assert current_generation("ps-of-r") == 3
        # Nothing published (yet), or not readable: -1, below every real generation.
        assert current_generation("no-such-variable", timeout=0.2) == -1
        Variable("garbled").set("not json")
        assert current_generation("garbled", timeout=1) == -1
        with pytest.raises(TimeoutError):
            lookup_ps("no-such-variable", timeout=0.2)


# -- one call to the shards, without a loop: _gather and _newer_generation ------------------------
class _Reply:
    """A call's future that answers ``value`` (or raises it) after ``after`` seconds, or never."""

    def __init__(self, value=None, after: float | None = 0.0):
        self.value, self.after, self.t0 = value, after, time.monotonic()
        self.waits: list[float] = []

    def result(self, timeout=None):
        self.waits.append(timeout)
        left = None if self.after is None else self.after - (time.monotonic() - self.t0)
        if left is None or left > timeout:
            time.sleep(timeout)
            raise concurrent.futures.TimeoutError()
        time.sleep(max(0.0, left))
        if isinstance(self.value, BaseException):
            raise self.value
        return self.value


def test_gather_returns_every_shards_reply_in_order():
    from transient_nb.training.ps_link import WAIT_SLICE_S

    trainer, _ = _gatherer()
    slow = _Reply("b", after=0.7)  # more than one wait slice: it is waited for again
    assert trainer._gather([_Reply("a"), slow, _Reply("c")]) == ["a", "b", "c"]
    assert len(slow.waits) == 2 and all(w == WAIT_SLICE_S for w in slow.waits)


def test_gather_gives_up_at_the_call_timeout_not_before():
    from transient_nb.training.ps_link import PSUnavailable

    trainer, _ = _gatherer(hp=HParams(steps=10, call_timeout_s=1.2))
    t0 = time.monotonic()
    with pytest.raises(PSUnavailable, match=r"no reply within 1\.[2-9] s"):
        trainer._gather([_Reply(after=None)])
    assert 1.2 <= time.monotonic() - t0 < 3.0
    # A reply that comes just within the bound is taken.
    trainer, _ = _gatherer(hp=HParams(steps=10, call_timeout_s=1.2))
    assert trainer._gather([_Reply("late", after=0.9)]) == ["late"]


def test_gather_follows_a_newer_generation_and_a_stop_but_not_a_drain():
    from transient_nb.training.ps_link import PSUnavailable, _Stopped

    trainer, published = _gatherer(generation=3, published=3)
    published["g"] = 4
    with pytest.raises(PSUnavailable) as info:
        trainer._gather([_Reply(after=None)])
    assert str(info.value) == "a new parameter server was published"  # the trainer's log says
    trainer, _ = _gatherer(generation=3, published=3)
    trainer._stop.set()
    with pytest.raises(_Stopped):
        trainer._gather([_Reply(after=None)])
    # Draining: the last push is worth waiting for, up to the bound.
    trainer, _ = _gatherer(generation=3, published=3)
    trainer._stop.set()
    trainer._draining.set()
    with pytest.raises(PSUnavailable, match="no reply within"):
        trainer._gather([_Reply(after=None)])


def test_gather_turns_any_call_error_into_ps_unavailable_with_its_cause():
    from transient_nb.training.ps_link import PSUnavailable

    trainer, _ = _gatherer()
    error = OSError("comm closed")
    with pytest.raises(PSUnavailable, match="comm closed") as info:
        trainer._gather([_Reply("a"), _Reply(error)])
    assert info.value.__cause__ is error
    # An error's text is cut to 300 characters: it goes into events and the panel.
    with pytest.raises(PSUnavailable) as info:
        trainer._gather([_Reply(OSError("x" * 1000))])
    assert len(str(info.value)) == 300 and str(info.value).startswith("OSError('xxx")


def test_merge_takes_every_piece_and_shard_0s_statistics_and_version():
    from transient_nb.training.ps_link import _merge

    bn = np.ones(2, np.float32)
    pieces, stats, version = _merge([(np.zeros(3), bn, 7.0), (np.ones(2), None, 8)])
    assert [p.tolist() for p in pieces] == [[0.0, 0.0, 0.0], [1.0, 1.0]]
    assert stats is bn and version == 7 and isinstance(version, int)


def test_newer_generation_reads_the_runs_variable_without_a_custom_locate():
    import json

    from distributed import Client, Variable

    hp = HParams(steps=10)
    with Client(processes=False, n_workers=1, threads_per_worker=1, dashboard_address=None):
        Variable("ps-of-g").set(json.dumps({"generation": 2, "shards": []}))
        n = len(get_flat(flat_layout(build_model("resnet8", num_classes=10))[0]))
        trainer = Trainer("r", "resnet8", "digits", hp.to_dict(), "ps-of-g", [(0, n)], name="w-0")
        for generation, newer in [(1, True), (2, False), (3, False)]:
            trainer.generation = generation
            assert trainer._newer_generation() is newer, generation


def test_newer_generation_is_only_a_strictly_newer_one_and_a_failed_look_is_none():
    trainer, published = _gatherer(generation=5, published=5)
    assert trainer._newer_generation() is False
    published["g"] = 4
    assert trainer._newer_generation() is False
    published["g"] = 6
    assert trainer._newer_generation() is True
    asked = []

    def broken(timeout):
        asked.append(timeout)
        raise TimeoutError("variable not there")

    trainer, _ = _gatherer(generation=5, locate=broken)
    assert trainer._newer_generation() is False
    assert asked == [1.0]  # a short look: it runs inside a wait slice


def test_accept_takes_the_weights_and_the_statistics_that_came_back():
    from transient_nb.training.flat import FlatModel

    net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
    flat = FlatModel(net)
    n, nb = len(flat.w), len(flat.b)
    trainer = Trainer("r", "resnet8", "digits", HP.to_dict(), "v", [(0, 4), (4, n)], name="w-0")
    pieces = [np.full(4, 1.0, np.float32), np.full(n - 4, 2.0, np.float32)]
    bn = np.arange(nb, dtype=np.float32)
    trainer._accept(flat, pieces, bn)
    assert trainer.accepted == 1
    assert flat.weights().tolist() == [1.0] * 4 + [2.0] * (n - 4)
    assert flat.b.tolist() == bn.tolist()  # the PS's statistics, not the trainer's own


def test_send_gives_each_shard_its_slice_the_loss_and_the_images():
    class Shard:
        def __init__(self):
            self.calls = []

        def push_pull(self, **kwargs):
            self.calls.append(kwargs)
            return kwargs

    trainer = Trainer("r", "resnet8", "digits", HP.to_dict(), "v", [(0, 2), (2, 5)], name="w-0")
    trainer.local_step = 9
    shards = [Shard(), Shard()]
    grad, bn = np.arange(5, dtype=np.float32), np.ones(3, np.float32)
    trainer._send(shards, grad, 4, 0.75, 16, bn, final=True)
    (first,), (second,) = shards[0].calls, shards[1].calls
    assert first["grad"].tolist() == [0.0, 1.0] and second["grad"].tolist() == [2.0, 3.0, 4.0]
    assert first["bn_delta"] is bn and second["bn_delta"] is None
    for call in (first, second):  # every shard's metrics see the step's loss and images
        assert (call["trainer"], call["base_version"], call["local_step"]) == ("w-0", 4, 9)
        assert (call["loss"], call["images"], call["final"]) == (0.75, 16, True)
    # A reply from a PS with another number of shards than the bounds is an error, not a
    # silently dropped slice.
    with pytest.raises(ValueError):
        trainer._send(shards[:1], grad, 4, 0.75, 16, bn, final=False)


def test_rejoin_with_nothing_published_gives_up_after_ps_lost_after_s_and_says_why():
    from transient_nb.training.flat import FlatModel

    hp = HParams(steps=10, call_timeout_s=0.2, ps_lost_after_s=0.6)
    looked: list[float] = []

    def nothing(timeout):
        looked.append(timeout)
        return 0, []

    trainer = _trainer(nothing, hp=hp)
    t0 = time.monotonic()
    with pytest.raises(PSLost) as info:
        trainer._rejoin(FlatModel(build_model("resnet8", num_classes=10)))
    assert 0.6 <= time.monotonic() - t0 < 5
    assert str(info.value).endswith("(last: PSUnavailable('no parameter server published yet'))")
    # It looked again with backoff (not once, not in a busy loop), each look bounded by the call
    # timeout.
    assert 2 <= len(looked) <= 10 and set(looked) == {0.2}


def test_rejoin_backs_off_with_jitter_and_never_past_ps_lost_after_s():
    """Pauses between looks: 0.2 s, doubling, each times a jitter in [0.5, 1] (many trainers
    must not stampede a PS coming back), and the last one cut to what is left of the bound."""
    from transient_nb.training.flat import FlatModel

    class Stop(threading.Event):
        pauses: list[float] = []

        def wait(self, timeout=None):
            self.pauses.append(timeout)
            return super().wait(timeout)

    hp = HParams(steps=10, call_timeout_s=30, ps_lost_after_s=3.0)
    looked: list[float] = []
    trainer = _trainer(lambda timeout: (looked.append(timeout), (0, []))[1], hp=hp)
    trainer._stop = Stop()
    t0 = time.monotonic()
    with pytest.raises(PSLost):
        trainer._rejoin(FlatModel(build_model("resnet8", num_classes=10)))
    elapsed = time.monotonic() - t0
    assert 3.0 <= elapsed < 3.6
    p = trainer._stop.pauses
    assert 0.1 <= p[0] <= 0.2 and 0.2 <= p[1] <= 0.4 and 0.4 <= p[2] <= 0.8, p
    assert set(looked) == {5.0}  # each look at most 5 s, even with a 30 s call timeout


def test_rejoin_takes_the_weights_and_statistics_and_registers_as_computing(loop, tmp_path):
    from transient_nb.training.flat import FlatModel

    double = _double(loop, tmp_path)
    trainer = _trainer(Published(double), name="w-3")
    model = build_model("resnet8", num_classes=10)
    flat = FlatModel(model)
    flat.w.zero_()
    flat.b.zero_()
    shards, version = trainer._rejoin(flat)
    assert shards == [double] and version == double.ps.version == 0
    assert (flat.weights() == double.ps.w).all()
    assert flat.b.tolist() == double.ps.bn.tolist()  # the statistics came too
    assert double.ps.computing.get("w-3") is True  # its pull said who it is
