"""Tests for transient_nb.training.synthetic: the learnable, CIFAR-shaped set made on the fly."""

from __future__ import annotations

import numpy as np
from sklearn.linear_model import LogisticRegression

from transient_nb.training import data as data_module
from transient_nb.training.data import ArrayDataset, load_dataset


def _features(ds: ArrayDataset) -> np.ndarray:
    # 4x4 average pooling to 8x8x3, then per-image standardisation.
    x = ds.images.astype(np.float32).reshape(len(ds), 8, 4, 8, 4, 3).mean(axis=(2, 4))
    x = x.reshape(len(ds), -1)
    return (x - x.mean(1, keepdims=True)) / x.std(1, keepdims=True)


def test_synthetic_is_deterministic_balanced_and_learnable() -> None:
    train = load_dataset("synthetic:1000", train=True)
    test = load_dataset("synthetic:1000", train=False)
    assert train.images.shape == (1000, 32, 32, 3) and test.images.shape == (200, 32, 32, 3)
    assert (train.num_classes, train.pad, train.flip) == (10, 4, True)
    assert np.bincount(train.labels, minlength=10).min() >= 90

    data_module._load_cached.cache_clear()
    again = load_dataset("synthetic:1000", train=True)
    assert again is not train
    np.testing.assert_array_equal(again.images, train.images)
    np.testing.assert_array_equal(again.labels, train.labels)

    # Different samples in train and test...
    assert not {bytes(im) for im in train.images} & {bytes(im) for im in test.images}
    # ...drawn from the same classes, so a linear model generalises well above chance.
    clf = LogisticRegression(max_iter=1000).fit(_features(train), train.labels)
    assert clf.score(_features(test), test.labels) > 0.5
