"""Tests for transient_nb.training.models."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from transient_nb.training.data import load_dataset, to_tensor
from transient_nb.training.models import MODELS, build_model, evaluate

torch.set_num_threads(1)


def _num_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(
    ("name", "expected"),
    [("resnet32", 466_906), ("resnet32-t2t", 1_857_722)],
)
def test_resnet32_parameter_counts_match_the_papers(name: str, expected: int) -> None:
    assert _num_params(build_model(name)) == expected


def test_canonical_family_grows_with_depth() -> None:
    counts = [_num_params(build_model(n)) for n in ("resnet8", "resnet20", "resnet32")]
    assert counts[0] < counts[1] < counts[2]


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("side", [32, 8])
def test_output_shape_for_cifar_and_digit_sized_inputs(name: str, side: int) -> None:
    torch.manual_seed(0)
    model = build_model(name)
    with torch.no_grad():
        logits = model(torch.randn(2, 3, side, side))
    assert logits.shape == (2, 10)
    assert torch.isfinite(logits).all()


def test_num_classes_sets_the_output_width() -> None:
    with torch.no_grad():
        assert build_model("resnet8", num_classes=3)(torch.randn(2, 3, 8, 8)).shape == (2, 3)


def test_unknown_model_name_lists_known_names() -> None:
    with pytest.raises(ValueError) as info:
        build_model("resnet33")
    message = str(info.value)
    assert "resnet33" in message
    for name in MODELS:
        assert name in message


@pytest.mark.slow  # trains: ~40 s on a loaded 2-core machine
def test_resnet8_overfits_a_small_batch() -> None:
    torch.manual_seed(0)
    data = load_dataset("synthetic:64", train=True)
    x, y = to_tensor(data.images), torch.from_numpy(data.labels.copy())
    model = build_model("resnet8")
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for _ in range(60):
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] / 5
    accuracy, _ = evaluate(model, x, y)
    assert accuracy > 0.9


class _ConstantClassifier(nn.Module):
    """Always predicts `cls`; records the mode and grad state it was called in."""

    def __init__(self, cls: int, num_classes: int = 5) -> None:
        super().__init__()
        self.bn = nn.BatchNorm1d(1)  # a mode-dependent layer, as in real models
        self.cls, self.num_classes = cls, num_classes
        self.calls: list[tuple[bool, bool, int]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.append((self.training, torch.is_grad_enabled(), len(x)))
        logits = torch.zeros(len(x), self.num_classes)
        logits[:, self.cls] = 2.0
        return logits


def test_evaluate_perfect_constant_classifier_and_restores_train_mode() -> None:
    model = _ConstantClassifier(3).train()
    images = np.zeros((10, 3, 8, 8), np.float32)
    accuracy, loss = evaluate(model, images, np.full(10, 3), batch_size=4)
    assert accuracy == 1.0
    expected = nn.functional.cross_entropy(torch.tensor([[0.0, 0, 0, 2, 0]]), torch.tensor([3]))
    assert loss == pytest.approx(expected.item(), rel=1e-6)
    assert model.training
    assert [c[2] for c in model.calls] == [4, 4, 2]
    assert all(not training and not grad for training, grad, _ in model.calls)


def test_evaluate_partial_accuracy_weights_every_example_equally() -> None:
    model = _ConstantClassifier(1).eval()
    labels = torch.tensor([1, 1, 1, 0, 2, 1, 0])  # 4 of 7 correct, uneven batches
    accuracy, loss = evaluate(model, torch.zeros(7, 3, 8, 8), labels, batch_size=3)
    logits = torch.zeros(7, 5)
    logits[:, 1] = 2.0
    assert accuracy == pytest.approx(4 / 7)
    assert loss == pytest.approx(nn.functional.cross_entropy(logits, labels).item(), rel=1e-6)
    assert not model.training


def test_evaluate_rejects_mismatched_lengths() -> None:
    with pytest.raises(ValueError, match="3 images but 2 labels"):
        evaluate(_ConstantClassifier(0), torch.zeros(3, 3, 8, 8), torch.zeros(2))
