"""The digits data set: scikit-learn's bundled 8x8 hand-written digits, split 80/20.

Read with numpy from scikit-learn's own file and split as scikit-learn's
``train_test_split`` would, without importing scikit-learn (1-3 s of a replacement trainer's
start).
"""

from __future__ import annotations

import importlib.util
import os

import numpy as np


def _digits_file() -> str:
    """scikit-learn's bundled ``digits.csv.gz``, found without importing scikit-learn (its
    import takes 1-3 s of a replacement trainer's start; the file is read in milliseconds)."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("The 'digits' data set is scikit-learn's: pip install scikit-learn")
    return os.path.join(
        next(iter(spec.submodule_search_locations)), "datasets", "data", "digits.csv.gz"
    )


def _approximate_mode(counts: np.ndarray, draws: int, rng: np.random.RandomState) -> np.ndarray:
    # scikit-learn's ``_approximate_mode`` (model_selection._split): per-class draws, ties broken
    # at random; written out so that the split needs no scikit-learn import.
    continuous = counts / counts.sum() * draws
    floored = np.floor(continuous)
    need = int(draws - floored.sum())
    if need > 0:
        remainder = continuous - floored
        for value in np.sort(np.unique(remainder))[::-1]:
            (inds,) = np.where(remainder == value)
            add = min(len(inds), need)
            floored[rng.choice(inds, size=add, replace=False)] += 1
            need -= add
            if need == 0:
                break
    return floored.astype(int)


def stratified_test_indices(labels: np.ndarray, test_fraction: float, seed: int) -> np.ndarray:
    """The sorted test indices of ``train_test_split(..., test_size=test_fraction,
    stratify=labels, random_state=seed)`` (scikit-learn's StratifiedShuffleSplit, one split),
    computed with numpy alone.

    Examples
    --------
    >>> stratified_test_indices(np.array([0, 0, 0, 0, 1, 1, 1, 1]), 0.5, 0).tolist()
    [0, 1, 5, 7]
    """
    n = len(labels)
    n_test = int(np.ceil(test_fraction * n))
    n_train = n - n_test
    _, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
    by_class = np.split(np.argsort(inverse, kind="stable"), np.cumsum(counts)[:-1])
    rng = np.random.RandomState(seed)
    n_i = _approximate_mode(counts, n_train, rng)
    t_i = _approximate_mode(counts - n_i, n_test, rng)
    test: list[int] = []
    for i in range(len(counts)):
        order = by_class[i].take(rng.permutation(counts[i]), mode="clip")
        test.extend(order[n_i[i] : n_i[i] + t_i[i]])
    return np.sort(np.asarray(test, dtype=np.int64))


def digits_arrays(train: bool) -> tuple[np.ndarray, np.ndarray]:
    data = np.loadtxt(_digits_file(), delimiter=",")  # as sklearn's load_digits reads it
    labels = data[:, -1].astype(np.int64)
    grey = np.round(data[:, :-1].reshape(-1, 8, 8) * (255.0 / 16.0)).astype(np.uint8)  # 0..16
    # The split of train_test_split(test_size=0.2, stratify=labels, random_state=0), sorted so
    # that it keeps the bundled order (shuffling is BatchStream's job).
    test = stratified_test_indices(labels, 0.2, 0)
    idx = test if not train else np.setdiff1d(np.arange(len(labels)), test)
    images = np.repeat(grey[idx][..., None], 3, axis=-1)
    return np.ascontiguousarray(images), labels[idx]
