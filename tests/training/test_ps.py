"""The parameter server's arithmetic and bookkeeping, without Dask (its methods are coroutines)."""

from __future__ import annotations

import asyncio
import itertools
import pickle

import numpy as np
import pytest
import torch

from transient_nb.training import checkpoint
from transient_nb.training.hparams import HParams
from transient_nb.training.ps import ParameterServer, shard_bounds


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
