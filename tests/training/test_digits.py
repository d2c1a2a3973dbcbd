"""Tests for transient_nb.training.digits: scikit-learn's digits, split without scikit-learn."""

from __future__ import annotations

import numpy as np
from sklearn.datasets import load_digits

from transient_nb.training.data import load_dataset


def test_digits_split() -> None:
    train, test = load_dataset("digits", train=True), load_dataset("digits", train=False)
    assert len(train) + len(test) == 1797
    assert len(test) == 360
    for ds in (train, test):
        assert ds.images.shape[1:] == (8, 8, 3) and ds.images.dtype == np.uint8
        assert ds.labels.dtype == np.int64
        assert set(np.unique(ds.labels)) == set(range(10)) and ds.num_classes == 10
        assert (ds.pad, ds.flip) == (1, False)
        # Grey replicated into three channels, 0..16 scaled to 0..255.
        assert (ds.images[..., 0] == ds.images[..., 2]).all() and ds.images.max() == 255
    # Train and test partition the bundled set: together they hold each image once.
    original = np.round(load_digits().images * (255 / 16)).astype(np.uint8).reshape(1797, -1)
    both = np.concatenate([train.images[..., 0], test.images[..., 0]]).reshape(1797, -1)
    assert sorted(map(bytes, both)) == sorted(map(bytes, original))


def test_the_digits_split_is_scikit_learns_without_importing_it():
    """The digits are read from scikit-learn's bundled file with numpy and split as
    ``train_test_split(test_size=0.2, stratify=y, random_state=0)`` would, without the 1-3 s
    import of scikit-learn in a replacement trainer's start."""
    import subprocess
    import sys

    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    from transient_nb.training.digits import digits_arrays, stratified_test_indices

    bunch = load_digits()
    grey = np.round(bunch.images * (255.0 / 16.0)).astype(np.uint8)
    labels = bunch.target.astype(np.int64)
    train_idx, test_idx = train_test_split(
        np.arange(len(labels)), test_size=0.2, stratify=labels, random_state=0
    )
    for train, idx in ((True, train_idx), (False, test_idx)):
        images, got = digits_arrays(train)
        idx = np.sort(idx)
        assert np.array_equal(got, labels[idx])
        assert np.array_equal(images, np.repeat(grey[idx][..., None], 3, axis=-1))
    rng = np.random.default_rng(3)
    for n, classes, fraction, seed in ((50, 3, 0.3, 1), (97, 7, 0.2, 5), (200, 2, 0.25, 0)):
        y = rng.integers(0, classes, n)
        y[:classes] = np.arange(classes)  # every class at least twice
        y[classes : 2 * classes] = np.arange(classes)
        _, expected = train_test_split(
            np.arange(n), test_size=fraction, stratify=y, random_state=seed
        )
        assert stratified_test_indices(y, fraction, seed).tolist() == sorted(expected.tolist())
    code = (
        "import sys; from transient_nb.training.data import load_dataset; "
        "load_dataset('digits', train=True); print('sklearn' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.stdout.strip() == "False", out.stderr[-2000:]
