"""The workload: what every process builds and draws from (units here), and your own model and
data trained on real clusters: each kind of model (an instance, a class, an import path; a
notebook's function: tests/test_notebooks.py and tests/deploy/test_head.py) and of data (a
Dataset pair, a factory, an import path, a built-in spec), each to a learned result."""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

import cloudpickle
import numpy as np
import pytest
import torch
from sklearn.datasets import load_diabetes
from torch import nn
from torch.utils.data import TensorDataset

from transient_nb import TransientCluster, load_model, load_state_dict, train
from transient_nb.training import checkpoint
from transient_nb.training.data import BatchStream, load_dataset
from transient_nb.training.models import build_model
from transient_nb.training.workload import (
    Workload,
    WorkloadPlugin,
    fixed_state,
    import_path,
    load_fixed,
    lower_is_better,
)

DATA = Path(__file__).resolve().parents[1] / "data"

# What this module defines travels by value, as a notebook's definitions do (cloudpickle would
# otherwise send a reference to this test module, which the workers would have to import).
cloudpickle.register_pickle_by_value(sys.modules[__name__])


# -- models, data and metrics of the tests ----------------------------------------------------------
class Regressor(nn.Module):
    """A small MLP for the diabetes set (10 features, one target)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def diabetes() -> tuple[TensorDataset, TensorDataset]:
    """scikit-learn's diabetes set, standardised (targets too), 352 train / 90 test."""
    x, y = load_diabetes(return_X_y=True)
    x = (x - x.mean(0)) / x.std(0)
    y = (y - y.mean()) / y.std()
    xt = torch.tensor(x, dtype=torch.float32)
    yt = torch.tensor(y, dtype=torch.float32)[:, None]
    return TensorDataset(xt[:352], yt[:352]), TensorDataset(xt[352:], yt[352:])


def mae(output: torch.Tensor, target: torch.Tensor) -> float:
    return float((output - target).abs().mean())


class DigitsNet(nn.Module):
    """A small CNN for 8x8 digits (the built-in ``digits`` spec's 3-channel images)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1)
        self.bn = nn.BatchNorm2d(16)
        self.fc = nn.Linear(16 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.nn.functional.max_pool2d(torch.relu(self.bn(self.conv(x))), 2)
        return self.fc(torch.flatten(x, 1))


# -- units ------------------------------------------------------------------------------------------
def test_the_builtin_workload_takes_the_same_steps_as_ever():
    """A built-in name on a built-in spec builds the same model from the seeded generator and
    draws the same augmented batches as before there were workloads."""
    w = Workload("resnet8", "digits")
    assert w.builtin and w.model_ref == "resnet8" and not w.model_by_value
    torch.manual_seed(5)
    ours = w.build_model()
    torch.manual_seed(5)
    theirs = build_model("resnet8", num_classes=10)
    for a, b in zip(ours.state_dict().values(), theirs.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    x, y = next(w.train_batches(16, seed=3))
    x2, y2 = next(BatchStream(load_dataset("digits", train=True), 16, seed=3))
    assert torch.equal(x, x2) and torch.equal(y, y2)
    assert w.loss_fn() is torch.nn.functional.cross_entropy


def test_a_dataset_pair_is_drawn_in_the_seed_s_order_and_evaluated_weighted_by_batch():
    train_set, test_set = diabetes()
    w = Workload(Regressor, (train_set, test_set), loss="mse", metrics={"mae": mae, "mse": "mse"})
    assert not w.builtin and w.model_by_value and w.model_ref is None
    a = [next(w.train_batches(32, seed=1))[0] for _ in range(1)]
    b = [next(Workload(Regressor, (train_set, test_set)).train_batches(32, seed=1))[0]]
    assert torch.equal(a[0], b[0])  # the same seed, the same batch
    assert not torch.equal(a[0], next(w.train_batches(32, seed=2))[0])
    # Every metric over the whole test set (90 items: batches of 256, so one batch; a limit of
    # 50 takes the first 50), equal to the metric computed at once.
    net = Regressor()
    metrics, loss = w.evaluate(net)
    x, y = test_set.tensors
    with torch.no_grad():
        out = net(x)
    assert metrics["mae"] == pytest.approx(mae(out, y), rel=1e-6)
    assert metrics["mse"] == pytest.approx(float(((out - y) ** 2).mean()), rel=1e-6)
    assert loss == pytest.approx(metrics["mse"], rel=1e-6)
    first, _ = w.evaluate(net, limit=50)
    assert first["mae"] == pytest.approx(mae(out[:50], y[:50]), rel=1e-6)


def test_uneven_batches_are_weighted_by_their_size(monkeypatch):
    import transient_nb.training.workload as workload_module

    monkeypatch.setattr(workload_module, "EVAL_BATCH", 64)  # 90 items: batches of 64 and 26
    train_set, test_set = diabetes()
    w = Workload(Regressor, (train_set, test_set), loss="mse", metrics={"mae": mae})
    net = Regressor()
    metrics, _ = w.evaluate(net)
    x, y = test_set.tensors
    with torch.no_grad():
        assert metrics["mae"] == pytest.approx(mae(net(x), y), rel=1e-6)


def test_fixed_state_is_what_the_ps_never_holds_and_comes_back_bit_for_bit():
    net = DigitsNet()
    net.conv.weight.requires_grad_(False)
    fixed = fixed_state(net)
    assert sorted(fixed) == ["bn.num_batches_tracked", "conv.weight"]
    other = DigitsNet()
    load_fixed(other, fixed)
    assert torch.equal(other.conv.weight, net.conv.weight)


def test_a_workload_plugin_carries_the_workload_once_and_rebuilds_it_once():
    w = Workload(Regressor, diabetes(), loss="mse")
    plugin = WorkloadPlugin(cloudpickle.dumps(w), {"a": np.ones(2)})
    again = cloudpickle.loads(cloudpickle.dumps(plugin))  # as the scheduler sends it
    first, fixed = again.get()
    assert again.get()[0] is first and fixed["a"].tolist() == [1.0, 1.0]
    assert isinstance(first.build_model(), Regressor)


def test_import_paths_and_directions():
    assert import_path("math:pi", "model") > 3
    with pytest.raises(ValueError, match="module 'no_such_mod' cannot be imported"):
        import_path("no_such_mod:x", "model")
    with pytest.raises(ValueError, match="is not an import path"):
        import_path("math:", "data")
    assert lower_is_better("val_mae") and lower_is_better("error_rate")
    assert not lower_is_better("accuracy") and not lower_is_better("f1")
    assert lower_is_better("mine", "mse") and not lower_is_better("mine", "accuracy")


def test_an_instance_is_built_as_a_copy_with_its_weights():
    net = Regressor()
    w = Workload(net, diabetes(), loss="mse")
    built = w.build_model()
    assert built is not net
    for a, b in zip(built.state_dict().values(), net.state_dict().values(), strict=True):
        assert torch.equal(a, b)


# -- trained on real clusters --------------------------------------------------------------------------
@pytest.fixture
def tokmod(monkeypatch):
    """``tests/data`` importable here and on the workers (``tokmod:make_net``)."""
    monkeypatch.syspath_prepend(str(DATA))
    path = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", str(DATA) + (os.pathsep + path if path else ""))
    import tokmod

    return tokmod


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_your_own_models_and_data_train_to_learned_results(tokmod):
    """One cluster, three runs, each of a kind a user brings:

    - a regression with MSE: a class on a Dataset pair, AdamW on the PS, metrics mae and mse,
      stopped by ``stop_at`` on a lower-is-better metric;
    - a classification from integer tokens: model and data by import path (a factory);
    - images: a fine-tuned instance (its first layer frozen) on the built-in ``digits`` spec.
    """
    train_set, test_set = diabetes()
    x_test, y_test = test_set.tensors
    baseline = float(((y_test - y_test.mean()) ** 2).mean())  # predicting the mean
    with TransientCluster(workers=2, provisioning_delay=0, preemption="none") as cluster:
        cluster.wait_for_workers(timeout=180)
        reg = train(
            cluster,
            model=Regressor,
            data=(train_set, test_set),
            loss="mse",
            metrics={"mae": mae, "mse": "mse"},
            optimizer=functools.partial(torch.optim.AdamW, lr=1e-2),
            stop_at={"mae": 0.6},
            # A bound far beyond the steps it needs: the driver evaluates at its poll
            # (every 25 steps or more), and a fast host could reach a tight bound first.
            steps=20_000,
            batch_size=32,
            eval_every=25,
        )
        reg.wait(timeout=600)
        tok = train(
            cluster,
            model="tokmod:make_net",
            data="tokmod:make_data",
            optimizer="tokmod:optimizer",
            steps=400,
            batch_size=32,
            eval_every=100,
        )
        tok.wait(timeout=600)
        torch.manual_seed(0)
        net = DigitsNet()
        # The batch norm's scale, set to values of our own and frozen: it must stay as given
        # (a frozen random conv layer learned digits too slowly to judge the run by).
        with torch.no_grad():
            net.bn.weight.uniform_(0.5, 1.5)
        net.bn.weight.requires_grad_(False)
        frozen = net.bn.weight.detach().clone()
        # Checkpoints at steps 0 and 600 only (two are kept): the first holds where it started.
        img = train(
            cluster,
            model=net,
            data="digits",
            steps=600,
            batch_size=32,
            eval_every=100,
            checkpoint_every=1000,
        )
        img.wait(timeout=600)
    # The regression learned, and stopped when its MAE (lower is better) reached the bound.
    s = reg.summary()
    assert s["reason"] == "metric" and reg.stopped_by == "mae<=0.6"
    assert s["metrics"]["mae"] <= 0.6 and s["metrics"]["mse"] < 0.75 * baseline
    assert list(reg.history.columns)[-2:] == ["mae", "mse"]  # a column per metric
    started = next(e for e in reg.events() if e["kind"] == "train-started")
    assert (started["model"], started["loss"], list(started["metrics"])) == (
        "Regressor",
        "mse",
        ["mae", "mse"],
    )
    assert started["optimizer"].startswith("partial(AdamW") and started["parameters"] == 385
    # The user's module with the PS's newest weights (its final checkpoint: a few pushes may
    # have landed after the evaluation that stopped it), on the CPU, and it predicts.
    model = reg.model()
    final = load_state_dict(reg.id)
    assert all(torch.equal(v, final[k]) for k, v in model.state_dict().items())
    with torch.no_grad():
        assert mae(model(x_test), y_test) < 0.65
    # The tokens: learned well above chance (3 classes).
    assert tok.summary()["accuracy"] > 0.65
    assert tok.summary()["model"] == "tokmod:make_net"
    tok_net = load_model(tok.id)  # by the import path the checkpoint records
    assert isinstance(tok_net, tokmod.TokenNet)
    # The images: learned; the frozen layer is bit for bit as given, and the run started from
    # the instance's weights (its step-0 checkpoint holds them).
    assert img.summary()["accuracy"] > 0.85  # ten classes
    trained = img.model()
    assert torch.equal(trained.bn.weight, frozen)
    first = checkpoint.load_step(img.checkpoint_url, 0)
    assert first is not None
    fc = np.concatenate([sh["weights"] for sh in first.shards])
    trainable = np.concatenate(
        [p.detach().numpy().ravel() for p in net.parameters() if p.requires_grad]
    )
    assert np.array_equal(fc, trainable)
    assert torch.equal(load_state_dict(img.id)["bn.weight"], frozen)


def test_a_builtin_model_on_your_data_takes_its_classes_from_the_data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(20, 3, 8, 8, generator=g)
    y = torch.arange(20) % 4
    pair = (TensorDataset(x, y), TensorDataset(x[:5], y[:5]))
    w = Workload("resnet8", pair)
    assert w.num_classes() == 4  # one more than the largest target
    assert w.build_model().fc.out_features == 4

    class Named(TensorDataset):
        classes = ("a", "b", "c", "d", "e", "f")

    assert Workload("resnet8", (Named(x, y), pair[1])).num_classes() == 6
