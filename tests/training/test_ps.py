"""The parameter server's arithmetic and bookkeeping, without Dask (its methods are coroutines)."""

from __future__ import annotations

import asyncio
import itertools
import math
import pickle
import time

import numpy as np
import pytest
import torch

from transient_nb.training import checkpoint
from transient_nb.training.hparams import HParams
from transient_nb.training.ps import ParameterServer, regroup, shard_bounds


def _ps(tmp_path, n=6, **hp):
    hparams = HParams(steps=100, warmup_steps=0, checkpoint_every=5, **hp).to_dict()
    w = np.linspace(-1, 1, n).astype(np.float32)
    mask = np.array([1, 1, 1, 0, 0, 1][:n], dtype=np.uint8)
    return ParameterServer("r", 0, 1, w, mask, np.zeros(2, np.float32), hparams, str(tmp_path))


def test_updates_match_torch_sgd_with_momentum_and_masked_weight_decay(tmp_path):
    ps = _ps(tmp_path, weight_decay=0.01)
    w0 = ps.w.copy()
    rng = np.random.default_rng(0)
    grads = [rng.normal(size=6).astype(np.float32) for _ in range(5)]
    decayed = torch.nn.Parameter(torch.tensor(w0[[0, 1, 2, 5]]))
    plain = torch.nn.Parameter(torch.tensor(w0[[3, 4]]))
    opt = torch.optim.SGD(
        [{"params": [decayed], "weight_decay": 0.01}, {"params": [plain], "weight_decay": 0.0}],
        lr=0.1,
        momentum=0.9,
    )
    for i, g in enumerate(grads):
        asyncio.run(ps.push_pull(trainer="t", grad=g, base_version=i, local_step=i + 1))
        decayed.grad = torch.tensor(g[[0, 1, 2, 5]])
        plain.grad = torch.tensor(g[[3, 4]])
        opt.step()
    np.testing.assert_allclose(ps.w[[0, 1, 2, 5]], decayed.detach().numpy(), rtol=1e-5)
    np.testing.assert_allclose(ps.w[[3, 4]], plain.detach().numpy(), rtol=1e-5)
    assert ps.version == 5


def test_staleness_gaps_and_lost_gradients_are_counted(tmp_path):
    ps = _ps(tmp_path)
    g = np.zeros(6, np.float32)

    async def scenario():
        await ps.register("a")
        await ps.register("b")
        await ps.pull("a")
        await ps.pull("b")
        await ps.push_pull(trainer="a", grad=g, base_version=0, local_step=1)
        await ps.push_pull(trainer="b", grad=g, base_version=0, local_step=1)  # stale by one update
        await ps.push_pull(
            trainer="a", grad=g, base_version=1, local_step=3
        )  # local step 2 never arrived
        # b is killed while computing, a leaves after its final push.
        assert await ps.unregister("b", drained=False) is True
        await ps.push_pull(trainer="a", grad=g, base_version=3, local_step=4, final=True)
        assert await ps.unregister("a", drained=False) is False
        return await ps.status()

    status = asyncio.run(scenario())
    assert status["step"] == 4
    assert status["accepted"] == {"a": 3, "b": 1}
    assert status["gaps"] == 1
    assert status["lost_in_flight"] == 1
    assert status["drained"] == ["a"]
    assert status["active"] == []


def test_rejoin_after_recovery_does_not_count_gaps(tmp_path):
    ps = _ps(tmp_path)
    g = np.zeros(6, np.float32)

    async def scenario():
        await ps.register("a", local_step=500)  # a trainer that pushed 500 gradients to a lost PS
        await ps.push_pull(trainer="a", grad=g, base_version=0, local_step=501)
        return await ps.status()

    assert asyncio.run(scenario())["gaps"] == 0


def test_lr_is_divided_by_sqrt_of_active_workers(tmp_path):
    ps = _ps(tmp_path, momentum=0.0, weight_decay=0.0)
    g = np.ones(6, np.float32)

    async def scenario():
        for name in "abcd":
            await ps.register(name)
        before = ps.w.copy()
        await ps.push_pull(trainer="a", grad=g, base_version=0, local_step=1)
        return before - ps.w

    np.testing.assert_allclose(asyncio.run(scenario()), 0.1 / 2, rtol=1e-6)


def test_snapshot_writes_complete_shard_files_that_a_manifest_publishes(tmp_path):
    ps = _ps(tmp_path)
    g = np.ones(6, np.float32)

    async def scenario():
        for i in range(5):
            await ps.push_pull(trainer="a", grad=g, base_version=i, local_step=i + 1)
        snap = await ps.snapshot()
        await ps.push_pull(trainer="a", grad=g, base_version=5, local_step=6)  # after the snapshot
        entry = await ps.write_snapshot(snap["step"])
        return snap, entry

    snap, entry = asyncio.run(scenario())
    assert snap["step"] == 5 and snap["counters"]["accepted"] == {"a": 5}
    assert checkpoint.load_latest(str(tmp_path)) is None  # no manifest yet: not a checkpoint
    checkpoint.write_manifest(str(tmp_path), 5, {"counters": snap["counters"]}, [entry])
    ck = checkpoint.load_latest(str(tmp_path))
    assert ck is not None and ck.step == 5
    # The snapshot's weights, not the live ones that moved on after it.
    assert not np.allclose(ck.shards[0]["weights"], ps.w)
    v = np.zeros(6, np.float32)
    w = np.linspace(-1, 1, 6).astype(np.float32)
    for _ in range(5):  # replay: the checkpoint holds exactly five updates, momentum included
        v = 0.9 * v + g + np.array([1, 1, 1, 0, 0, 1]) * 1e-4 * w
        w = w - 0.1 * v
    np.testing.assert_allclose(ck.shards[0]["weights"], w, rtol=1e-5)
    np.testing.assert_allclose(ck.shards[0]["momentum"], v, rtol=1e-5)
    assert ps.last_checkpoint == 5


def test_resume_restores_every_piece_of_optimizer_state(tmp_path):
    """A PS built from another's state continues exactly as the original would have."""
    a = _ps(tmp_path, weight_decay=0.01)
    rng = np.random.default_rng(1)
    grads = [rng.normal(size=6).astype(np.float32) for _ in range(6)]

    async def scenario():
        for i, g in enumerate(grads[:3]):
            await a.push_pull(
                trainer="t",
                grad=g,
                base_version=i,
                local_step=i + 1,
                bn_delta=np.ones(2, np.float32),
            )
        state = await a.get_state()
        b = ParameterServer(
            "r",
            0,
            1,
            state["weights"],
            np.array([1, 1, 1, 0, 0, 1], np.uint8),
            state["bn"],
            a.hp.to_dict(),
            str(tmp_path),
            version=state["step"],
            momentum=state["momentum"],
            counters=state["counters"],
        )
        for i, g in enumerate(grads[3:], start=3):
            await a.push_pull(trainer="t", grad=g, base_version=i, local_step=i + 1)
            await b.push_pull(trainer="t", grad=g, base_version=i, local_step=i + 1)
        return b, await a.status(), await b.status()

    b, sa, sb = asyncio.run(scenario())
    np.testing.assert_array_equal(a.w, b.w)
    np.testing.assert_array_equal(a.v, b.v)
    np.testing.assert_array_equal(a.bn, b.bn)
    assert sa["step"] == sb["step"] == 6
    assert sa["accepted"] == sb["accepted"] == {"t": 6}
    assert sb["gaps"] == 0


def test_replies_never_share_memory_with_state_a_later_update_changes(tmp_path):
    """Dask sends numpy memory without copying it: a reply that is still being sent must not
    change when the next update arrives. Serialize a reply the way the comm does (out-of-band
    buffers that point at the array's memory), apply an update, compare."""
    for wire in ("float32", "float16"):
        ps = _ps(tmp_path, wire_dtype=wire)
        g = np.ones(6, np.float32)

        async def scenario(ps=ps, g=g):
            replies = [await ps.pull("a")]
            replies.append(
                await ps.push_pull(
                    trainer="a",
                    grad=g,
                    base_version=0,
                    local_step=1,
                    bn_delta=np.ones(2, np.float32),
                )
            )
            replies.append(await ps.get_state())
            frames = []
            for reply in replies:
                buffers: list[pickle.PickleBuffer] = []
                pickle.dumps(reply, protocol=5, buffer_callback=buffers.append)
                frames.append(buffers)
            before = [[bytes(b.raw()) for b in fb] for fb in frames]
            for i in range(3):
                await ps.push_pull(
                    trainer="a",
                    grad=g,
                    base_version=1 + i,
                    local_step=2 + i,
                    bn_delta=np.ones(2, np.float32),
                )
            after = [[bytes(b.raw()) for b in fb] for fb in frames]
            return replies, before, after

        replies, before, after = asyncio.run(scenario())
        assert before == after, f"a {wire} reply changed after a later update"
        w, bn, _ = replies[1]
        assert not np.shares_memory(w, ps.w) and not np.shares_memory(bn, ps.bn)


def test_a_trainer_that_stops_calling_stops_counting_as_active(tmp_path):
    ps = _ps(tmp_path, momentum=0.0, weight_decay=0.0, call_timeout_s=0.2)
    g = np.ones(6, np.float32)

    async def scenario():
        await ps.register("a")
        await ps.register("b")
        assert ps.active() == ["a", "b"]
        await asyncio.sleep(0.3)  # b is frozen; a pushes again
        before = ps.w.copy()
        await ps.push_pull(trainer="a", grad=g, base_version=0, local_step=1)
        return before - ps.w

    step = asyncio.run(scenario())
    assert ps.active() == ["a"]
    np.testing.assert_allclose(step, 0.1, rtol=1e-6)  # lr / sqrt(1), not / sqrt(2)


def test_staleness_is_the_versions_a_gradient_missed(tmp_path):
    ps = _ps(tmp_path, metrics_interval_s=1e-9)
    posted = []
    ps._post = lambda kind, **f: posted.append((kind, f))  # type: ignore[method-assign]
    g = np.zeros(6, np.float32)

    async def scenario():
        await ps.push_pull(trainer="a", grad=g, base_version=0, local_step=1)  # fresh: 0
        await ps.push_pull(trainer="b", grad=g, base_version=0, local_step=1)  # missed 1
        await ps.push_pull(trainer="c", grad=g, base_version=0, local_step=1)  # missed 2

    asyncio.run(scenario())
    stale = [f["staleness"] for kind, f in posted if kind == "metrics"]
    assert stale[-3:] == [0, 1, 2]


def test_bn_statistics_sum_the_deltas_of_every_trainer(tmp_path):
    ps = _ps(tmp_path)
    g = np.zeros(6, np.float32)

    async def scenario():
        await ps.push_pull(
            trainer="a", grad=g, base_version=0, local_step=1, bn_delta=np.array([1, 2], np.float32)
        )
        return await ps.push_pull(
            trainer="b",
            grad=g,
            base_version=0,
            local_step=1,
            bn_delta=np.array([0.5, -1], np.float32),
        )

    _, bn, _ = asyncio.run(scenario())
    np.testing.assert_array_equal(bn, [1.5, 1.0])


def test_snapshot_aligns_a_shard_to_the_agreed_version(tmp_path):
    ps = _ps(tmp_path)
    g = np.zeros(6, np.float32)

    async def scenario():
        await ps.push_pull(trainer="a", grad=g, base_version=0, local_step=1)
        return await ps.snapshot(align_version=7)

    assert asyncio.run(scenario())["step"] == 7 and ps.version == 7


def test_float16_wire_both_ways(tmp_path):
    ps = _ps(tmp_path, wire_dtype="float16", momentum=0.0, weight_decay=0.0)
    w, _, _ = asyncio.run(ps.pull())
    assert w.dtype == np.float16
    g16 = np.full(6, 0.5, np.float16)
    w2, _, _ = asyncio.run(ps.push_pull(trainer="a", grad=g16, base_version=0, local_step=1))
    assert w2.dtype == np.float16
    np.testing.assert_allclose(w2, (np.linspace(-1, 1, 6) - 0.05).astype(np.float16), rtol=1e-3)


@pytest.mark.parametrize("n, shards", [(10, 1), (10, 3), (466_906, 2)])
def test_shard_bounds_cover_the_vector(n, shards):
    bounds = shard_bounds(n, shards)
    assert bounds[0][0] == 0 and bounds[-1][1] == n
    assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds))
    assert max(b - a for a, b in bounds) - min(b - a for a, b in bounds) <= 1


def test_regroup_cuts_the_same_vector_for_any_number_of_shards():
    rng = np.random.default_rng(0)
    w, v, bn = rng.normal(size=11), rng.normal(size=11), rng.normal(size=4)
    one = [{"weights": w, "momentum": v, "bn": bn}]
    three = regroup(one, 3)
    assert [len(s["weights"]) for s in three] == [b - a for a, b in shard_bounds(11, 3)]
    assert three[0]["bn"] is bn and three[1]["bn"] is None and three[2]["bn"] is None
    back = regroup(regroup(three, 2), 1)
    np.testing.assert_array_equal(back[0]["weights"], w)
    np.testing.assert_array_equal(back[0]["momentum"], v)
    assert back[0]["bn"] is bn
    # A fresh start has no momentum yet: it stays missing, not zeros of the wrong length.
    assert [s["momentum"] for s in regroup([{"weights": w, "momentum": None}], 2)] == [None] * 2


# -- what the mutation run (issue 17) showed unchecked ----------------------------------------------


class _Worker:
    """What ``get_worker()`` gives a PS inside Dask: only ``log_event`` is used."""

    def __init__(self):
        self.events: list[tuple[str, dict]] = []

    def log_event(self, topic, event):
        self.events.append((topic, event))


def test_metrics_events_carry_the_window_averages_and_rates(tmp_path):
    ps = _ps(tmp_path, momentum=0.0, weight_decay=0.0, metrics_interval_s=3600.0)
    worker = _Worker()
    ps._worker = worker
    g = np.zeros(6, np.float32)

    async def scenario():
        await ps.register("a")
        await ps.register("b")
        ps._window["t"] -= 1800  # half an interval ago: no event yet
        await ps.push_pull(trainer="a", grad=g, base_version=0, local_step=1, loss=1.0, images=8)
        await ps.push_pull(trainer="b", grad=g, base_version=0, local_step=1, loss=3.0, images=4)
        assert worker.events == []
        ps._window["t"] -= 1800 + 1e-3  # the interval is over at the next push
        await ps.push_pull(trainer="a", grad=g, base_version=0, local_step=2, loss=2.0, images=3)

    asyncio.run(scenario())
    [(topic, event)] = worker.events
    assert topic == "transient"
    assert event["kind"] == "metrics" and event["run"] == "r" and event["shard"] == 0
    assert event["step"] == 3 and event["updates"] == 3
    assert event["loss"] == pytest.approx(2.0)
    assert event["staleness"] == pytest.approx(1.0)  # 0, 1 and 2 versions missed
    assert event["active_workers"] == 2
    assert event["lr"] == pytest.approx(0.1 / math.sqrt(2))
    assert event["img_per_s"] == pytest.approx(15 / 3600, rel=1e-3)
    assert event["steps_per_s"] == pytest.approx(3 / 3600, rel=1e-3)
    # A fresh window after the event.
    assert ps._window["updates"] == 0 and ps._window["images"] == 0
    assert ps._window["loss"] == 0.0 and ps._window["stale"] == 0


def test_only_shard_0_posts_metrics(tmp_path):
    hparams = HParams(steps=100, metrics_interval_s=1e-9).to_dict()
    ps = ParameterServer("r", 1, 2, np.zeros(3, np.float32), np.ones(3), None, hparams, "")
    worker = _Worker()
    ps._worker = worker
    asyncio.run(
        ps.push_pull(trainer="a", grad=np.zeros(3, np.float32), base_version=0, local_step=1)
    )
    assert worker.events == []


def test_a_resumed_ps_keeps_the_counters_and_the_last_checkpoint(tmp_path):
    counters = {"accepted": {"a": 7}, "last_local": {"a": 9}, "gaps": 2, "lost_in_flight": 3}
    hparams = HParams(steps=100, weight_decay=0.5).to_dict()
    ps = ParameterServer(
        "r",
        0,
        1,
        np.ones(3, np.float32),
        np.array([1, 0, 1], np.uint8),
        None,
        hparams,
        str(tmp_path),
        version=12,
        momentum=np.full(3, 2.0),
        generation=4,
        counters=counters,
    )
    assert ps.v.dtype == np.float32 and ps.v.tolist() == [2.0, 2.0, 2.0]
    assert ps.decay.tolist() == [0.5, 0.0, 0.5] and ps.bn is None
    assert ps.decay.dtype == np.float32

    async def scenario():
        before = await ps.status()
        await ps.push_pull(
            trainer="a", grad=np.zeros(3, np.float32), base_version=12, local_step=10
        )
        return before, await ps.status(), await ps.get_state()

    before, after, state = asyncio.run(scenario())
    assert before["step"] == 12 and before["last_checkpoint"] == 12
    assert before["generation"] == 4 and before["accepted"] == {"a": 7}
    assert before["gaps"] == 2 and before["lost_in_flight"] == 3
    assert 0 <= before["uptime"] < 60
    assert after["accepted"] == {"a": 8} and after["gaps"] == 2  # local step 10 follows 9
    assert state["counters"] == {
        "accepted": {"a": 8},
        "last_local": {"a": 10},
        "gaps": 2,
        "lost_in_flight": 3,
    }
    assert state["step"] == 13 and state["bn"] is None


def test_register_counts_the_active_and_pull_marks_the_trainer_computing(tmp_path):
    ps = _ps(tmp_path)

    async def scenario():
        assert await ps.register("a") == 1
        assert await ps.register("b", local_step=4) == 2
        assert ps.last_local == {"a": 0, "b": 4}
        assert await ps.unregister("a", drained=False) is False  # it never pulled: no loss
        await ps.pull("b")
        assert ps.computing["b"] is True
        assert await ps.unregister("b") is False  # drained (the default): its gradient arrived
        assert ps.computing["b"] is False
        assert await ps.unregister("nobody", drained=False) is False
        await ps.register("c")
        await ps.pull("c")
        assert await ps.unregister("c", drained=False) is True
        assert await ps.unregister("c", drained=False) is False  # counted once
        return await ps.status()

    status = asyncio.run(scenario())
    assert status["lost_in_flight"] == 1 and status["active"] == []


def test_a_final_push_ends_the_trainer_and_a_rejoin_clears_it(tmp_path):
    ps = _ps(tmp_path)
    g = np.zeros(6, np.float32)

    async def scenario():
        await ps.register("a")
        await ps.push_pull(trainer="a", grad=g, base_version=0, local_step=1, final=True)
        assert ps.computing["a"] is False and ps.active() == []
        assert (await ps.status())["drained"] == ["a"]
        await ps.register("a", local_step=1)
        assert (await ps.status())["drained"] == []
        await ps.push_pull(trainer="a", grad=g, base_version=1, local_step=2)
        assert ps.computing["a"] is True and ps.active() == ["a"]

    asyncio.run(scenario())


def test_snapshots_hold_the_decay_mask_and_statistics_and_refuse_another_step(tmp_path):
    ps = _ps(tmp_path, weight_decay=0.01)

    async def scenario():
        await ps.push_pull(
            trainer="a",
            grad=np.ones(6, np.float32),
            base_version=0,
            local_step=1,
            bn_delta=np.array([2, 3], np.float32),
        )
        with pytest.raises(RuntimeError, match="Shard 0 holds no snapshot of step 1"):
            await ps.write_snapshot(1)  # no snapshot taken
        snap = await ps.snapshot()
        arrays = ps._snapshot["arrays"]
        with pytest.raises(RuntimeError, match="no snapshot of step 2"):
            await ps.write_snapshot(2)
        entry = await ps.write_snapshot(snap["step"])
        assert ps._snapshot is None
        return arrays, entry

    arrays, entry = asyncio.run(scenario())
    assert arrays["decay_mask"].dtype == np.uint8
    assert arrays["decay_mask"].tolist() == [1, 1, 1, 0, 0, 1]
    assert arrays["bn"].tolist() == [2.0, 3.0] and not np.shares_memory(arrays["bn"], ps.bn)
    assert entry["name"] == "shard-0.npz" and ps.last_checkpoint == 1
    ck = checkpoint.load_latest(str(tmp_path))
    assert ck is None  # a shard file alone publishes nothing
    checkpoint.write_manifest(str(tmp_path), 1, {}, [entry])
    shard = checkpoint.load_latest(str(tmp_path)).shards[0]
    assert shard["bn"].tolist() == [2.0, 3.0] and shard["decay_mask"].tolist() == [1, 1, 1, 0, 0, 1]


def test_an_older_snapshot_written_late_does_not_move_last_checkpoint_back(tmp_path):
    ps = _ps(tmp_path)
    ps.last_checkpoint = 10
    asyncio.run(ps.snapshot(align_version=4))
    asyncio.run(ps.write_snapshot(4))
    assert ps.last_checkpoint == 10


def test_the_lr_uses_the_schedule_at_the_current_version(tmp_path):
    # Warm-up of 10 steps: the first update moves by lr * 1/10, the version-5 one by lr * 6/10.
    hparams = HParams(steps=100, warmup_steps=10, momentum=0.0, weight_decay=0.0).to_dict()
    ps = ParameterServer("r", 0, 1, np.zeros(2, np.float32), np.zeros(2), None, hparams, "")
    g = np.ones(2, np.float32)
    moves = []
    for i in range(6):
        before = ps.w.copy()
        asyncio.run(ps.push_pull(trainer="a", grad=g, base_version=i, local_step=i + 1))
        moves.append(float((before - ps.w)[0]))
    np.testing.assert_allclose(moves, [0.1 * (k + 1) / 10 for k in range(6)], rtol=1e-5)


def test_a_gradient_from_a_future_version_is_not_negatively_stale(tmp_path):
    ps = _ps(tmp_path, metrics_interval_s=1e-9)
    posted = []
    ps._post = lambda kind, **f: posted.append((kind, f))  # type: ignore[method-assign]
    g = np.zeros(6, np.float32)
    asyncio.run(ps.push_pull(trainer="a", grad=g, base_version=5, local_step=1))
    assert [f["staleness"] for kind, f in posted if kind == "metrics"] == [0]


def test_rates_over_a_short_window_and_over_none(tmp_path):
    ps = _ps(tmp_path, metrics_interval_s=3600.0)
    posted = []
    ps._post = lambda kind, **f: posted.append(f)  # type: ignore[method-assign]
    g = np.zeros(6, np.float32)
    asyncio.run(ps.push_pull(trainer="a", grad=g, base_version=0, local_step=1))  # no loss given
    ps._window["images"] += 3  # the push itself added none
    ps._post_metrics(ps._window["t"] + 0.5, 0.1)
    ps._window["updates"] = 1
    ps._post_metrics(ps._window["t"], 0.1)  # a clock that did not move: no rate, no crash
    assert posted[0]["loss"] == 0.0 and posted[0]["img_per_s"] == pytest.approx(6.0)
    assert posted[0]["steps_per_s"] == pytest.approx(2.0)
    assert posted[1]["img_per_s"] == 0.0 and posted[1]["steps_per_s"] == 0.0


def test_a_ps_inside_a_worker_posts_there_and_one_outside_posts_nowhere(tmp_path, monkeypatch):
    from transient_nb.training import ps as ps_module

    g = np.zeros(6, np.float32)
    outside = _ps(tmp_path, metrics_interval_s=1e-9)
    assert outside._worker is None
    asyncio.run(outside.push_pull(trainer="a", grad=g, base_version=0, local_step=1))  # no crash
    worker = _Worker()
    monkeypatch.setattr(ps_module, "get_worker", lambda: worker)
    inside = _ps(tmp_path, metrics_interval_s=1e-9)
    asyncio.run(inside.push_pull(trainer="a", grad=g, base_version=0, local_step=1))
    assert [e["kind"] for _, e in worker.events] == ["metrics"]


def test_the_ps_owns_float32_copies_of_what_it_is_given(tmp_path):
    w = np.linspace(-1, 1, 3)  # float64
    bn = np.ones(2)
    w32, bn32 = w.astype(np.float32), bn.astype(np.float32)
    hp = HParams(steps=10, warmup_steps=0).to_dict()
    a = ParameterServer("r", 0, 2, w, np.ones(3, np.uint8), bn, hp, "", model="resnet8")
    b = ParameterServer("r", 0, 2, w32, np.ones(3, np.uint8), bn32, hp, "")
    for ps in (a, b):
        assert ps.w.dtype == ps.bn.dtype == ps.v.dtype == ps.decay.dtype == np.float32
    asyncio.run(
        b.push_pull(
            trainer="t",
            grad=np.ones(3, np.float32),
            base_version=0,
            local_step=1,
            bn_delta=np.ones(2, np.float32),
        )
    )
    np.testing.assert_array_equal(w32, np.linspace(-1, 1, 3).astype(np.float32))  # not aliased
    np.testing.assert_array_equal(bn32, np.ones(2))
    assert (a.model, a.shards, b.model, b.generation) == ("resnet8", 2, "", 0)


def test_gaps_count_every_missing_local_step_once(tmp_path):
    ps = _ps(tmp_path)
    g = np.zeros(6, np.float32)

    async def scenario():
        await ps.push_pull(trainer="a", grad=g, base_version=0, local_step=2)  # 1 never came
        await ps.push_pull(trainer="a", grad=g, base_version=1, local_step=2)  # a retried push
        await ps.push_pull(trainer="a", grad=g, base_version=2, local_step=5)  # 3 and 4 lost
        await ps.push_pull(trainer="a", grad=g, base_version=3, local_step=4)  # late: no gap
        return await ps.status()

    status = asyncio.run(scenario())
    assert status["gaps"] == 3 and ps.last_local == {"a": 5}
    assert status["active"] == ["a"]  # a push registers its trainer


def test_staleness_with_a_base_version_that_is_not_zero(tmp_path):
    ps = _ps(tmp_path, metrics_interval_s=1e-9)
    posted = []
    ps._post = lambda kind, **f: posted.append(f)  # type: ignore[method-assign]
    g = np.zeros(6, np.float32)
    for i in range(3):
        asyncio.run(ps.push_pull(trainer="a", grad=g, base_version=i, local_step=i + 1))
    asyncio.run(ps.push_pull(trainer="b", grad=g, base_version=2, local_step=1))
    assert [f["staleness"] for f in posted] == [0, 0, 0, 1]


def test_two_lost_trainers_are_two_lost_gradients(tmp_path):
    ps = _ps(tmp_path)

    async def scenario():
        for t in ("a", "b"):
            await ps.register(t)
            await ps.pull(t)
        await ps.unregister("a", drained=False)
        await ps.unregister("b", drained=False)
        return await ps.status()

    assert asyncio.run(scenario())["lost_in_flight"] == 2


def test_a_snapshot_is_written_once_and_a_ps_without_statistics_snapshots_none(tmp_path):
    hp = HParams(steps=10).to_dict()
    ps = ParameterServer("r", 0, 1, np.ones(3, np.float32), np.ones(3), None, hp, str(tmp_path))

    async def scenario():
        snap = await ps.snapshot()
        assert ps._snapshot["arrays"]["bn"] is None
        await ps.write_snapshot(snap["step"])
        with pytest.raises(RuntimeError, match="holds no snapshot of step 0"):
            await ps.write_snapshot(snap["step"])

    asyncio.run(scenario())


def test_active_includes_a_trainer_seen_exactly_one_lease_ago(tmp_path, monkeypatch):
    ps = _ps(tmp_path, call_timeout_s=30.0)
    ps.registered = {"a", "b"}
    ps.last_seen = {"a": 970.0, "b": 969.5}
    monkeypatch.setattr(time, "monotonic", lambda: 1000.0)
    assert ps.active() == ["a"]


def test_metrics_are_posted_once_exactly_one_interval_has_passed(tmp_path, monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(time, "time", lambda: clock[0])
    ps = _ps(tmp_path, metrics_interval_s=5.0)
    posted = []
    ps._post = lambda kind, **f: posted.append(f)  # type: ignore[method-assign]
    g = np.zeros(6, np.float32)
    clock[0] = 1004.5
    asyncio.run(ps.push_pull(trainer="a", grad=g, base_version=0, local_step=1))
    assert posted == []
    clock[0] = 1005.0
    asyncio.run(ps.push_pull(trainer="a", grad=g, base_version=1, local_step=2))
    assert [f["updates"] for f in posted] == [2]


# -- paced emulation of the paper's PS capacity (transient_nb.training.emulation) ---------------------------


@pytest.mark.parametrize(("shards", "cap"), [(1, 50.0), (2, 50.0 * 1.75)])
def test_an_emulated_ps_serves_at_most_its_capacity(tmp_path, shards, cap):
    hparams = HParams(steps=1000, warmup_steps=0, emulate="ps=50").to_dict()
    w = np.zeros(6, np.float32)
    ps = ParameterServer("r", 0, shards, w, np.ones(6, np.uint8), None, hparams, str(tmp_path))
    g = np.zeros(6, np.float32)

    async def pusher(name):
        for i in range(15):
            await ps.push_pull(trainer=name, grad=g, base_version=ps.version, local_step=i + 1)

    async def main():
        t0 = time.monotonic()
        await asyncio.gather(*(pusher(f"t{i}") for i in range(4)))
        return time.monotonic() - t0

    rate = 60 / asyncio.run(main())
    assert cap * 0.8 <= rate <= cap * 1.02  # four eager trainers meet the cap, never pass it
    assert ps.version == 60


def test_a_ps_without_an_emulated_capacity_is_not_paced(tmp_path):
    ps = _ps(tmp_path, emulate="k80=4.56")  # workers paced, the PS not
    g = np.zeros(6, np.float32)
    t0 = time.monotonic()
    for i in range(50):
        asyncio.run(ps.push_pull(trainer="t", grad=g, base_version=i, local_step=i + 1))
    assert ps._service is None and time.monotonic() - t0 < 1.0


def _push_200(ps: ParameterServer) -> None:
    """200 pushes as fast as this host makes them (a pause every 20 lets the PS's timers run)."""
    g = np.zeros(6, np.float32)

    async def main():
        for i in range(200):
            await ps.push_pull(trainer="t", grad=g, base_version=i, local_step=i + 1)
            if i % 20 == 0:
                await asyncio.sleep(0.01)

    asyncio.run(main())


def test_a_ps_slower_than_its_emulated_capacity_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr("transient_nb.training.emulation.BEHIND_WINDOW_S", 0.05)
    ps = _ps(tmp_path, emulate="ps=1000000")  # 1 us a push: no host serves that
    posted = []
    monkeypatch.setattr(ps, "_post", lambda kind, **f: posted.append({"kind": kind, **f}))
    _push_200(ps)
    behind = [e for e in posted if e["kind"] == "emulation-behind"]
    assert behind and behind[0]["role"] == "ps" and behind[0]["achieved_steps_per_s"] < 1e6
    assert next(e for e in posted if e["kind"] == "emulation-paced")["steps_per_s"] == 1e6


class _PSWorker:
    """The worker a PS runs on, as far as its paced emulation reads it: a name, and the
    scheduler's event log (whose ``started`` event holds the cluster's time scale)."""

    name = "ps-host-0"

    def __init__(self, time_scale):
        self.time_scale = time_scale
        self.asked = 0
        self.scheduler = self

    async def transient_events(self, since, limit):
        self.asked += 1
        await asyncio.sleep(0.01)  # a round trip: concurrent first pushes all wait on it
        return [{"kind": "requested"}, {"kind": "started", "time_scale": self.time_scale}]


def _paced_ps(tmp_path, monkeypatch, emulate, shards=1, step_scale=1.0, time_scale=4.0):
    monkeypatch.delenv("TRANSIENT_NB_TIME_SCALE", raising=False)
    hparams = HParams(
        steps=1000, warmup_steps=0, emulate=emulate, emulate_step_scale=step_scale
    ).to_dict()
    ps = ParameterServer(
        "r", 0, shards, np.zeros(6, np.float32), np.ones(6, np.uint8), None, hparams, str(tmp_path)
    )
    worker = _PSWorker(time_scale)
    ps._worker = worker
    posted: list = []
    monkeypatch.setattr(ps, "_post", lambda kind, **f: posted.append({"kind": kind, **f}))
    return ps, worker, posted


def test_an_emulated_ps_reads_the_clusters_time_scale_once_and_says_how_it_is_paced(
    tmp_path, monkeypatch
):
    ps, worker, posted = _paced_ps(tmp_path, monkeypatch, "ps=50", shards=2, step_scale=3.0)
    g = np.zeros(6, np.float32)

    async def two_first_pushes():
        await asyncio.gather(
            ps.push_pull(trainer="a", grad=g, base_version=0, local_step=1),
            ps.push_pull(trainer="b", grad=g, base_version=0, local_step=1),
        )
        await ps.push_pull(trainer="a", grad=g, base_version=2, local_step=2)

    asyncio.run(two_first_pushes())
    # One shard of two at 50 steps/s: t(1) = 0.02 s, b = 2 (t1 - t1 / 1.75), a = t1 - b;
    # each push stands for 3 emulated steps, and the cluster runs 4x faster than real time.
    t1 = 0.02
    b = 2 * (t1 - t1 / 1.75)
    service_s = (t1 - b + b / 2) * 3.0 / 4.0
    assert ps._service is not None and ps._service.service_s == pytest.approx(service_s)
    # Both first pushes waited on the time scale; the pacer and its event are made once.
    assert worker.asked == 2 and ps.version == 3
    (paced,) = [e for e in posted if e["kind"] == "emulation-paced"]
    assert paced == {
        "kind": "emulation-paced",
        "worker": "ps-host-0",
        "role": "ps",
        "steps_per_s": pytest.approx(1.0 / (service_s * 4.0 / 3.0)),
        "wall_steps_per_s": pytest.approx(1.0 / service_s),
        "time_scale": 4.0,
        "step_scale": 3.0,
    }


def test_a_ps_without_an_emulated_capacity_never_asks_for_the_time_scale(tmp_path, monkeypatch):
    ps, worker, posted = _paced_ps(tmp_path, monkeypatch, "k80=4.56")
    g = np.zeros(6, np.float32)
    for i in range(3):
        asyncio.run(ps.push_pull(trainer="t", grad=g, base_version=i, local_step=i + 1))
    assert worker.asked == 0 and ps._service is None and posted == []


def test_a_ps_behind_its_capacity_names_its_host_and_what_it_achieved(tmp_path, monkeypatch):
    monkeypatch.setattr("transient_nb.training.emulation.BEHIND_WINDOW_S", 0.05)
    ps, _, posted = _paced_ps(tmp_path, monkeypatch, "ps=1000000", time_scale=1.0)
    _push_200(ps)
    behind = [e for e in posted if e["kind"] == "emulation-behind"]
    assert behind and behind[0]["worker"] == "ps-host-0" and behind[0]["role"] == "ps"
    # A push's own work, measured: well under 10 ms here, far above a microsecond.
    assert 100 < behind[0]["achieved_steps_per_s"] < 1e6


def test_a_ps_that_keeps_up_with_its_capacity_never_says_it_is_behind(tmp_path, monkeypatch):
    monkeypatch.setattr("transient_nb.training.emulation.BEHIND_WINDOW_S", 0.02)
    monkeypatch.setenv("TRANSIENT_NB_TIME_SCALE", "1")
    hparams = HParams(steps=1000, warmup_steps=0, emulate="ps=100").to_dict()
    w = np.zeros(6, np.float32)
    ps = ParameterServer("r", 0, 1, w, np.ones(6, np.uint8), None, hparams, str(tmp_path))
    posted: list = []
    monkeypatch.setattr(ps, "_post", lambda kind, **f: posted.append({"kind": kind, **f}))
    g = np.zeros(6, np.float32)

    async def main():
        for i in range(20):  # 10 ms a push: the real work is a few microseconds of it
            await ps.push_pull(trainer="t", grad=g, base_version=i, local_step=i + 1)

    asyncio.run(main())
    assert [e["kind"] for e in posted if e["kind"].startswith("emulation")] == ["emulation-paced"]
    assert posted[0]["worker"] == "ps"  # no worker: the PS names itself


# -- a user's torch optimizer on the PS ------------------------------------------------------------
def _adamw_ps(tmp_path, shard=0, shards=1, weights=None, opt_state=None):
    import functools

    import cloudpickle

    hparams = HParams(steps=100, warmup_steps=0).to_dict()
    w = np.linspace(-1, 1, 6).astype(np.float32) if weights is None else weights
    factory = cloudpickle.dumps(functools.partial(torch.optim.AdamW, lr=0.01))
    return ParameterServer(
        "r",
        shard,
        shards,
        w,
        np.ones(len(w), np.uint8),
        None,
        hparams,
        str(tmp_path),
        optimizer=factory,
        opt_state=opt_state,
        parameters=6,
    )


def test_a_users_optimizer_updates_the_shard_with_the_lr_of_the_active_workers(tmp_path):
    ps = _adamw_ps(tmp_path)
    ref = torch.nn.Parameter(torch.tensor(ps.w.copy()))
    opt = torch.optim.AdamW([ref], lr=0.01)
    rng = np.random.default_rng(3)

    async def scenario():
        for t in ("a", "b", "c", "d"):
            await ps.register(t)
        for i in range(5):
            g = rng.normal(size=6).astype(np.float32)
            await ps.push_pull(trainer="a", grad=g, base_version=i, local_step=i + 1)
            opt.param_groups[0]["lr"] = 0.01 / 2  # four active trainers: lr / sqrt(4)
            ref.grad = torch.tensor(g)
            opt.step()

    asyncio.run(scenario())
    assert np.array_equal(ps.w, ref.detach().numpy())
    assert ps.opt is not None and ps.opt.lr == 0.005 and ps.v.size == 0  # no momentum kept


def test_its_state_is_in_the_snapshot_and_a_recovered_ps_goes_on_from_it(tmp_path):
    ps = _adamw_ps(tmp_path)
    rng = np.random.default_rng(4)
    grads = [rng.normal(size=6).astype(np.float32) for _ in range(6)]

    async def push(server, gs, start):
        for i, g in enumerate(gs):
            await server.push_pull(
                trainer="a", grad=g, base_version=start + i, local_step=start + i + 1
            )

    asyncio.run(push(ps, grads[:3], 0))
    asyncio.run(ps.snapshot())
    entry = asyncio.run(ps.write_snapshot(3))
    checkpoint.write_manifest(str(tmp_path), 3, {"model": "m"}, [entry])
    ck = checkpoint.load_latest(str(tmp_path))
    assert ck is not None and "momentum" not in ck.shards[0]
    assert {"opt.exp_avg", "opt.exp_avg_sq", "opt.step", "opt_meta"} <= set(ck.shards[0])
    from transient_nb.training.optim import optimizer_state

    again = _adamw_ps(
        tmp_path, weights=ck.shards[0]["weights"], opt_state=optimizer_state(ck.shards[0])
    )
    asyncio.run(push(ps, grads[3:], 3))
    asyncio.run(push(again, grads[3:], 3))
    assert np.array_equal(again.w, ps.w)  # the same trajectory: the state came back whole


def test_regroup_cuts_a_users_optimizer_state_with_the_weights():
    from transient_nb.training.optim import META_KEY

    meta = np.frombuffer(b'{"groups": [], "base_lrs": [0.1], "scalars": {}}', np.uint8)
    old = [
        {
            "weights": np.arange(3.0),
            "momentum": None,
            "bn": None,
            "opt": {"opt.exp_avg": np.arange(3.0), "opt.step": np.array(7.0), META_KEY: meta},
        },
        {
            "weights": np.arange(3.0, 5.0),
            "momentum": None,
            "bn": None,
            "opt": {"opt.exp_avg": np.arange(3.0, 5.0), "opt.step": np.array(7.0), META_KEY: meta},
        },
    ]
    new = regroup(old, 3)
    assert [s["opt"]["opt.exp_avg"].tolist() for s in new] == [[0.0, 1.0], [2.0], [3.0, 4.0]]
    assert all(float(s["opt"]["opt.step"]) == 7.0 for s in new)
    assert all(bytes(s["opt"][META_KEY]) == bytes(meta) for s in new)
    assert all(s["opt"] is None for s in regroup([{**o, "opt": None} for o in old], 2))
