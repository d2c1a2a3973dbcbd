"""Wire dtypes: fresh copies in float32, float16 and bfloat16 (as int16 bits), read back by torch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from transient_nb.training.wire.codec import as_numpy, from_wire, tensor, to_wire


@pytest.mark.parametrize("wire", ["float32", "float16", "bfloat16"])
def test_to_wire_is_a_fresh_copy_that_reads_back_within_the_dtype_precision(wire):
    w = np.array([1.0, -2.5, 3e-6, 1e4], np.float32)
    out = to_wire(w, wire)
    assert not np.shares_memory(out, w)
    back = tensor(from_wire(out, wire)).float().numpy()
    rel = {"float32": 0, "float16": 1e-3, "bfloat16": 8e-3}[wire]
    big = np.abs(w) > 1e-3
    np.testing.assert_allclose(back[big], w[big], rtol=rel)
    w[0] = 9.0  # the copy does not follow the live weights
    assert tensor(from_wire(out, wire)).float()[0].item() == 1.0


def test_bfloat16_keeps_float32_range_where_float16_flushes_and_overflows():
    x = np.array([1e-9, 3e-6, 1e5], np.float32)  # tiny gradient entries, a large weight
    f16 = tensor(from_wire(to_wire(x, "float16"), "float16")).float().numpy()
    assert f16[0] == 0.0 and np.isinf(f16[2])
    bf = tensor(from_wire(to_wire(x, "bfloat16"), "bfloat16")).float().numpy()
    np.testing.assert_allclose(bf, x, rtol=8e-3)


def test_bfloat16_travels_as_int16_bits_and_only_those_are_reinterpreted():
    t = torch.tensor([1.0, -2.0], dtype=torch.bfloat16)
    bits = as_numpy(t)
    assert bits.dtype == np.int16 and np.shares_memory(bits, t.view(torch.int16).numpy())
    assert from_wire(bits, "bfloat16").dtype == torch.bfloat16
    f16 = np.ones(2, np.float16)
    assert from_wire(f16, "bfloat16") is f16  # not int16: left as it is
    assert from_wire(bits, "float16") is bits


def test_a_read_only_frame_becomes_a_tensor_without_a_warning():
    a = np.arange(3, dtype=np.float32)
    a.setflags(write=False)
    assert tensor(a).tolist() == [0.0, 1.0, 2.0]
    t = torch.ones(2)
    assert tensor(t) is t
