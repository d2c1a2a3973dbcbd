"""The synthetic data set: learnable, CIFAR-shaped images made on the fly.

``"synthetic:N"``: N training images (N // 5 test images), 32x32x3 in 10 classes, the same in
every process, so that demos and tests run without any download.
"""

from __future__ import annotations

import numpy as np
import torch

_CIFAR_SIDE = 32  # CIFAR-shaped


def _smooth_noise(rng: np.random.Generator, count: int, side: int, cells: int) -> np.ndarray:
    """``count`` smooth random fields ``(count, side, side, 3)`` in roughly [-1, 1].

    Bilinear upsampling of a coarse ``cells x cells`` random grid gives low-frequency
    patterns, which survive the random crops of augmentation (like real objects do).
    """
    coarse = rng.uniform(-1.0, 1.0, size=(count, 3, cells, cells)).astype(np.float32)
    fine = torch.nn.functional.interpolate(
        torch.from_numpy(coarse), size=(side, side), mode="bilinear", align_corners=True
    )
    return fine.permute(0, 2, 3, 1).numpy()


# Seeds are fixed so every process and every call builds the same synthetic set; train
# and test use different sample seeds but share the class templates.
_SYNTHETIC_TEMPLATE_SEED = 20190616
_SYNTHETIC_SAMPLE_SEEDS = {True: 1, False: 2}
#: The synthetic set's classes.
SYNTHETIC_CLASSES = 10
_SYNTHETIC_SHIFT = 4


def synthetic_arrays(size: int, train: bool) -> tuple[np.ndarray, np.ndarray]:
    """Learnable CIFAR-shaped images: shifted class templates plus nuisances."""
    side, shift, k = _CIFAR_SIDE, _SYNTHETIC_SHIFT, SYNTHETIC_CLASSES
    big = side + 2 * shift
    template_rng = np.random.default_rng(_SYNTHETIC_TEMPLATE_SEED)
    templates = _smooth_noise(template_rng, k, big, cells=8)
    n = size if train else max(1, size // 5)
    rng = np.random.default_rng(_SYNTHETIC_SAMPLE_SEEDS[train])
    labels = np.arange(n, dtype=np.int64) % k  # balanced, then shuffled
    rng.shuffle(labels)

    # Random translation of each image within the larger template.
    dy = rng.integers(0, 2 * shift + 1, size=n)
    dx = rng.integers(0, 2 * shift + 1, size=n)
    rows = (dy[:, None] + np.arange(side))[:, :, None]
    cols = (dx[:, None] + np.arange(side))[:, None, :]
    signal = templates[labels[:, None, None], rows, cols]  # (n, side, side, 3)

    # Nuisances keep the task from being trivial: a class-independent smooth
    # background, per-image contrast and brightness, and pixel noise.
    background = _smooth_noise(rng, n, side, cells=4)
    contrast = rng.uniform(0.5, 1.3, size=(n, 1, 1, 1)).astype(np.float32)
    brightness = rng.uniform(-0.3, 0.3, size=(n, 1, 1, 1)).astype(np.float32)
    noise = rng.normal(0.0, 0.35, size=signal.shape).astype(np.float32)
    x = contrast * signal + 0.7 * background + brightness + noise
    images = np.clip(127.5 + 60.0 * x, 0, 255).round().astype(np.uint8)
    return images, labels
