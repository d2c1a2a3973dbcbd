"""Tests for transient_nb.training.batches: augmentation, standardisation, sharded streams."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from transient_nb.training.batches import BatchStream, to_tensor
from transient_nb.training.data import ArrayDataset, load_dataset

torch.set_num_threads(1)


def _indexed_dataset(n: int = 60, pad: int = 1, flip: bool = False) -> ArrayDataset:
    """Random images whose label is their index, so batches reveal what was drawn."""
    images = np.random.default_rng(7).integers(0, 256, size=(n, 8, 8, 3), dtype=np.uint8)
    return ArrayDataset(images, np.arange(n, dtype=np.int64), "indexed", n, pad, flip)


def test_batch_shapes_dtypes_and_standardisation() -> None:
    ds = load_dataset("synthetic:200", train=True)
    x, y = next(BatchStream(ds, 16, seed=0))
    assert x.shape == (16, 3, 32, 32) and x.dtype == torch.float32
    assert y.shape == (16,) and y.dtype == torch.int64
    torch.testing.assert_close(x.mean(dim=(1, 2, 3)), torch.zeros(16), atol=1e-5, rtol=0)
    std = x.std(dim=(1, 2, 3), correction=0)
    torch.testing.assert_close(std, torch.ones(16), atol=1e-4, rtol=0)


def test_to_tensor_matches_tensorflow_per_image_standardization() -> None:
    images = np.random.default_rng(0).integers(0, 256, size=(3, 8, 8, 3), dtype=np.uint8)
    images[1] = 42  # constant image: the std floor avoids dividing by zero
    x = to_tensor(images)
    flat = images.reshape(3, -1).astype(np.float64)
    floor = 1 / np.sqrt(flat.shape[1])
    expected = (flat - flat.mean(1, keepdims=True)) / np.maximum(flat.std(1, keepdims=True), floor)
    expected_nchw = expected.reshape(3, 8, 8, 3).transpose(0, 3, 1, 2)
    np.testing.assert_allclose(x.numpy(), expected_nchw, atol=1e-5)
    assert (x[1] == 0).all()


def test_shards_are_disjoint_and_each_epoch_covers_the_shard() -> None:
    ds = _indexed_dataset(60)
    seen = []
    for index in range(3):
        stream = BatchStream(ds, 5, seed=index, shard=(index, 3))
        epoch1 = np.concatenate([next(stream)[1].numpy() for _ in range(4)])
        epoch2 = np.concatenate([next(stream)[1].numpy() for _ in range(4)])
        np.testing.assert_array_equal(np.sort(epoch1), stream.indices)
        np.testing.assert_array_equal(np.sort(epoch2), stream.indices)
        assert not np.array_equal(epoch1, epoch2)  # reshuffled every epoch
        seen.append(set(epoch1))
    assert len(seen[0] | seen[1] | seen[2]) == 60
    assert not (seen[0] & seen[1] or seen[0] & seen[2] or seen[1] & seen[2])


def test_batches_straddle_epochs_without_repeats() -> None:
    stream = BatchStream(_indexed_dataset(20), 7, seed=0)
    drawn = np.concatenate([next(stream)[1].numpy() for _ in range(3)])  # 21 draws
    np.testing.assert_array_equal(np.sort(drawn[:20]), np.arange(20))
    assert stream.epoch == 2


def test_same_seed_same_batches_different_seed_different() -> None:
    ds = load_dataset("synthetic:200", train=True)
    a, b, c = (BatchStream(ds, 8, seed=s) for s in (1, 1, 2))
    for _ in range(3):
        (xa, ya), (xb, yb), (xc, yc) = next(a), next(b), next(c)
        torch.testing.assert_close(xa, xb, rtol=0, atol=0)
        assert torch.equal(ya, yb)
    assert not torch.equal(ya, yc) or not torch.equal(xa, xc)


@pytest.mark.parametrize(("pad", "flip"), [(1, False), (4, True)])
def test_augmentation_is_a_zero_padded_crop_and_optional_flip(pad: int, flip: bool) -> None:
    ds = _indexed_dataset(12, pad=pad, flip=flip)
    stream = BatchStream(ds, 12, seed=3)
    used_flip, used_shift = False, False
    for _ in range(4):
        x, y = next(stream)
        for out, label in zip(x, y.tolist(), strict=True):
            padded = np.pad(ds.images[label], ((pad, pad), (pad, pad), (0, 0)))
            candidates = [
                (dy, dx, f)
                for dy in range(2 * pad + 1)
                for dx in range(2 * pad + 1)
                for f in ((False, True) if flip else (False,))
            ]
            crops = np.stack(
                [
                    padded[dy : dy + 8, dx : dx + 8][:, ::-1]
                    if f
                    else padded[dy : dy + 8, dx : dx + 8]
                    for dy, dx, f in candidates
                ]
            )
            errors = (to_tensor(crops) - out).abs().amax(dim=(1, 2, 3))
            best = int(errors.argmin())
            assert errors[best] < 1e-5
            dy, dx, f = candidates[best]
            used_flip |= f
            used_shift |= (dy, dx) != (pad, pad)
    assert used_shift and used_flip == flip


def test_no_augmentation_returns_standardised_originals() -> None:
    ds = _indexed_dataset(10)
    x, y = next(BatchStream(ds, 10, seed=0, augment=False))
    torch.testing.assert_close(x, to_tensor(ds.images[y.numpy()]))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch_size": 8, "shard": (3, 3)}, "shard"),
        ({"batch_size": 8, "shard": (0, 0)}, "shard"),
        ({"batch_size": 8, "shard": (0, 11)}, "shards"),
        ({"batch_size": 6, "shard": (0, 2)}, "batch_size"),
        ({"batch_size": 0}, "batch_size"),
    ],
)
def test_batch_stream_rejects_bad_arguments(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BatchStream(_indexed_dataset(10), seed=0, **kwargs)
