from __future__ import annotations

import os

import numpy as np
import pytest

from transient_nb.training import checkpoint


def _state(shard=0, step=7):
    return {
        "format": checkpoint.FORMAT,
        "shard": shard,
        "step": step,
        "weights": np.arange(10, dtype=np.float32),
        "momentum": np.ones(10, dtype=np.float32),
        "bn": None,
        "hparams": {"lr": 0.1},
        "model": "resnet8",
    }


@pytest.mark.parametrize("scheme", ["local", "memory"])
def test_round_trip_and_atomic_names(tmp_path, scheme):
    url = str(tmp_path / "ckpt") if scheme == "local" else "memory://ckpt-test"
    path = checkpoint.save(url, _state(shard=1, step=42))
    assert path.endswith("ps-shard1.pt")
    loaded = checkpoint.load(url, 1)
    assert loaded is not None and loaded["step"] == 42
    np.testing.assert_array_equal(loaded["weights"], np.arange(10, dtype=np.float32))
    assert checkpoint.load(url, 0) is None
    if scheme == "local":
        # Written under a temporary name and renamed: no leftovers.
        assert sorted(os.listdir(tmp_path / "ckpt")) == ["ps-shard1.pt"]


def test_newer_checkpoint_replaces_older(tmp_path):
    url = str(tmp_path)
    checkpoint.save(url, _state(step=1))
    checkpoint.save(url, _state(step=2))
    assert checkpoint.load(url, 0)["step"] == 2


def test_unknown_format_is_refused(tmp_path):
    state = _state()
    state["format"] = 999
    checkpoint.save(str(tmp_path), state)
    with pytest.raises(ValueError, match="format 999"):
        checkpoint.load(str(tmp_path), 0)
