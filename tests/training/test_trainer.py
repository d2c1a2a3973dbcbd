from __future__ import annotations

import numpy as np
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
