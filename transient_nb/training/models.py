"""ResNet models for CIFAR-sized images and a small evaluation helper.

Two ResNet-32 flavours are provided:

* ``"resnet32"`` -- He et al. (2016), section 4.2: the canonical CIFAR ResNet with
  post-activation basic blocks and widths 16/32/64 (466,906 parameters with
  1x1 projection shortcuts).
* ``"resnet32-t2t"`` -- Tensor2Tensor's ``resnet_cifar_32`` hyper-parameter set, the
  model trained by Li et al. (ICAC 2019): a 7x7 stem, pre-activation blocks and
  widths 32/64/128 (1,857,722 parameters).

``"resnet8"`` and ``"resnet20"`` are shallower members of the canonical family, meant
for fast CPU demos and tests.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["MODELS", "build_model", "evaluate"]

#: Names accepted by :func:`build_model`.
MODELS: tuple[str, ...] = ("resnet8", "resnet20", "resnet32", "resnet32-t2t")


def _conv3x3(in_channels: int, out_channels: int, stride: int = 1) -> nn.Conv2d:
    # No bias: every conv is followed (directly or after the residual add) by
    # batch norm, whose shift makes a conv bias redundant.
    return nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)


def _projection(in_channels: int, out_channels: int, stride: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
        nn.BatchNorm2d(out_channels),
    )


class _PostActBlock(nn.Module):
    """He et al.'s original basic block: conv-BN-ReLU-conv-BN, add, ReLU."""

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.conv1 = _conv3x3(in_channels, out_channels, stride)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = _conv3x3(out_channels, out_channels)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.shortcut: nn.Module = (
            _projection(in_channels, out_channels, stride)
            if stride != 1 or in_channels != out_channels
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class _PreActBlock(nn.Module):
    """Pre-activation basic block (He et al., 2016b): BN-ReLU-conv-BN-ReLU-conv, add."""

    def __init__(self, in_channels: int, out_channels: int, stride: int, *, project: bool) -> None:
        super().__init__()
        self.bn1 = nn.BatchNorm2d(in_channels)
        self.conv1 = _conv3x3(in_channels, out_channels, stride)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.conv2 = _conv3x3(out_channels, out_channels)
        # Tensor2Tensor projects in the first block of every stage (in the first
        # stage too, where the width grows from the stem's 16 to 32 channels).
        self.shortcut: nn.Module = (
            _projection(in_channels, out_channels, stride) if project else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv1(F.relu(self.bn1(x)))
        out = self.conv2(F.relu(self.bn2(out)))
        return out + self.shortcut(x)


class _CifarResNet(nn.Module):
    """Stem, three stages of basic blocks, global average pool, linear classifier."""

    def __init__(
        self,
        stem: nn.Module,
        stages: list[nn.Sequential],
        features: int,
        num_classes: int,
    ) -> None:
        super().__init__()
        self.stem = stem
        self.stages = nn.Sequential(*stages)
        self.fc = nn.Linear(features, num_classes)
        self._init_weights()

    def _init_weights(self) -> None:
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.stages(self.stem(x))
        # Global average pooling keeps the network input-size agnostic (8x8 digits,
        # 32x32 CIFAR); both stride-2 stages still leave >= 2x2 maps at 8x8.
        out = torch.flatten(F.adaptive_avg_pool2d(out, 1), 1)
        return self.fc(out)


def _canonical_resnet(blocks_per_stage: int, num_classes: int) -> _CifarResNet:
    """He et al.'s CIFAR ResNet with ``6 * blocks_per_stage + 2`` layers."""
    widths = (16, 32, 64)
    stem = nn.Sequential(_conv3x3(3, widths[0]), nn.BatchNorm2d(widths[0]), nn.ReLU(inplace=True))
    stages: list[nn.Sequential] = []
    in_channels = widths[0]
    for stage, width in enumerate(widths):
        blocks: list[nn.Module] = []
        for index in range(blocks_per_stage):
            stride = 2 if stage > 0 and index == 0 else 1
            blocks.append(_PostActBlock(in_channels, width, stride))
            in_channels = width
        stages.append(nn.Sequential(*blocks))
    return _CifarResNet(stem, stages, widths[-1], num_classes)


def _t2t_resnet32(num_classes: int) -> _CifarResNet:
    """Tensor2Tensor's ``resnet_cifar_32``: 7x7 stem, pre-activation, widths 32/64/128."""
    stem_width, widths, blocks_per_stage = 16, (32, 64, 128), 5
    stem = nn.Sequential(
        nn.Conv2d(3, stem_width, 7, stride=1, padding=3, bias=False),
        nn.BatchNorm2d(stem_width),
        nn.ReLU(inplace=True),
    )
    stages: list[nn.Sequential] = []
    in_channels = stem_width
    for stage, width in enumerate(widths):
        blocks: list[nn.Module] = []
        for index in range(blocks_per_stage):
            stride = 2 if stage > 0 and index == 0 else 1
            blocks.append(_PreActBlock(in_channels, width, stride, project=index == 0))
            in_channels = width
        stages.append(nn.Sequential(*blocks))
    return _CifarResNet(stem, stages, widths[-1], num_classes)


_BUILDERS: dict[str, Callable[[int], nn.Module]] = {
    "resnet8": lambda n: _canonical_resnet(1, n),
    "resnet20": lambda n: _canonical_resnet(3, n),
    "resnet32": lambda n: _canonical_resnet(5, n),
    "resnet32-t2t": _t2t_resnet32,
}


def build_model(name: str, num_classes: int = 10) -> nn.Module:
    """Build a freshly initialised model by name.

    Parameters
    ----------
    name : str
        One of :data:`MODELS`.
    num_classes : int, optional
        Size of the output layer, by default 10.

    Returns
    -------
    torch.nn.Module
        The model, in training mode, on the CPU. It accepts ``(N, 3, H, W)`` float
        tensors with ``H, W >= 8`` and returns ``(N, num_classes)`` logits.

    Raises
    ------
    ValueError
        If `name` is not a known model name or `num_classes` is not positive.

    Examples
    --------
    >>> model = build_model("resnet32")
    >>> sum(p.numel() for p in model.parameters())
    466906
    """
    if name not in _BUILDERS:
        raise ValueError(f"unknown model name {name!r}; known models: {', '.join(MODELS)}")
    if num_classes < 1:
        raise ValueError(f"num_classes must be positive, got {num_classes}")
    return _BUILDERS[name](num_classes)


def _as_tensor(values: np.ndarray | torch.Tensor) -> torch.Tensor:
    if isinstance(values, np.ndarray) and not values.flags.writeable:
        # torch warns on read-only arrays, and the cached data sets are read-only.
        values = values.copy()
    return torch.as_tensor(values)


def evaluate(
    model: nn.Module,
    images: np.ndarray | torch.Tensor,
    labels: np.ndarray | torch.Tensor,
    batch_size: int = 512,
    device: str | torch.device = "cpu",
) -> tuple[float, float]:
    """Compute accuracy and mean cross-entropy of `model` on a labelled set.

    The model runs in eval mode (batch norm uses its running statistics) under
    ``torch.no_grad()``; its previous train/eval mode is restored afterwards.

    Parameters
    ----------
    model : torch.nn.Module
        A classifier returning logits; it must already be on `device`.
    images : numpy.ndarray or torch.Tensor
        ``(N, C, H, W)`` float32 inputs, already normalised (see
        ``transient_nb.training.batches.to_tensor``).
    labels : numpy.ndarray or torch.Tensor
        ``(N,)`` integer class labels.
    batch_size : int, optional
        Evaluation batch size, by default 512.
    device : str or torch.device, optional
        Device the batches are moved to, by default ``"cpu"``.

    Returns
    -------
    tuple of (float, float)
        ``(accuracy, loss)``: accuracy in ``[0, 1]`` and the mean cross-entropy
        over all ``N`` examples.

    Raises
    ------
    ValueError
        If the set is empty, the lengths differ or `batch_size` is not positive.

    Examples
    --------
    >>> import torch
    >>> model = build_model("resnet8")
    >>> acc, loss = evaluate(model, torch.zeros(4, 3, 8, 8), torch.zeros(4, dtype=torch.long))
    >>> 0.0 <= acc <= 1.0
    True
    """
    x_all = _as_tensor(images).float()
    y_all = _as_tensor(labels).long()
    if len(x_all) != len(y_all):
        raise ValueError(f"{len(x_all)} images but {len(y_all)} labels")
    if len(x_all) == 0:
        raise ValueError("cannot evaluate on an empty set")
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    was_training = model.training
    model.eval()
    correct = 0
    total_loss = 0.0
    try:
        with torch.no_grad():
            for start in range(0, len(x_all), batch_size):
                x = x_all[start : start + batch_size].to(device)
                y = y_all[start : start + batch_size].to(device)
                logits = model(x)
                # Sum (not mean) per batch so a short last batch is weighted correctly.
                total_loss += float(F.cross_entropy(logits, y, reduction="sum"))
                correct += int((logits.argmax(dim=1) == y).sum())
    finally:
        model.train(was_training)
    return correct / len(x_all), total_loss / len(x_all)
