"""The PS's update rule: one function, in place, for the PS and the benchmarks' peer."""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest
import torch

from transient_nb.training.optim import ShardOptimizer, lr_scale, momentum_sgd_


def _reference(w, v, grad, decay, lr, momentum):
    """TF-style momentum SGD with per-entry L2, written out in float64."""
    v = momentum * v + (grad.astype(np.float64) + decay * w)
    return w - lr * v, v


def test_one_step_matches_the_written_out_rule_in_place():
    rng = np.random.default_rng(0)
    w = rng.standard_normal(1000).astype(np.float32)
    v = rng.standard_normal(1000).astype(np.float32)
    grad = rng.standard_normal(1000).astype(np.float32)
    decay = np.where(rng.random(1000) < 0.5, 5e-4, 0.0).astype(np.float32)
    want_w, want_v = _reference(w.astype(np.float64), v.astype(np.float64), grad, decay, 0.1, 0.9)
    w_buf, v_buf = w.ctypes.data, v.ctypes.data
    momentum_sgd_(w, v, grad, decay, 0.1, 0.9)
    np.testing.assert_allclose(v, want_v, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(w, want_w, rtol=1e-5, atol=1e-6)
    assert (w.ctypes.data, v.ctypes.data) == (w_buf, v_buf)  # no new arrays
    assert w.dtype == v.dtype == np.float32


def test_a_float16_gradient_from_the_wire_is_widened_and_decay_skips_its_zeros():
    w = np.full(4, 2.0, np.float32)
    v = np.zeros(4, np.float32)
    grad = np.array([1.0, 0.5, -0.25, 0.0], np.float16)
    decay = np.array([0.5, 0.0, 0.0, 0.5], np.float32)
    momentum_sgd_(w, v, grad, decay, lr=1.0, momentum=0.9)
    # v = g + decay * w; w -= v
    np.testing.assert_array_equal(v, [2.0, 0.5, -0.25, 1.0])
    np.testing.assert_array_equal(w, [0.0, 1.5, 2.25, 1.0])
    momentum_sgd_(w, v, np.zeros(4, np.float16), np.zeros(4, np.float32), lr=0.5, momentum=0.5)
    np.testing.assert_array_equal(v, [1.0, 0.25, -0.125, 0.5])  # momentum carries it on
    np.testing.assert_array_equal(w, [-0.5, 1.375, 2.3125, 0.75])


def test_a_bfloat16_gradient_is_widened_in_a_buffer_each_thread_keeps():
    import threading

    import torch

    from transient_nb.training import optim

    def step(out):
        w, v = np.full(3, 2.0, np.float32), np.zeros(3, np.float32)
        g = torch.tensor([1.0, -0.5, 0.25], dtype=torch.bfloat16)
        momentum_sgd_(w, v, g, np.zeros(3, np.float32), lr=1.0, momentum=0.9)
        out.append((w.tolist(), optim._scratch.buf.data_ptr()))

    here: list = []
    step(here)
    step(here)
    assert here[0][0] == [1.0, 2.5, 1.75]
    assert here[0][1] == here[1][1]  # the same buffer, call after call
    other: list = []
    thread = threading.Thread(target=step, args=(other,))
    thread.start()
    thread.join()
    assert other[0][0] == [1.0, 2.5, 1.75] and other[0][1] != here[0][1]  # one per thread


# -- a user's torch optimizer over a shard ---------------------------------------------------------


def test_a_shard_optimizer_steps_exactly_as_torch_does_on_its_slice():
    """AdamW over the shard's numpy weights, in place, equals AdamW on a Parameter bit for bit."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal(50).astype(np.float32)
    ref = torch.nn.Parameter(torch.tensor(w))
    factory = functools.partial(torch.optim.AdamW, lr=1e-2, weight_decay=0.05)
    ours, theirs = ShardOptimizer(factory, w), factory([ref])
    address = w.ctypes.data
    for _ in range(7):
        g = rng.standard_normal(50).astype(np.float32)
        ours.step(g)
        ref.grad = torch.tensor(g)
        theirs.step()
    assert np.array_equal(w, ref.detach().numpy()) and w.ctypes.data == address


def test_the_learning_rate_follows_the_active_workers():
    assert lr_scale(1) == 1.0 and lr_scale(4) == 0.5 and lr_scale(9, False) == 1.0
    w = np.zeros(3, np.float32)
    opt = ShardOptimizer(functools.partial(torch.optim.SGD, lr=0.8), w)
    opt.step(np.ones(3, np.float32), scale=lr_scale(4))
    assert opt.lr == 0.4 and w.tolist() == pytest.approx([-0.4] * 3)
    opt.step(np.ones(3, np.float16), scale=1.0)  # a float16 gradient from the wire
    assert opt.lr == 0.8 and w.tolist() == pytest.approx([-1.2] * 3)
    assert opt.base_lrs == [0.8]  # the factory's own, never the scaled one


def test_its_state_goes_out_as_arrays_and_json_and_resumes_the_same_trajectory():
    rng = np.random.default_rng(2)
    grads = [rng.standard_normal(20).astype(np.float32) for _ in range(10)]
    factory = functools.partial(torch.optim.Adam, lr=3e-3, betas=(0.8, 0.95))
    straight = np.ones(20, np.float32)
    a = ShardOptimizer(factory, straight)
    for g in grads:
        a.step(g, scale=0.5)
    resumed = np.ones(20, np.float32)
    b = ShardOptimizer(factory, resumed)
    for g in grads[:4]:
        b.step(g, scale=0.5)
    state = b.state_arrays()
    assert sorted(state) == ["opt.exp_avg", "opt.exp_avg_sq", "opt.step", "opt_meta"]
    assert all(isinstance(v, np.ndarray) and v.dtype != object for v in state.values())
    meta = json.loads(bytes(state["opt_meta"]).decode())
    assert meta["base_lrs"] == [3e-3] and meta["groups"][0]["betas"] == [0.8, 0.95]
    # A new optimizer (a PS re-created from the checkpoint) goes on exactly where b was.
    c = ShardOptimizer(factory, resumed.copy(), state)
    for g in grads[4:]:
        c.step(g, scale=0.5)
    assert np.array_equal(c.param.numpy(), straight)
    assert c.opt.param_groups[0]["betas"] == (0.8, 0.95)


def test_an_optimizer_without_a_learning_rate_or_not_an_optimizer_is_refused():
    with pytest.raises(TypeError, match=r"returned a list, not a torch\.optim\.Optimizer"):
        ShardOptimizer(lambda params: list(params), np.zeros(2, np.float32))
