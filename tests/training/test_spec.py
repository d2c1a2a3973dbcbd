"""What the user gives, checked before anything is spent: each mistake one clear message that
names the bad value and says what to do; on a real cluster, nothing started and nothing left."""

from __future__ import annotations

import sys
import threading
from typing import Any

import cloudpickle
import pytest
import torch
from torch import nn
from torch.utils.data import IterableDataset, TensorDataset

from transient_nb.training.hparams import HParams
from transient_nb.training.spec import (
    check_train_args,
    metrics_from_text,
    reached,
    resolve,
    stop_at_from_text,
    stop_conditions,
)

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def pairs(n: int = 64, features: int = 4, out: int = 1, classes: int | None = None) -> Any:
    """(train, test) TensorDatasets: float features, float targets of ``out`` columns (or class
    indices when ``classes`` is given)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, features, generator=g)
    if classes is not None:
        y: torch.Tensor = torch.randint(0, classes, (n,), generator=g)
    else:
        y = torch.randn(n, out, generator=g) if out else torch.randn(n, generator=g)
    return TensorDataset(x[: n // 2], y[: n // 2]), TensorDataset(x[n // 2 :], y[n // 2 :])


def linear(features: int = 4, out: int = 1) -> Any:
    return lambda: nn.Linear(features, out)


class NeedsArgs(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(4, width)


class Stream(IterableDataset):
    def __iter__(self) -> Any:
        yield torch.zeros(4), torch.zeros(1)


class NotPairs(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.zeros(4)


def lock_capturing_factory() -> Any:
    lock = threading.Lock()

    def make() -> nn.Module:
        assert lock is not None
        return nn.Linear(4, 1)

    return make


def meta_capturing_factory() -> Any:
    # A tensor on another device than the CPU, captured by the factory: a GPU machine's
    # ``cuda`` tensor in a notebook; the meta device stands for it where there is no GPU.
    w = torch.zeros(1, 4, device="meta")

    def make() -> nn.Module:
        net = nn.Linear(4, 1)
        assert w is not None
        return net

    return make


def _frozen() -> nn.Module:
    net = nn.Linear(4, 1)
    for p in net.parameters():
        p.requires_grad_(False)
    return net


#: (train() arguments beyond a small batch size, a piece of the message that must be there).
BAD: list[tuple[dict[str, Any], str]] = [
    # The examples.
    (
        {"model": linear(4, 3), "data": pairs(out=0), "loss": "mse"},
        r"the model returns shape \(16, 3\) but the targets have shape \(16,\): with "
        r"loss='mse' they must match",
    ),
    (
        {"model": linear(), "data": lambda: [1, 2, 3], "loss": "mse"},
        r"the data factory returned a list of 3 items, not a \(train, test\) pair of Datasets",
    ),
    (
        {"model": meta_capturing_factory(), "data": pairs(), "loss": "mse"},
        r"`model` captured a meta tensor \(on meta\): build it inside the factory",
    ),
    (
        {"model": nn.Linear(4, 1, device="meta"), "data": pairs(), "loss": "mse"},
        r"`model` captured a meta tensor \('weight' on meta\): build it inside the factory",
    ),
    # And more of the kind a user makes.
    ({"model": "resnet1000"}, r"Unknown model 'resnet1000': use one of resnet8"),
    ({"model": "no_such_pkg.nets:make"}, r"module 'no_such_pkg.nets' cannot be imported"),
    ({"model": "math:no_net", "data": pairs()}, r"module 'math' has no attribute 'no_net'"),
    (
        {"model": NeedsArgs, "data": pairs(), "loss": "mse"},
        r"model=NeedsArgs could not be called without arguments .*functools.partial\(NeedsArgs",
    ),
    (
        {"model": lambda: "a net", "data": pairs(), "loss": "mse"},
        r"returned a str, not an nn.Module",
    ),
    ({"model": 42}, r"model=42 is a int: give an nn.Module"),
    ({"model": _frozen, "data": pairs(), "loss": "mse"}, r"no parameter with requires_grad=True"),
    (
        {"model": lambda: nn.Linear(4, 1).double(), "data": pairs(), "loss": "mse"},
        r"torch.float64 parameter 'weight': the PS holds float32; call .float\(\)",
    ),
    ({"model": linear(), "data": {"x": 1}}, r"data=dict is not a \(train, test\) pair"),
    ({"model": linear(), "data": "imagenet"}, r"invalid data spec 'imagenet'"),
    (
        {"model": linear(), "data": (torch.zeros(4), torch.zeros(4)), "loss": "mse"},
        r"data is a pair of Tensors \(inputs and targets\?\), not \(train, test\) Datasets: "
        r"give e.g. \(TensorDataset\(x_train, y_train\)",
    ),
    (
        {"model": linear(), "data": (Stream(), Stream()), "loss": "mse"},
        r"Stream as the train set: each must be a map-style torch Dataset",
    ),
    (
        {"model": linear(), "data": (NotPairs(), NotPairs()), "loss": "mse"},
        r"the train set's item 0 is a Tensor, not an \(input, target\) pair",
    ),
    (
        {"model": linear(), "data": pairs(), "loss": "mse", "batch_size": 100},
        r"batch_size=100 is larger than the train set \(32 items\): pass batch_size=8",
    ),
    (
        {"model": linear(4, 3), "data": pairs(out=1)},
        r"the targets have shape \(16, 1\) and dtype torch.float32: with loss='cross_entropy' "
        r"they must be class indices of shape \(16,\)",
    ),
    (
        {"model": linear(4, 3), "data": pairs(classes=5)},
        r"the targets go from \d to 4 but the model returns 3 class scores",
    ),
    (
        {"model": linear(7, 1), "data": pairs(), "loss": "mse"},
        r"the model \S*<lambda> fails on a batch of inputs of shape \(16, 4\) \(RuntimeError",
    ),
    (
        {"model": linear(), "data": pairs(), "loss": lambda out, y: (out - y) ** 2},
        r"the loss returned shape \(16, 1\): it must return a scalar tensor",
    ),
    (
        {"model": linear(), "data": pairs(), "loss": lambda out, y: y.sum() * 0},
        r"the loss does not depend on the model's parameters",
    ),
    (
        {"model": linear(), "data": pairs(), "loss": lambda out, y: (out * float("nan")).mean()},
        r"the loss is nan on the first batch",
    ),
    (
        {"model": linear(), "data": pairs(), "loss": "mse", "metrics": {"bad": lambda o, y: 1 / 0}},
        r"metric 'bad' fails on the first batch \(ZeroDivisionError",
    ),
    (
        {"model": linear(), "data": pairs(), "loss": "mse", "metrics": ["accuracy"]},
        r"with metric 'accuracy' \(accuracy\) they must be class indices of shape \(16,\)",
    ),
    ({"metrics": {"loss": abs}}, r"metric name 'loss' is taken by a column of run.history"),
    ({"metrics": ["auc"]}, r"Unknown metric 'auc'"),
    ({"loss": "huber"}, r"Unknown loss 'huber': use 'cross_entropy' or 'mse'"),
    ({"optimizer": "adam"}, r"Unknown optimizer 'adam': use 'sgd'"),
    (
        {"model": linear(), "data": pairs(), "loss": "mse", "optimizer": lambda p: "sgd"},
        r"returned a str, not a torch.optim.Optimizer",
    ),
    (
        {"model": linear(), "data": pairs(), "loss": "mse", "optimizer": torch.optim.LBFGS},
        r"optimizer=LBFGS: LBFGS.step\(\) missing 1 required positional argument: 'closure'; "
        r"pass a torch.optim class or a factory",
    ),
    (
        {
            "model": linear(),
            "data": pairs(),
            "loss": "mse",
            "optimizer": torch.optim.AdamW,
            "lr": 0.01,
        },
        r"lr=0.01 sets the paper's SGD, but optimizer= is your own: .*functools.partial",
    ),
    (
        {"model": linear(), "data": pairs(), "loss": "mse", "stop_at": {"acc": 0.9}},
        r"stop_at names 'acc', which is not a metric of this run: use one of mse, test_loss",
    ),
    (
        {"model": linear(), "data": pairs(), "loss": "mse", "stop_at": {"mse": "low"}},
        r"stop_at\['mse'\]='low' must be a number",
    ),
    (
        {"model": linear(), "data": pairs(), "loss": "mse", "target_accuracy": 0.9},
        r"target_accuracy=0.9 needs the accuracy metric, and this run's metrics are \['mse'\]",
    ),
    (
        {"model": lock_capturing_factory(), "data": pairs(), "loss": "mse"},
        r"`model` cannot be sent to the workers \(TypeError: cannot pickle '_thread.lock'",
    ),
    ({"model": "resnet8", "data": "digits", "collate_fn": list}, r"collate_fn and num_workers"),
    ({"num_workers": -1}, r"num_workers=-1 must be a whole number"),
]


@pytest.mark.parametrize("kwargs,message", BAD, ids=[str(i) for i in range(len(BAD))])
def test_each_mistake_is_one_clear_message(kwargs: dict[str, Any], message: str) -> None:
    given = {"batch_size": 16, "steps": 10, **kwargs}
    with pytest.raises(ValueError, match=message):
        check_train_args(**given)


def test_the_text_forms_of_the_surfaces() -> None:
    assert stop_at_from_text("mae=0.3, f1>=0.8,loss<=2") == {
        "mae": "0.3",
        "f1": ">=0.8",
        "loss": "<=2",
    }
    with pytest.raises(ValueError, match="--stop-at 'mae': write METRIC=VALUE"):
        stop_at_from_text("mae")
    found = metrics_from_text("accuracy,mae=math:fabs,math:sqrt")
    assert found == {"accuracy": "accuracy", "mae": "math:fabs", "sqrt": "math:sqrt"}
    workload = resolve("resnet8", "digits", metrics=found)
    import math

    assert workload.metrics["mae"] is math.fabs  # import paths are resolved
    conditions = stop_conditions(stop_at_from_text("mae=0.3,sqrt>=2"), workload.metrics)
    assert conditions == {"mae": ("<=", 0.3), "sqrt": (">=", 2.0)}
    assert reached(conditions, {"mae": 0.31, "sqrt": 2.5}) == "sqrt>=2"
    assert reached(conditions, {"mae": float("nan"), "sqrt": 1.0}) is None


def test_hparams_defaults_stay_the_papers() -> None:
    # A user's workload changes none of the defaults of the reference one.
    assert check_train_args(model="resnet8", data="digits") == HParams()
