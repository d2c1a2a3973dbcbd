"""The PS's update rule: one function, in place, for the PS and the benchmarks' peer."""

from __future__ import annotations

import numpy as np

from transient_nb.training.optim import momentum_sgd_


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
