"""The parameter server's arithmetic and bookkeeping, without Dask (its methods are coroutines)."""

from __future__ import annotations

import asyncio
import itertools

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
        asyncio.run(ps.push_pull("t", g, base_version=i, local_step=i + 1))
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
        await ps.push_pull("a", g, base_version=0, local_step=1)
        await ps.push_pull("b", g, base_version=0, local_step=1)  # stale by one update
        await ps.push_pull("a", g, base_version=1, local_step=3)  # local step 2 never arrived
        # b is killed while computing, a leaves after its final push.
        assert await ps.unregister("b", drained=False) is True
        await ps.push_pull("a", g, base_version=3, local_step=4, final=True)
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
        await ps.push_pull("a", g, base_version=0, local_step=501)
        return await ps.status()

    assert asyncio.run(scenario())["gaps"] == 0


def test_lr_is_divided_by_sqrt_of_active_workers(tmp_path):
    ps = _ps(tmp_path, momentum=0.0, weight_decay=0.0)
    g = np.ones(6, np.float32)

    async def scenario():
        for name in "abcd":
            await ps.register(name)
        before = ps.w.copy()
        await ps.push_pull("a", g, base_version=0, local_step=1)
        return before - ps.w

    np.testing.assert_allclose(asyncio.run(scenario()), 0.1 / 2, rtol=1e-6)


def test_checkpoints_at_boundaries_are_complete(tmp_path):
    ps = _ps(tmp_path)
    g = np.ones(6, np.float32)

    async def scenario():
        for i in range(5):
            await ps.push_pull("a", g, base_version=i, local_step=i + 1)
        await ps._ckpt_task

    asyncio.run(scenario())
    state = checkpoint.load(str(tmp_path), 0)
    assert state["step"] == 5
    assert set(state) >= {"weights", "momentum", "bn", "hparams", "step", "format", "model", "run"}
    np.testing.assert_array_equal(state["weights"], ps.w)


def test_float16_wire(tmp_path):
    ps = _ps(tmp_path, wire_dtype="float16")
    w, _, _ = asyncio.run(ps.pull())
    assert w.dtype == np.float16


@pytest.mark.parametrize("n, shards", [(10, 1), (10, 3), (466_906, 2)])
def test_shard_bounds_cover_the_vector(n, shards):
    bounds = shard_bounds(n, shards)
    assert bounds[0][0] == 0 and bounds[-1][1] == n
    assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds))
    assert max(b - a for a, b in bounds) - min(b - a for a, b in bounds) <= 1
