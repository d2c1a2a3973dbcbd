"""The trainer: its loop against a PS double that is slow, fails or changes (the flat layout:
test_flat.py)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
import time

import numpy as np
import pytest
import torch

from transient_nb.training.models import build_model
from transient_nb.training.ps import ParameterServer, regroup, shard_bounds
from transient_nb.training.trainer import (
    PSLost,
    Trainer,
    decay_mask,
    flat_layout,
    get_flat,
)

from .doubles import TRAINER_HP as HP
from .doubles import PSDouble, Published
from .doubles import gatherer as _gatherer
from .doubles import ps_double as _double
from .doubles import trainer_on as _trainer

# -- the loop, against an in-process PS double that can be slow, fail or be replaced -------------


#: How long the loop tests wait, as a fraction of their bounds: 1 in CI; benchmarks/mutation.py
#: sets less (TRANSIENT_NB_TEST_PATIENCE), so that a mutant that breaks the loop fails in seconds
#: rather than waiting out a minute (the clean run must pass with it all the same).
PATIENCE = float(os.environ.get("TRANSIENT_NB_TEST_PATIENCE", "1"))


def _start(trainer):
    box = {}

    def target():
        try:
            box["result"] = trainer.train()
        except BaseException as e:
            box["error"] = e

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, box


def _started(loop, tmp_path, hp, **trainer_kwargs):
    """A PS double with ``hp``, and a trainer of it training in a thread: the double, the
    trainer, the thread and the box of :func:`_start`."""
    double = _double(loop, tmp_path, hp=hp)
    trainer = _trainer(Published(double), hp=hp, **trainer_kwargs)
    thread, box = _start(trainer)
    return double, trainer, thread, box


def _until(predicate, timeout=60.0):
    deadline = time.monotonic() + timeout * PATIENCE
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


@pytest.mark.parametrize("pipeline", [False, True])
def test_trains_until_the_run_has_its_steps(loop, tmp_path, pipeline):
    hp = HP.with_(pipeline=pipeline)
    double, trainer, thread, box = _started(loop, tmp_path, hp)
    thread.join(120 * PATIENCE)
    # Pipelined, the push in flight when the run got its steps still lands: one more.
    total = hp.steps + (1 if pipeline else 0)
    assert box["result"]["state"] == "finished" and box["result"]["accepted"] == total
    assert double.ps.version == total and double.ps.accepted == {"w-0": total}
    assert double.ps.gaps == 0 and trainer.rejoins == 0
    # One trainer alone: every gradient is fresh, or exactly one version behind when pipelined.
    assert double.staleness == ([0] + [1] * (total - 1) if pipeline else [0] * total)


@pytest.mark.parametrize("pipeline", [False, True])
def test_a_slow_ps_is_rejoined_not_abandoned(loop, tmp_path, pipeline):
    """A call slower than call_timeout_s makes the trainer rejoin the SAME generation and go on;
    while it is away the PS does not count it as active."""
    hp = HP.with_(steps=10_000, pipeline=pipeline)
    double, trainer, thread, box = _started(loop, tmp_path, hp)
    _until(lambda: double.ps.version >= 10)
    double.frozen.set()
    _until(lambda: trainer.ps_failures >= 1)  # the call timed out
    time.sleep(hp.call_timeout_s + 0.1)  # the PS stays frozen past the trainer's lease
    frozen_at = time.monotonic()
    assert double.ps.active() == []
    double.frozen.clear()
    _until(lambda: trainer.rejoins >= 1)
    resumed = double.ps.accepted["w-0"]
    _until(lambda: double.ps.accepted["w-0"] >= resumed + 10)  # it contributes again
    assert trainer.generation == 0 and double.ps.active() == ["w-0"]
    assert time.monotonic() - frozen_at < hp.ps_lost_after_s
    kinds = [e["kind"] for e in trainer.posted]
    assert kinds.index("trainer-ps-lost") < kinds.index("ps-rejoined")
    # One slow call: one failure, one rejoin, each said with who, where and why.
    assert trainer.ps_failures == 1 and trainer.rejoins == 1 and trainer.state == "training"
    (lost,) = [e for e in trainer.posted if e["kind"] == "trainer-ps-lost"]
    (back,) = [e for e in trainer.posted if e["kind"] == "ps-rejoined"]
    assert lost["worker"] == back["worker"] == "w-0" and back["generation"] == 0
    assert 10 <= lost["step"] <= back["step"] <= double.ps.version
    assert lost["error"].startswith("no reply within 0.")  # past the 0.5 s call timeout
    asyncio.run(trainer.stop())
    thread.join(30 * PATIENCE)
    assert box["result"]["state"] == "stopped"
    # Every local step either arrived (the timed-out push too, once the PS thawed) or is
    # counted as a gap: nothing vanishes silently.
    assert double.ps.accepted["w-0"] + double.ps.gaps == trainer.local_step


def test_a_new_generation_is_followed(loop, tmp_path):
    hp = HP.with_(steps=10_000)
    old = _double(loop, tmp_path, hp=hp)
    published = Published(old)
    trainer = _trainer(published, hp=hp)
    thread, _ = _start(trainer)
    _until(lambda: old.ps.version >= 5)
    new = _double(loop, tmp_path, generation=1, hp=hp)
    published.generation, published.shards = 1, [new]
    _until(lambda: new.ps.accepted.get("w-0", 0) >= 5)
    assert trainer.generation == 1
    count = old.ps.version
    time.sleep(0.3)
    assert old.ps.version == count  # nothing goes to the old one any more
    asyncio.run(trainer.stop())
    thread.join(30 * PATIENCE)


def test_a_ps_moved_to_the_trainers_region_paces_it_faster(loop, tmp_path):
    """The driver moved the PS (a new generation, published with its zone): a paced trainer in
    us-east1-c, slower while the PS was in us-central1-a, paces anew at its GPU's own speed; a
    move within a region changes nothing."""
    hp = HP.with_(steps=10_000, emulate="paper,ps=none", call_timeout_s=10.0 * PATIENCE)
    old = _double(loop, tmp_path, hp=hp)

    class Zoned(Published):
        zone = "us-central1-a"

        def __call__(self, timeout):
            return self.generation, list(self.shards), self.zone

    published = Zoned(old)
    trainer = _trainer(
        published, hp=hp, gpu="k80", time_scale=5.0, zone="us-east1-c", ps_zone="us-central1-a"
    )
    thread, _ = _start(trainer)

    def paced():
        return [e for e in trainer.posted if e["kind"] == "emulation-paced"]

    try:
        _until(lambda: old.ps.version >= 3)
        assert [e["cross_region"] for e in paced()] == [True]
        # Within the region: the next generation is followed, the pace is kept.
        same = _double(loop, tmp_path, generation=1, hp=hp)
        published.generation, published.shards, published.zone = 1, [same], "us-central1-b"
        _until(lambda: same.ps.accepted.get("w-0", 0) >= 3)
        assert trainer.ps_zone == "us-central1-b" and len(paced()) == 1
        # To the trainer's region: paced at the K80's 4.56 steps/s, no longer 1.48x slower.
        near = _double(loop, tmp_path, generation=2, hp=hp)
        published.generation, published.shards, published.zone = 2, [near], "us-east1-a"
        _until(lambda: near.ps.accepted.get("w-0", 0) >= 3)
        first, second = paced()
        assert trainer.ps_zone == "us-east1-a" and second["cross_region"] is False
        assert second["ps_zone"] == "us-east1-a"
        assert second["wall_steps_per_s"] == pytest.approx(4.56 * 5.0)
        assert first["wall_steps_per_s"] == pytest.approx(4.56 * 5.0 / 1.48)
    finally:
        asyncio.run(trainer.stop())
        thread.join(30 * PATIENCE)


def test_a_generation_with_more_shards_is_followed_with_the_vector_cut_anew(loop, tmp_path):
    # The PS gained a host (cluster.scale_ps): generation 1 has two shards, made from the first
    # one's state. The trainer, started with one shard's bounds, pushes each its own slice.
    # (No call is meant to be slow here: a loaded host must not make one look so.)
    hp = HP.with_(steps=10_000, call_timeout_s=10.0 * PATIENCE)
    old = _double(loop, tmp_path, hp=hp)
    published = Published(old)
    trainer = _trainer(published, hp=hp)
    n = trainer.bounds[-1][1]
    thread, _ = _start(trainer)
    _until(lambda: old.ps.version >= 3)
    state = asyncio.run_coroutine_threadsafe(old.ps.get_state(), loop).result(10)
    model = build_model("resnet8", num_classes=10)
    mask = decay_mask(model)
    bounds = shard_bounds(n, 2)
    new = [
        PSDouble(
            ParameterServer(
                "r",
                i,
                2,
                st["weights"],
                mask[a:b],
                st["bn"],
                hp.to_dict(),
                str(tmp_path),
                generation=1,
                momentum=st["momentum"],
                version=state["step"],
            ),
            loop,
        )
        for i, (st, (a, b)) in enumerate(zip(regroup([state], 2), bounds, strict=True))
    ]
    published.generation, published.shards = 1, new
    _until(lambda: min(d.ps.accepted.get("w-0", 0) for d in new) >= 3)
    assert trainer.generation == 1 and trainer.bounds == bounds
    seen = {(shard, size) for shard, size, _ in _pushed(new)}
    assert sorted(seen) == [(0, bounds[0][1]), (1, n - bounds[0][1])]
    assert new[0].ps.version == new[1].ps.version > state["step"]
    asyncio.run(trainer.stop())
    thread.join(30 * PATIENCE)


def test_a_ps_that_never_answers_is_given_up_within_the_bound(loop, tmp_path):
    hp = HP.with_(steps=10_000)
    double, trainer, thread, box = _started(loop, tmp_path, hp)
    _until(lambda: double.ps.version >= 3)
    t0 = time.monotonic()
    double.error = OSError("Unable to contact Actor's worker")
    thread.join(hp.ps_lost_after_s + 20 * PATIENCE)
    assert not thread.is_alive()
    assert isinstance(box.get("error"), PSLost), box
    assert "no parameter server answered" in str(box["error"])
    assert time.monotonic() - t0 < hp.ps_lost_after_s + 10
    assert trainer.state == "failed"


def test_stop_is_prompt_even_while_the_ps_is_away(loop, tmp_path):
    hp = HP.with_(steps=10_000, ps_lost_after_s=600.0)
    double, trainer, thread, box = _started(loop, tmp_path, hp)
    _until(lambda: double.ps.version >= 3)
    double.error = OSError("gone " + "and far " * 50)
    _until(lambda: trainer.state == "rejoining")
    (lost,) = [e for e in trainer.posted if e["kind"] == "trainer-ps-lost"]
    assert len(lost["error"]) == 200 and lost["error"].startswith("OSError('gone and far")
    t0 = time.monotonic()
    asyncio.run(trainer.stop())
    thread.join(30 * PATIENCE)
    assert not thread.is_alive() and time.monotonic() - t0 < 10
    assert box["result"]["state"] == "stopped"


@pytest.mark.parametrize("pipeline", [False, True])
def test_a_notice_pushes_the_last_gradient_and_leaves(loop, tmp_path, pipeline):
    """Pipelined, the push in flight is taken in first; then the last one goes, alone."""
    hp = HP.with_(steps=10_000, pipeline=pipeline)
    double, trainer, thread, box = _started(loop, tmp_path, hp)
    _until(lambda: double.ps.version >= 5)
    asyncio.run(trainer._drain(time.time() + 30))
    thread.join(30 * PATIENCE)
    assert box["result"]["state"] == "drained"
    assert double.ps.finals == {"w-0"} and double.ps.active() == []
    assert double.ps.last_local["w-0"] == trainer.local_step  # the last gradient arrived
    assert double.ps.computing["w-0"] is False


# -- FlatModel: what the mutation run (issue 17) showed unchecked ------------------------------------


# -- paced emulation (transient_nb.training.emulation) ----------------------------------------------------


def test_a_paced_trainer_runs_at_its_gpus_rate_divided_by_time_scale(loop, tmp_path):
    # K80 at 4.56 steps/s, time_scale 5: 22.8 steps/s (this host does a step in a few ms).
    hp = HP.with_(steps=50, emulate="paper,ps=none")
    double, trainer, thread, box = _started(loop, tmp_path, hp, gpu="k80", time_scale=5.0)
    thread.join(60 * PATIENCE)
    assert box["result"]["state"] == "finished"
    times = double.push_times[5:]  # after the first steps (data, model, join)
    rate = (len(times) - 1) / (times[-1] - times[0])
    paced = next(e for e in trainer.posted if e["kind"] == "emulation-paced")
    assert paced["gpu"] == "k80" and paced["wall_steps_per_s"] == pytest.approx(22.8)
    assert (paced["worker"], paced["role"], paced["steps_per_s"]) == ("w-0", "worker", 4.56)
    assert (paced["time_scale"], paced["step_scale"]) == (5.0, 1.0)
    behind = [e for e in trainer.posted if e["kind"] == "emulation-behind"]
    if not behind:  # the pace held, as on any host that is not overloaded many times over
        # Within 25%: a loaded host wakes the pacer's sleeps late (18.3 steps/s once, beside
        # two mutation runs) without its own work per step exceeding the pace. Unpaced it
        # would be hundreds a second; without the time scale, 4.56.
        assert rate == pytest.approx(4.56 * 5, rel=0.25)
    else:  # the host could not keep it: then the trainer said so, with what it could do
        assert rate < 22.8 and behind[0]["achieved_steps_per_s"] < 22.8


def test_an_impossible_pace_is_reported_not_hidden(loop, tmp_path, monkeypatch):
    monkeypatch.setattr("transient_nb.training.emulation.BEHIND_WINDOW_S", 0.3)
    hp = HP.with_(steps=80, emulate="k80=100000")  # 10 us a step: no host keeps that
    _, trainer, thread, box = _started(loop, tmp_path, hp, gpu="k80", time_scale=1.0)
    thread.join(60 * PATIENCE)
    assert box["result"]["state"] == "finished"
    behind = [e for e in trainer.posted if e["kind"] == "emulation-behind"]
    assert behind and behind[0]["worker"] == "w-0" and behind[0]["role"] == "worker"
    assert behind[0]["gpu"] == "k80"
    assert behind[0]["achieved_steps_per_s"] < behind[0]["target_steps_per_s"] / 10


def test_a_gpu_type_without_a_rate_is_said_unpaced(loop, tmp_path, monkeypatch):
    monkeypatch.setenv("TRANSIENT_NB_VM", '{"name": "w-0", "gpu": "h100"}')  # from the VM
    hp = HP.with_(steps=10, emulate="k80=1")
    double = _double(loop, tmp_path, hp=hp)
    trainer = _trainer(Published(double), hp=hp, time_scale=1.0)
    t0 = time.monotonic()
    thread, box = _start(trainer)
    thread.join(60 * PATIENCE)
    assert box["result"]["state"] == "finished" and time.monotonic() - t0 < 9  # not 1 step/s
    paced = [e for e in trainer.posted if e["kind"] == "emulation-paced"]
    assert paced[0]["gpu"] == "h100" and paced[0]["wall_steps_per_s"] is None


# -- the module's helpers and the actor's own surface ----------------------------------------------


def test_a_trainer_is_named_after_its_vm_and_draws_batches_of_its_own(monkeypatch):
    n = len(get_flat(flat_layout(build_model("resnet8", num_classes=10))[0]))

    def make(**kw):
        return Trainer("r", "resnet8", "digits", HP.to_dict(), "v", [(0, n)], **kw)

    monkeypatch.setenv("TRANSIENT_NB_VM", '{"name": "demo-w-3", "gpu": "V100"}')
    t = make(seed=7)
    assert (t.name, t.gpu, t.variable, t.bounds) == ("demo-w-3", "v100", "v", [(0, n)])
    assert t.hp == HP and t.device == "cpu" and t.worker is None
    assert t._counters() == {
        "worker": "demo-w-3",
        "state": "created",
        "local_step": 0,
        "accepted": 0,
        "ps_failures": 0,
        "rejoins": 0,
        "generation": -1,
        "data_plane": "dask",
    }
    # The seed depends on the base seed and the name: same inputs, same batches.
    assert (
        t.seed
        == make(seed=7).seed
        == (7 * 1_000_003 + __import__("zlib").crc32(b"demo-w-3")) % 2**31
    )
    assert make(seed=8).seed != t.seed and make(seed=7, name="demo-w-4").seed != t.seed
    assert make(name="x", gpu="t4").gpu == "t4"
    monkeypatch.setenv("TRANSIENT_NB_VM", "not json")
    assert make().name == "trainer" and make().gpu is None
    monkeypatch.delenv("TRANSIENT_NB_VM")
    assert make().name == "trainer"


def test_run_answers_with_the_counters_and_reraises_what_the_loop_raised(loop, tmp_path):
    hp = HP.with_(steps=8)
    double = _double(loop, tmp_path, hp=hp)
    trainer = _trainer(Published(double), hp=hp)

    async def run_and_status():
        result = await trainer.run()
        return result, await trainer.status()

    result, status = asyncio.run(run_and_status())
    assert (
        result
        == status
        == {
            "worker": "w-0",
            "state": "finished",
            "local_step": 8,
            "accepted": 8,
            "ps_failures": 0,
            "rejoins": 0,
            "generation": 0,
            "data_plane": "dask",
        }
    )
    # Stopped at the end: the PS no longer counts it as registered.
    assert "w-0" not in double.ps.registered
    broken = Trainer(
        "r",
        "resnet8",
        "no-such-data",
        hp.to_dict(),
        "v",
        [(0, 1)],
        name="w-1",
        locate=Published(double),
    )
    with pytest.raises(ValueError, match="no-such-data"):
        asyncio.run(broken.run())
    assert broken.state == "failed" and broken._done.is_set()


def test_the_trainer_posts_its_metrics_with_the_run_and_its_device(loop, tmp_path, monkeypatch):
    import transient_nb.training.trainer as trainer_module

    monkeypatch.setattr(trainer_module, "METRICS_EVERY_S", 0.0)
    hp = HP.with_(steps=5)
    _, trainer, thread, box = _started(loop, tmp_path, hp)
    thread.join(120 * PATIENCE)
    assert box["result"]["state"] == "finished"
    metrics = [e for e in trainer.posted if e["kind"] == "worker-metrics"]
    assert [e["local_step"] for e in metrics] == [1, 2, 3, 4, 5]
    assert [e["step"] for e in metrics] == [1, 2, 3, 4, 5]
    assert all(
        e["run"] == "r" and e["worker"] == "w-0" and e["device"] == "cpu" and e["img_per_s"] > 0
        for e in metrics
    )


def _pushed(doubles):
    """Each push the PS doubles were sent: (its shard, the gradient's length, whether it carried
    batch-norm statistics)."""
    return [
        (d.ps.shard, len(k["grad"]), k["bn_delta"] is not None)
        for d in doubles
        for name, _, k in list(d.arguments)
        if name == "push_pull"
    ]


def test_two_shards_each_get_their_slice_and_only_the_first_the_statistics(loop, tmp_path):
    hp = HP.with_(steps=6, call_timeout_s=10.0 * PATIENCE)  # no call is meant to be slow here
    model = build_model("resnet8", num_classes=10)
    params, buffers = flat_layout(model)
    w, mask, n = get_flat(params), decay_mask(model), len(get_flat(params))
    bounds = [(0, n // 2), (n // 2, n)]
    doubles = [
        PSDouble(
            ParameterServer(
                "r",
                i,
                2,
                w[a:b],
                mask[a:b],
                get_flat(buffers) if i == 0 else None,
                hp.to_dict(),
                str(tmp_path),
            ),
            loop,
        )
        for i, (a, b) in enumerate(bounds)
    ]
    trainer = Trainer(
        "r",
        "resnet8",
        "digits",
        hp.to_dict(),
        "v",
        bounds,
        name="w-0",
        locate=lambda timeout: (0, list(doubles)),
    )
    thread, box = _start(trainer)
    thread.join(120 * PATIENCE)
    assert box["result"]["state"] == "finished"
    assert [d.ps.version for d in doubles] == [6, 6]
    assert sorted(set(_pushed(doubles))) == [(0, n // 2, True), (1, n - n // 2, False)]


# -- the actor's own surface without a loop: its drain and its events --------------------------
def test_drain_stops_the_loop_for_its_last_push_and_waits_for_it_until_the_deadline():
    trainer, _ = _gatherer()
    # The loop finishes its last push: the drain returns as soon as it is done (it looks
    # every 20 ms: the worker's notice is short, and what is left of it is the next VM's).
    threading.Timer(0.3, trainer._done.set).start()
    t0 = time.monotonic()
    asyncio.run(trainer._drain(time.time() + 30))
    assert 0.25 <= time.monotonic() - t0 < 0.95
    assert trainer._draining.is_set() and trainer._stop.is_set()
    assert trainer._stopping() is False  # a drain is not a stop: the last push still goes
    # A loop that never finishes: the drain gives up at its deadline.
    trainer, _ = _gatherer()
    t0 = time.monotonic()
    asyncio.run(trainer._drain(time.time() + 0.4))
    assert 0.35 <= time.monotonic() - t0 < 5


def test_post_keeps_the_event_with_the_run_when_there_is_no_worker():
    trainer, _ = _gatherer()
    trainer._post("trainer-ps-lost", worker="w-0", step=2, error="gone")
    (event,) = trainer.posted
    assert event["kind"] == "trainer-ps-lost" and event["run"] == "r"
    assert event["worker"] == "w-0" and event["step"] == 2 and event["time"] > 0


def test_post_inside_a_worker_logs_the_event_on_the_runs_topic():
    from transient_nb.eventlog.vocabulary import TOPIC

    class Worker:
        logged: list = []

        def log_event(self, topic, msg):
            self.logged.append((topic, msg))

    trainer, _ = _gatherer()
    trainer.worker = Worker()
    trainer._post("trainer-ps-lost", worker="w-0", step=2, error="gone")
    assert trainer.worker.logged == [(TOPIC, trainer.posted[0])]


def test_the_loop_reports_its_images(loop, tmp_path):
    """worker-metrics: images per second over the last report window; every push carries its
    batch's images (the PS's metrics)."""
    hp = HP.with_(steps=10_000)
    double = _double(loop, tmp_path, hp=hp)
    trainer = _trainer(Published(double), hp=hp)
    t0 = time.monotonic()
    thread, box = _start(trainer)
    _until(lambda: any(e["kind"] == "worker-metrics" for e in trainer.posted))
    elapsed = time.monotonic() - t0
    metrics = next(e for e in trainer.posted if e["kind"] == "worker-metrics")
    asyncio.run(trainer.stop())
    thread.join(30 * PATIENCE)
    assert box["result"]["state"] == "stopped"
    assert metrics["worker"] == "w-0" and metrics["device"] == "cpu"
    assert 0 < metrics["local_step"] <= trainer.local_step and metrics["step"] >= 1
    # The images of local_step batches of 16 over at most the time since the start.
    assert metrics["img_per_s"] >= metrics["local_step"] * hp.batch_size / elapsed * 0.9
    assert metrics["img_per_s"] <= metrics["local_step"] * hp.batch_size / 2.0 * 1.1
    window = double.ps._window
    assert window["images"] == window["updates"] * hp.batch_size


def test_the_trainer_thread_is_named_after_its_run_and_dies_with_the_process(loop, tmp_path):
    hp = HP.with_(steps=10_000)
    double = _double(loop, tmp_path, hp=hp)
    trainer = _trainer(Published(double), hp=hp)
    running = asyncio.run_coroutine_threadsafe(trainer.run(), loop)
    _until(lambda: trainer.local_step > 0)
    (named,) = [t for t in threading.enumerate() if t.name == "transient-trainer-r"]
    assert named.daemon
    asyncio.run(trainer.stop())
    assert running.result(30 * PATIENCE)["state"] == "stopped"


@pytest.mark.parametrize(("emulate", "counts_reply"), [("paper,ps=none", True), ("paper", False)])
def test_the_pacer_follows_the_step_scale_and_counts_an_unpaced_ps_reply(emulate, counts_reply):
    """Each global step stands for emulate_step_scale emulated ones; the PS's reply is this
    host's work (counted in the step) unless the PS is paced too (then it is the emulation's)."""
    hp = HP.with_(emulate=emulate, emulate_step_scale=2.0)
    trainer = _trainer(lambda timeout: (0, []), hp=hp, gpu="k80", time_scale=5.0)
    pacer = trainer._pacer()
    assert pacer is not None and pacer.step_s == pytest.approx(2.0 / (4.56 * 5.0))
    assert pacer.count_reply is counts_reply
    (paced,) = trainer.posted
    assert paced["wall_steps_per_s"] == pytest.approx(11.4) and paced["step_scale"] == 2.0


# -- what the loop does with each batch and each reply (the loop's mutation survivors) ----------


class Recorder(PSDouble):
    """A PS double that keeps a copy of every push (and the trainer's state at the time), and can
    answer with other batch-norm statistics than the PS's (``bn_reply``), or fail a final push."""

    def __init__(self, ps, loop, trainer_state=lambda: None):
        super().__init__(ps, loop)
        self.pushes: list[dict] = []
        self.bn_reply: float | None = None
        self.fail_final = False
        self._state = trainer_state

    def __getattr__(self, name):
        call = super().__getattr__(name)
        if name != "push_pull":
            return call

        def push_pull(*a, **k):
            grad, bn = k["grad"].copy(), k["bn_delta"]
            self.pushes.append(dict(k, grad=grad, bn_delta=None if bn is None else bn.copy()))
            self.pushes[-1]["state"] = self._state()
            if self.fail_final and k["final"]:
                done: concurrent.futures.Future = concurrent.futures.Future()
                done.set_exception(OSError("the worker of this actor is gone"))
                return _Done(done)
            future = call(*a, **k)
            return future if self.bn_reply is None else _Marked(future, self.bn_reply)

        return push_pull


class _Done:
    def __init__(self, fut):
        self._fut = fut

    def result(self, timeout=None):
        return self._fut.result(timeout)

    def done(self):
        return True


class _Marked:
    """A reply whose statistics are replaced by a marker value."""

    def __init__(self, future, value):
        self._future, self._value = future, value

    def result(self, timeout=None):
        pieces, bn, *rest = self._future.result(timeout)
        return (pieces, np.full_like(bn, self._value), *rest)

    def done(self):
        return self._future.done()


def _recorder(loop, tmp_path, hp, trainer_state=lambda: None):
    return Recorder(_double(loop, tmp_path, hp=hp).ps, loop, trainer_state)


def test_the_loop_says_what_it_does_loading_then_joining_then_training(loop, tmp_path, monkeypatch):
    # The trainer reads its data through its workload (the built-in set by name, as ever).
    import transient_nb.training.workload as trainer_module

    hp = HP.with_(steps=3)
    seen: list[tuple[str, str, object]] = []
    box: dict = {}
    double = _recorder(loop, tmp_path, hp, lambda: box["trainer"].state)
    published = Published(double)

    def locate(timeout):
        seen.append(("locate", box["trainer"].state, torch.get_num_threads()))
        return published(timeout)

    real_load = trainer_module.load_dataset

    def load_dataset(data, train):
        seen.append(("load", box["trainer"].state, (data, train)))
        return real_load(data, train=train)

    monkeypatch.setattr(trainer_module, "load_dataset", load_dataset)
    trainer = box["trainer"] = _trainer(locate, hp=hp)
    assert trainer.state == "created"
    thread, result = _start(trainer)
    thread.join(120 * PATIENCE)
    assert result["result"]["state"] == "finished"
    # It trains on the training set, and says where it is at each stage.
    assert seen[0] == ("load", "loading", ("digits", True))
    assert seen[1] == ("locate", "joining", 1)  # outside a worker: one torch thread
    assert [p["state"] for p in double.pushes] == ["training"] * 3


@pytest.mark.parametrize("wire_dtype", ["float32", "float16"])
def test_the_first_push_is_the_gradient_of_the_ps_weights_on_the_seeded_first_batch(
    loop, tmp_path, wire_dtype
):
    """The trainer computes on the weights it pulled, a batch of the training set drawn in its
    seed's order, and pushes that gradient in the wire dtype (not zeros, not another batch)."""
    import torch.nn.functional as F

    from transient_nb.training.data import BatchStream, load_dataset
    from transient_nb.training.flat import FlatModel

    hp = HP.with_(steps=2, wire_dtype=wire_dtype)
    double = _recorder(loop, tmp_path, hp)
    w0, bn0 = double.ps.w.copy(), double.ps.bn.copy()
    trainer = _trainer(Published(double), hp=hp)
    thread, box = _start(trainer)
    thread.join(120 * PATIENCE)
    assert box["result"]["state"] == "finished"

    dataset = load_dataset("digits", train=True)
    model = build_model("resnet8", num_classes=dataset.num_classes)
    model.train()
    flat = FlatModel(model, wire_dtype)
    # The weights as the trainer got them: through the wire's dtype (float16 rounds them).
    flat.load([w0.astype(wire_dtype)], [(0, len(w0))], bn0)
    x, y = next(BatchStream(dataset, hp.batch_size, seed=trainer.seed))
    flat.mark_statistics()
    loss = F.cross_entropy(model(x), y)
    model.zero_grad(set_to_none=False)
    loss.backward()
    expected, expected_bn = flat.grads()

    first = double.pushes[0]
    assert first["grad"].dtype == np.dtype(wire_dtype) and first["images"] == hp.batch_size
    scale = float(np.abs(expected).max())
    assert scale > 0
    tol = 1e-2 if wire_dtype == "float16" else 1e-4
    np.testing.assert_allclose(first["grad"], expected, rtol=tol, atol=tol * scale)
    np.testing.assert_allclose(first["bn_delta"], expected_bn, rtol=tol, atol=tol)
    assert first["loss"] == pytest.approx(float(loss.detach()), rel=1e-4)
    # Every later push is a real gradient too (in place: the gradients stay the flat's views).
    assert all(np.abs(p["grad"]).max() > 0 for p in double.pushes)


@pytest.mark.parametrize("pipeline", [False, True])
def test_every_reply_brings_the_ps_batch_norm_statistics(loop, tmp_path, pipeline):
    """Other trainers move the PS's statistics: each reply's replace the trainer's own. Here
    the replies carry 7.0 everywhere, so each later step's statistics move away from 7.0 (a
    running mean or variance of about 0-2 pulled from 7 by the 0.1 momentum: about -0.6)."""
    hp = HP.with_(steps=6, pipeline=pipeline)
    double = _recorder(loop, tmp_path, hp)
    double.bn_reply = 7.0
    trainer = _trainer(Published(double), hp=hp)
    thread, box = _start(trainer)
    thread.join(120 * PATIENCE)
    assert box["result"]["state"] == "finished"

    def pulled_from_seven(push):
        return float(np.mean(push["bn_delta"] < -0.5))

    # The first push started from the statistics pulled at the join (the PS's own); pipelined,
    # the second too. Every push after them started from a reply's.
    fresh = 2 if pipeline else 1
    assert all(pulled_from_seven(p) < 0.05 for p in double.pushes[:fresh])
    assert all(pulled_from_seven(p) > 0.3 for p in double.pushes[fresh:])


def test_the_loop_reports_and_looks_for_a_new_ps_on_its_own_clock(loop, tmp_path, monkeypatch):
    """A report every METRICS_EVERY_S and a look at the run's PS every GENERATION_CHECK_S (both
    2 s), on a clock that moves 1 s per step: images per second are exactly 32 images / 2 s."""
    import itertools
    import sys
    import types

    import transient_nb.training.trainer as trainer_module

    ticks = itertools.count(1)
    clock = types.SimpleNamespace(
        time=lambda: float(next(ticks)), monotonic=time.monotonic, sleep=time.sleep
    )
    monkeypatch.setattr(trainer_module, "time", clock)
    hp = HP.with_(steps=9)
    double = _double(loop, tmp_path, hp=hp)
    trainer = _trainer(Published(double), hp=hp)
    looked: list[int] = []
    newer = trainer._newer_generation

    def newer_generation():
        # Not a slow call's look (from _gather; a name mutmut's copies of it keep).
        if "_gather" not in sys._getframe(1).f_code.co_name:
            looked.append(trainer.local_step)
        return newer()

    trainer._newer_generation = newer_generation  # type: ignore[method-assign]
    thread, box = _start(trainer)
    thread.join(120 * PATIENCE)
    assert box["result"]["state"] == "finished"
    metrics = [e for e in trainer.posted if e["kind"] == "worker-metrics"]
    # The clock reads 1 at the start and 1 + k at step k: reports at steps 2, 4, 6, 8.
    assert [e["local_step"] for e in metrics] == [2, 4, 6, 8]
    assert [e["img_per_s"] for e in metrics] == [16.0] * 4
    # The first look at once (nothing looked at before), then every 2 s; none at the last step.
    assert looked == [1, 3, 5, 7]


@pytest.mark.parametrize("ending", ["finished", "drained", "last_push_failed"])
def test_the_pace_is_judged_once_more_however_the_loop_ends(loop, tmp_path, monkeypatch, ending):
    """The judging window (here longer than the run) never closes; the final judgment still
    says that an impossible pace was not kept, whether the run got its steps or a notice came
    (its last push answered or not)."""
    monkeypatch.setattr("transient_nb.training.emulation.BEHIND_WINDOW_S", 1000.0)
    hp = HP.with_(steps=8 if ending == "finished" else 10_000, emulate="k80=100000")
    double = _recorder(loop, tmp_path, hp)
    double.fail_final = ending == "last_push_failed"
    trainer = _trainer(Published(double), hp=hp, gpu="k80", time_scale=1.0)
    thread, box = _start(trainer)
    if ending != "finished":
        _until(lambda: double.ps.version >= 5)
        asyncio.run(trainer._drain(time.time() + 30))
    thread.join(60 * PATIENCE)
    assert box["result"]["state"] == ("finished" if ending == "finished" else "drained")
    behind = [e for e in trainer.posted if e["kind"] == "emulation-behind"]
    assert len(behind) == 1 and behind[0]["worker"] == "w-0"
    if ending == "last_push_failed":
        assert double.pushes[-1]["final"] and trainer.ps_failures == 1 and trainer.rejoins == 0


def test_a_stopped_trainer_leaves_the_ps_without_a_lost_gradient(loop, tmp_path):
    """Stopped, it unregisters once as drained (its gradient was not lost: it chose to stop);
    after a notice its final push said goodbye, so it does not unregister at all."""
    hp = HP.with_(steps=10_000)
    stopped, drained = _double(loop, tmp_path / "a", hp=hp), _double(loop, tmp_path / "b", hp=hp)
    a = _trainer(Published(stopped), hp=hp, name="w-0")
    b = _trainer(Published(drained), hp=hp, name="w-1")
    (ta, ra), (tb, rb) = _start(a), _start(b)
    _until(lambda: stopped.ps.version >= 3 and drained.ps.version >= 3)
    asyncio.run(a.stop())
    asyncio.run(b._drain(time.time() + 30))
    ta.join(30 * PATIENCE)
    tb.join(30 * PATIENCE)
    assert (ra["result"]["state"], rb["result"]["state"]) == ("stopped", "drained")
    assert stopped.called.count("unregister") == 1 and "unregister" not in drained.called
    (leaving,) = [a for name, a, _ in stopped.arguments if name == "unregister"]
    assert leaving == ("w-0", True)
    assert stopped.ps.lost_in_flight == 0 and "w-0" not in stopped.ps.registered


def test_the_loop_uses_the_workers_threads(loop, tmp_path):
    """Inside a worker, torch gets the worker's nthreads (one per core it was given)."""
    import types

    hp = HP.with_(steps=2)
    double = _double(loop, tmp_path, hp=hp)
    seen: list[int] = []
    published = Published(double)
    before = torch.get_num_threads()

    def locate(timeout):
        seen.append(torch.get_num_threads())
        # Back to what the process had before any step runs: a pool of 3 threads made in this
        # process would break the forked processes benchmarks/mutation.py runs tests in (a
        # forked child's first parallel region hangs or dies: every mutant then looks killed).
        torch.set_num_threads(before)
        return published(timeout)

    trainer = _trainer(locate, hp=hp)
    events: list = []
    trainer.worker = types.SimpleNamespace(
        state=types.SimpleNamespace(nthreads=3), log_event=lambda topic, e: events.append(e)
    )
    try:
        thread, box = _start(trainer)
        thread.join(120 * PATIENCE)
    finally:
        torch.set_num_threads(before)
    assert box["result"]["state"] == "finished"
    assert seen[0] == 3
    assert [e["kind"] for e in events] == [e["kind"] for e in trainer.posted]


@pytest.mark.parametrize(
    ("zone", "ps_zone", "far"),
    [
        ("us-east1-c", "us-central1-a", True),
        ("us-central1-b", "us-central1-a", False),
        ("us-east1-c", None, False),  # the PS's zone unknown: nothing is weighed
    ],
)
def test_a_trainer_in_another_region_than_the_ps_is_paced_slower(monkeypatch, zone, ps_zone, far):
    """The paper: workers in another region than the PS trained up to 48% slower. The
    trainer's zone comes from its VM."""
    monkeypatch.setenv("TRANSIENT_NB_VM", f'{{"name": "w-0", "gpu": "k80", "zone": "{zone}"}}')
    hp = HP.with_(emulate="paper,ps=none")
    trainer = _trainer(lambda timeout: (0, []), hp=hp, time_scale=5.0, ps_zone=ps_zone)
    assert trainer.zone == zone
    pacer = trainer._pacer()
    assert pacer is not None
    assert pacer.step_s == pytest.approx((1.48 if far else 1.0) / (4.56 * 5.0))
    (paced,) = trainer.posted
    assert (paced["zone"], paced["ps_zone"], paced["cross_region"]) == (zone, ps_zone, far)
    assert paced["wall_steps_per_s"] == pytest.approx(4.56 * 5.0 / (1.48 if far else 1.0))


def test_two_slow_calls_are_two_failures_and_two_rejoins(loop, tmp_path):
    hp = HP.with_(steps=10_000)
    double, trainer, thread, box = _started(loop, tmp_path, hp)
    for n in (1, 2):
        _until(lambda n=n: double.ps.version >= 10 * n)
        double.frozen.set()
        _until(lambda n=n: trainer.ps_failures >= n)
        double.frozen.clear()
        _until(lambda n=n: trainer.rejoins >= n and trainer.state == "training")
    asyncio.run(trainer.stop())
    thread.join(30 * PATIENCE)
    result = box["result"]
    assert (result["ps_failures"], result["rejoins"]) == (2, 2)
    assert [
        e["kind"] for e in trainer.posted if e["kind"] in ("trainer-ps-lost", "ps-rejoined")
    ] == [
        "trainer-ps-lost",
        "ps-rejoined",
    ] * 2


def test_a_trainer_built_in_a_worker_takes_its_name_hooks_its_drain_and_reads_the_variable(
    monkeypatch,
):
    """Inside a worker (no VM description): named after the worker, its drain hooked to the
    worker's notices, and the PS looked up in the run's Variable. The worker is faked where the
    module asks for it: a task on an in-process worker hangs in benchmarks/mutation.py's forked
    children (every mutant then looks killed)."""
    import json
    import types
    import zlib

    from distributed import Client, Variable

    import transient_nb.training.trainer as trainer_module
    from transient_nb.worker import drain as agent

    monkeypatch.delenv("TRANSIENT_NB_VM", raising=False)
    worker = types.SimpleNamespace(name="tcp-w-7")
    monkeypatch.setattr(trainer_module, "get_worker", lambda: worker)
    n = len(get_flat(flat_layout(build_model("resnet8", num_classes=10))[0]))
    with Client(processes=False, n_workers=1, threads_per_worker=1, dashboard_address=None):
        Variable("ps-of-w").set(json.dumps({"generation": 4, "shards": [["tcp://a:1", "ps-0"]]}))
        t = Trainer("r", "resnet8", "digits", HP.to_dict(), "ps-of-w", [(0, n)])
        unpublished = Trainer("r", "resnet8", "digits", HP.to_dict(), "nothing-here", [(0, n)])
        try:
            assert t.worker is worker and t.name == "tcp-w-7"
            assert t._drain in agent._hooks
            generation, actors, ps_zone = t._locate(5)
            assert ps_zone is None  # published before PS moves were said
            # A look at a Variable nothing was published in ends at its bound (in a thread: a
            # look without one would never end).
            box: dict = {}

            def look():
                try:
                    unpublished._locate(0.2)
                except BaseException as e:
                    box["error"] = e

            thread = threading.Thread(target=look, daemon=True)
            thread.start()
            thread.join(30 * PATIENCE)
            assert isinstance(box.get("error"), TimeoutError)
        finally:
            agent.unregister_drain_hook(t._drain)
            agent.unregister_drain_hook(unpublished._drain)
    assert generation == 4 and [(a._address, a.key) for a in actors] == [("tcp://a:1", "ps-0")]
    assert t._custom_locate is False
    # The base seed defaults to 0: the seed is the name's alone.
    assert t.seed == zlib.crc32(b"tcp-w-7") % 2**31
    # Outside a worker: nothing to hook, and a custom look-up is said to be one.
    monkeypatch.undo()
    outside = _trainer(lambda timeout: (0, []))
    assert outside.worker is None and outside._drain not in agent._hooks
    assert outside._custom_locate is True


# -- the data plane (transient_nb.training.wire): the bytes beside the actor ----------------------
@pytest.mark.parametrize("pipeline", [False, True])
def test_with_a_data_plane_the_gradients_bypass_the_actor(loop, tmp_path, pipeline):
    hp = HP.with_(pipeline=pipeline, data_plane="unix")
    double, trainer, thread, box = _started(loop, tmp_path, hp)
    thread.join(120 * PATIENCE)
    total = hp.steps + (1 if pipeline else 0)
    assert box["result"]["state"] == "finished" and box["result"]["accepted"] == total
    assert box["result"]["data_plane"] == "unix"
    assert double.ps.version == total and double.ps.accepted == {"w-0": total}
    # The actor kept the control (the endpoint, registration); the bytes went beside it.
    assert "push_pull" not in double.called and "pull" not in double.called
    assert double.called[:2] == ["data_endpoint", "register"]
    assert trainer._links is None  # closed at the end


def test_the_actor_carries_the_bytes_when_the_run_says_so(loop, tmp_path):
    hp = HP.with_(steps=5, data_plane="dask")
    double = _double(loop, tmp_path, hp=hp)
    trainer = _trainer(Published(double), hp=hp)
    assert trainer.train()["data_plane"] == "dask"
    assert "data_endpoint" not in double.called and double.called.count("push_pull") == 5


def test_a_cut_data_plane_is_rejoined_and_training_goes_on(loop, tmp_path):
    hp = HP.with_(steps=40, data_plane="unix")
    double, trainer, thread, box = _started(loop, tmp_path, hp)
    _until(lambda: double.ps.version >= 10)
    assert double.ps._data_server.cut() == 1
    thread.join(120 * PATIENCE)
    assert box["result"]["state"] == "finished" and trainer.ps_failures == 1
    assert trainer.rejoins == 1 and box["result"]["data_plane"] == "unix"
    assert double.called.count("data_endpoint") == 2  # connected anew
    assert double.ps.gaps <= 1  # at most the gradient that was on the wire


def test_a_ps_loop_frozen_past_the_call_timeout_is_rejoined(loop, tmp_path):
    hp = HP.with_(steps=30, data_plane="unix")
    double, trainer, thread, box = _started(loop, tmp_path, hp)
    _until(lambda: double.ps.version >= 5)
    loop.call_soon_threadsafe(time.sleep, 3 * hp.call_timeout_s)  # the PS's loop stops
    thread.join(120 * PATIENCE)
    assert box["result"]["state"] == "finished" and trainer.ps_failures >= 1
    lost = [e for e in trainer.posted if e["kind"] == "trainer-ps-lost"]
    assert lost and "no reply within" in lost[0]["error"]
