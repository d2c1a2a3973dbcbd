"""A small token model and its data, imported by path (``tokmod:make_net``) in the tests.

The data are 32-byte windows of three kinds of text that every Python has on disk (the
standard library's licence, some of its modules' source, and IDLE's HTML help), labelled by
kind: a classification from integer tokens, with nothing downloaded.
"""

from __future__ import annotations

import os
import sysconfig

import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

SOURCES = {
    0: ["LICENSE.txt"],
    1: ["argparse.py", "functools.py", "dataclasses.py"],
    2: ["idlelib/help.html"],
}
WINDOW = 32


def make_data(per_class: int = 700, seed: int = 0) -> tuple[TensorDataset, TensorDataset]:
    """(train, test): 80/20 of ``per_class`` windows of each kind, token ids 0..255."""
    root = sysconfig.get_paths()["stdlib"]
    rng = np.random.default_rng(seed)
    xs, ys = [], []
    for label, names in SOURCES.items():
        text = b"".join(_read(os.path.join(root, n)) for n in names)
        starts = rng.integers(0, len(text) - WINDOW, size=per_class)
        xs += [np.frombuffer(text[s : s + WINDOW], dtype=np.uint8) for s in starts]
        ys += [label] * per_class
    x = torch.tensor(np.stack(xs), dtype=torch.int64)
    y = torch.tensor(ys, dtype=torch.int64)
    order = torch.from_numpy(rng.permutation(len(y)))
    x, y = x[order], y[order]
    n = int(0.8 * len(y))
    return TensorDataset(x[:n], y[:n]), TensorDataset(x[n:], y[n:])


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


class TokenNet(nn.Module):
    """Mean of the tokens' embeddings, then a linear classifier."""

    def __init__(self, vocab: int = 256, dim: int = 64, classes: int = 3):
        super().__init__()
        self.embed = nn.EmbeddingBag(vocab, dim, mode="mean")
        self.head = nn.Sequential(nn.ReLU(), nn.Linear(dim, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(x))


def make_net() -> TokenNet:
    """A fresh :class:`TokenNet`."""
    return TokenNet()


def optimizer(params: object) -> torch.optim.Optimizer:
    """Adam at 1e-2: a factory of the parameters, named by import path (``tokmod:optimizer``)."""
    return torch.optim.Adam(params, lr=1e-2)  # type: ignore[arg-type]


def top2(output: torch.Tensor, target: torch.Tensor) -> float:
    """The true kind is among the two likeliest (a metric named by import path)."""
    return float((output.topk(2, dim=1).indices == target[:, None]).any(dim=1).float().mean())
