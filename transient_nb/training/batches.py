"""Batches for training: the paper's augmentation, standardisation, sharded streams.

:func:`to_tensor` turns ``uint8`` NHWC images into standardised NCHW float tensors;
:class:`BatchStream` draws augmented batches from one shard of a data set.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from transient_nb.training.data import ArrayDataset


def _standardize(x: torch.Tensor) -> torch.Tensor:
    """TensorFlow's ``per_image_standardization`` on an NCHW float batch."""
    per_image = x[0].numel()
    mean = x.mean(dim=(1, 2, 3), keepdim=True)
    # Population std, floored so constant images do not divide by zero.
    std = x.std(dim=(1, 2, 3), keepdim=True, correction=0)
    return (x - mean) / std.clamp(min=1.0 / per_image**0.5)


def to_tensor(images: np.ndarray) -> torch.Tensor:
    """Convert ``uint8`` NHWC images to standardised NCHW float32, without augmentation.

    Each image is standardised like TensorFlow's ``per_image_standardization``:
    ``(x - mean) / max(std, 1 / sqrt(num_elements))`` over the image's pixels and
    channels (values taken in the 0..255 scale).

    Parameters
    ----------
    images : numpy.ndarray
        ``(N, H, W, C)`` ``uint8`` images.

    Returns
    -------
    torch.Tensor
        ``(N, C, H, W)`` float32 tensor.

    Examples
    --------
    >>> import numpy as np
    >>> to_tensor(np.zeros((2, 8, 8, 3), np.uint8)).shape
    torch.Size([2, 3, 8, 8])
    """
    if images.ndim != 4:
        raise ValueError(f"expected (N, H, W, C) images, got shape {images.shape}")
    array = np.ascontiguousarray(images)
    if not array.flags.writeable:
        # torch.from_numpy warns on read-only arrays (the cached data sets are).
        array = array.copy()
    x = torch.from_numpy(array).permute(0, 3, 1, 2).float()
    return _standardize(x)


class BatchStream(Iterator[tuple[torch.Tensor, torch.Tensor]]):
    """Endless stream of augmented training batches from one shard of a data set.

    The data set is split into ``count`` disjoint shards by a fixed permutation that
    does not depend on `seed`, so workers with different seeds and different shard
    indices never share images. Within the shard, images are drawn without
    replacement: each epoch is a fresh permutation, and epochs are concatenated so
    every batch is full (a batch may straddle two epochs).

    Augmentation (Li et al. / the TensorFlow CIFAR-10 recipe): zero-pad by
    ``dataset.pad`` pixels, random crop back to the original size, random horizontal
    flip if ``dataset.flip``, then per-image standardisation (see :func:`to_tensor`).

    Parameters
    ----------
    dataset : ArrayDataset
        The data set to draw from.
    batch_size : int
        Images per batch; at most the shard size.
    seed : int
        Seed for the shuffling and the augmentation; equal seeds give equal streams.
    augment : bool, optional
        Apply crop and flip augmentation, by default True. Standardisation is
        always applied.
    shard : tuple of (int, int), optional
        ``(index, count)``: use the `index`-th of `count` disjoint shards, by
        default ``(0, 1)`` (the whole data set).

    Attributes
    ----------
    indices : numpy.ndarray
        The sorted data set indices of this shard.
    epoch : int
        Number of epochs started over the shard (1 after the first batch).

    Examples
    --------
    >>> from transient_nb.training.data import load_dataset
    >>> ds = load_dataset("digits", train=True)
    >>> x, y = next(BatchStream(ds, 32, seed=0, shard=(1, 4)))
    >>> tuple(x.shape), y.dtype
    ((32, 3, 8, 8), torch.int64)
    """

    # Fixed so that all workers agree on the shard boundaries whatever their seeds.
    _SHARD_SEED = 0

    def __init__(
        self,
        dataset: ArrayDataset,
        batch_size: int,
        *,
        seed: int,
        augment: bool = True,
        shard: tuple[int, int] = (0, 1),
    ) -> None:
        index, count = shard
        if count < 1 or not 0 <= index < count:
            raise ValueError(f"shard must be (index, count) with 0 <= index < count, got {shard}")
        if count > len(dataset):
            raise ValueError(f"cannot split {len(dataset)} images into {count} shards")
        # A random (not strided) split keeps shards class-balanced even when a data
        # set is stored sorted by class.
        order = np.random.default_rng(self._SHARD_SEED).permutation(len(dataset))
        self.indices: np.ndarray = np.sort(order[index::count])
        if not 1 <= batch_size <= len(self.indices):
            raise ValueError(
                f"batch_size must be in 1..{len(self.indices)} (the shard size), got {batch_size}"
            )
        self.dataset = dataset
        self.batch_size = batch_size
        self.augment = augment
        self.epoch = 0
        self._rng = np.random.default_rng(seed)
        self._queue = np.empty(0, dtype=np.int64)

    def __iter__(self) -> BatchStream:
        return self

    def _next_indices(self) -> np.ndarray:
        while len(self._queue) < self.batch_size:
            self._queue = np.concatenate([self._queue, self._rng.permutation(self.indices)])
            self.epoch += 1
        taken, self._queue = self._queue[: self.batch_size], self._queue[self.batch_size :]
        return taken

    def _augment(self, images: np.ndarray) -> np.ndarray:
        n, height, width = len(images), images.shape[1], images.shape[2]
        pad = self.dataset.pad
        padded = np.pad(images, ((0, 0), (pad, pad), (pad, pad), (0, 0)))  # zeros
        top = self._rng.integers(0, 2 * pad + 1, size=n)
        left = self._rng.integers(0, 2 * pad + 1, size=n)
        rows = top[:, None] + np.arange(height)
        cols = left[:, None] + np.arange(width)
        if self.dataset.flip:
            flip = self._rng.random(n) < 0.5
            cols = np.where(flip[:, None], cols[:, ::-1], cols)
        # One gather does crop and flip for the whole batch.
        return padded[np.arange(n)[:, None, None], rows[:, :, None], cols[:, None, :]]

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        idx = self._next_indices()
        images = self.dataset.images[idx]
        if self.augment:
            images = self._augment(images)
        x = to_tensor(images)
        y = torch.from_numpy(np.asarray(self.dataset.labels[idx], dtype=np.int64))
        return x, y
