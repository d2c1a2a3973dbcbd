"""The model laid flat: one buffer the parameters view, its gradient, statistics and wire copies
(``transient_nb.training.flat``), and the trainer's get/set helpers over it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from transient_nb.training.models import build_model
from transient_nb.training.trainer import decay_mask, flat_layout, get_flat, set_flat


def test_flat_round_trip_and_decay_mask():
    model = build_model("resnet8")
    params, buffers = flat_layout(model)
    flat = get_flat(params)
    assert flat.shape == (sum(p.numel() for p in params),)
    set_flat(params, np.arange(len(flat), dtype=np.float32))
    np.testing.assert_array_equal(get_flat(params), np.arange(len(flat), dtype=np.float32))
    # Weight decay on conv and dense weights only, not on biases or batch-norm parameters.
    mask = decay_mask(model)
    expected = sum(p.numel() for p in params if p.dim() > 1)
    assert mask.sum() == expected and 0 < expected < len(flat)
    # Batch-norm running statistics travel, the integer counters do not.
    assert all(b.dtype.is_floating_point for b in buffers)
    assert len(buffers) == 2 * sum(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())


def test_flat_model_views_share_memory_and_backward_fills_the_flat_gradient():
    from transient_nb.training.flat import FlatModel

    torch.manual_seed(0)
    model = build_model("resnet8", num_classes=10)
    reference = build_model("resnet8", num_classes=10)
    reference.load_state_dict(model.state_dict())
    flat = FlatModel(model, "float16")
    params, _ = flat_layout(model)
    storage = flat.w.untyped_storage().data_ptr()
    assert all(p.untyped_storage().data_ptr() == storage for p in params)
    assert all(
        p.grad.untyped_storage().data_ptr() == flat.g.untyped_storage().data_ptr() for p in params
    )
    x, y = torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 3])
    for net in (model, reference):
        net.train()
        net.zero_grad(set_to_none=False)
    flat.mark_statistics()
    ref_params, ref_buffers = flat_layout(reference)
    stats_before = get_flat(ref_buffers)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    torch.nn.functional.cross_entropy(reference(x), y).backward()
    grad, bn_delta = flat.grads()
    expected = get_flat([p.grad for p in ref_params])
    assert grad.dtype == np.float16
    np.testing.assert_allclose(grad.astype(np.float32), expected, rtol=1e-2, atol=1e-4)
    np.testing.assert_allclose(bn_delta, get_flat(ref_buffers) - stats_before, atol=1e-6)
    assert np.abs(bn_delta).max() > 0
    # Two host slots in turn: the previous step's gradient is not overwritten by this one.
    second, _ = flat.grads()
    assert not np.shares_memory(grad, second)
    third, _ = flat.grads()
    assert np.shares_memory(grad, third)
    # New weights land in the model's own parameters, from float16 or float32 pieces.
    n = len(flat.w)
    flat.load(
        [np.ones(n // 2, np.float16), np.full(n - n // 2, 2.0, np.float32)],
        [(0, n // 2), (n // 2, n)],
    )
    np.testing.assert_array_equal(
        get_flat(params), np.r_[np.ones(n // 2), np.full(n - n // 2, 2.0)]
    )


def test_flat_model_keeps_the_values_and_loads_statistics_and_weights():
    from transient_nb.training.flat import FlatModel

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    with torch.no_grad():
        net[1].running_mean.fill_(0.5)
        net[1].running_var.fill_(2.0)
    params, buffers = flat_layout(net)
    before_w, before_b = get_flat(params), get_flat(buffers)
    flat = FlatModel(net)  # float32 wire by default
    np.testing.assert_array_equal(flat.weights(), before_w)  # the values are kept
    np.testing.assert_array_equal(flat.b.numpy(), before_b)
    assert flat.g.abs().sum() == 0  # gradients start at zero
    w = flat.weights()
    w[0] = 99.0
    assert float(flat.w[0]) != 99.0  # weights() is a copy
    # Statistics: the change since mark_statistics, in float32; new ones land in the buffers.
    flat.mark_statistics()
    net.train()
    net(torch.randn(8, 3))
    grad, delta = flat.grads()
    assert grad.dtype == np.float32 and grad.shape == (len(before_w),)
    np.testing.assert_allclose(delta, get_flat(buffers) - before_b, atol=1e-6)
    assert np.abs(delta).max() > 0
    flat.load([np.zeros(len(before_w), np.float32)], [(0, len(before_w))], bn=np.arange(4.0))
    np.testing.assert_array_equal(get_flat(buffers), [0.0, 1.0, 2.0, 3.0])
    np.testing.assert_array_equal(get_flat(params), np.zeros(len(before_w)))
    flat.load([np.ones(len(before_w), np.float32)], [(0, len(before_w))])  # bn=None: kept
    np.testing.assert_array_equal(get_flat(buffers), [0.0, 1.0, 2.0, 3.0])
    with pytest.raises(ValueError):  # as many pieces as bounds
        flat.load([np.ones(2, np.float32)], [(0, 2), (2, len(before_w))])


def test_flat_model_without_statistics_has_no_delta_and_ignores_given_ones():
    from transient_nb.training.flat import FlatModel

    net = torch.nn.Linear(3, 2)
    flat = FlatModel(net, "float16", slots=3)
    n = len(flat.w)
    flat.load([np.arange(n, dtype=np.float32)], [(0, n)], bn=np.ones(2, np.float32))
    np.testing.assert_array_equal(net.bias.detach().numpy(), [6.0, 7.0])
    flat.mark_statistics()
    slots = [flat.grads() for _ in range(4)]
    assert all(bn is None for _, bn in slots)
    assert all(g.dtype == np.float16 for g, _ in slots)
    # Three slots in turn: the fourth call reuses the first one's buffer, not before.
    assert not np.shares_memory(slots[0][0], slots[1][0])
    assert not np.shares_memory(slots[0][0], slots[2][0])
    assert np.shares_memory(slots[0][0], slots[3][0])


def test_flat_layout_skips_frozen_parameters_and_integer_buffers():
    net = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    net[0].bias.requires_grad_(False)
    params, buffers = flat_layout(net)
    assert [p.shape for p in params] == [(2, 3), (2,), (2,)]  # weight, bn weight, bn bias
    assert len(buffers) == 2 and all(b.dtype == torch.float32 for b in buffers)


def test_flat_load_reads_read_only_replies_without_a_warning():
    from transient_nb.training.flat import FlatModel

    flat = FlatModel(torch.nn.Linear(2, 1))
    piece = np.ones(3, np.float32)
    piece.flags.writeable = False  # as replies arrive: views of received frames
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        flat.load([piece], [(0, 3)])
    np.testing.assert_array_equal(flat.weights(), np.ones(3))


def test_set_flat_takes_any_float_vector_and_an_empty_layout():
    t = [torch.zeros(2, 2), torch.zeros(3)]
    set_flat(t, np.arange(7, dtype=np.float64))
    assert t[0].dtype == torch.float32
    assert t[0].tolist() == [[0, 1], [2, 3]] and t[1].tolist() == [4, 5, 6]
    set_flat([], np.zeros(0))  # nothing to copy into
    assert get_flat([]).shape == (0,) and get_flat([]).dtype == np.float32


def test_the_decay_mask_is_one_byte_an_entry_and_set_flat_fills_a_single_tensor():
    """The mask travels to every PS shard when the run starts: one byte an entry, not eight."""
    model = build_model("resnet8")
    mask = decay_mask(model)
    assert mask.dtype == np.uint8 and set(np.unique(mask).tolist()) == {0, 1}
    only = [torch.zeros(2, 3)]
    set_flat(only, np.arange(6, dtype=np.float32))
    assert only[0].tolist() == [[0, 1, 2], [3, 4, 5]]


def test_a_bfloat16_wire_hands_out_its_bits_and_loads_them_back_as_numbers():
    from transient_nb.training.flat import FlatModel

    net = torch.nn.Linear(3, 2)
    flat = FlatModel(net, "bfloat16")
    net(torch.ones(1, 3)).sum().backward()
    grad, _ = flat.grads()
    assert grad.dtype == np.int16  # numpy has no bfloat16: its bits travel
    back = torch.from_numpy(grad).view(torch.bfloat16).float()
    torch.testing.assert_close(back, flat.g, rtol=8e-3, atol=0)
    bits = torch.tensor([1.5, -2.0, 0.25, 3.0, 8.0, 1e-6], dtype=torch.bfloat16)
    flat.load([bits.view(torch.int16).numpy()], [(0, 6)])
    torch.testing.assert_close(net.weight.detach().reshape(-1), bits.float())
