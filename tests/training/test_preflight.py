"""The checks before anything is spent: what passes is counted, what cannot travel is refused,
and on a real cluster a refused run has started nothing and left nothing. (Each mistake's
message: tests/training/test_spec.py, through ``check_train_args``.)"""

from __future__ import annotations

import functools
import sys
from typing import Any

import cloudpickle
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from tests.training.test_spec import BAD, linear, pairs
from transient_nb import TransientCluster, train
from transient_nb.training import preflight
from transient_nb.training.preflight import dumps
from transient_nb.training.spec import check_train_args, check_workload

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def test_a_data_pair_above_the_limit_is_refused_with_a_pointer_to_the_factory(monkeypatch):
    monkeypatch.setattr(preflight, "DATA_BY_VALUE_LIMIT", 2**20)  # the 200 MB rule, at 1 MB
    big = TensorDataset(torch.zeros(70_000, 4), torch.zeros(70_000, 1))  # about 1.4 MB
    with pytest.raises(ValueError, match=r"data is 1 MB pickled, above the 1 MB .*data=make_data"):
        check_train_args(model=linear(), data=(big, big), loss="mse", batch_size=16)
    # A factory is not shipped by value: any size goes (it builds the data where it runs).
    check_train_args(model=linear(), data=lambda: (big, big), loss="mse", batch_size=16)


def test_what_passes_is_counted_and_the_directions_are_said() -> None:
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    net[0].weight.requires_grad_(False)
    hp, checked = check_workload(
        model=net,
        data=pairs(),
        loss="mse",
        metrics={"mae": lambda o, y: float((o - y).abs().mean()), "r2": lambda o, y: 0.5},
        stop_at={"mae": 0.3, "r2": "0.9"},
        optimizer=functools.partial(torch.optim.AdamW, lr=1e-3),
        batch_size=16,
    )
    assert hp.batch_size == 16
    assert (checked.parameters, checked.frozen) == (8 + 9, 32)
    assert checked.stop_at == {"mae": ("<=", 0.3), "r2": (">=", 0.9)}
    assert checked.data_bytes > 0
    # The instance is untouched by the check (its forward ran on a copy).
    assert net[0].weight.grad is None


def test_the_builtin_names_are_checked_without_reading_their_data(monkeypatch, tmp_path) -> None:
    import numpy as np

    import transient_nb.training.workload as workload_module
    from transient_nb.training.data import write_cifar10_files

    x, y = np.zeros((10, 32, 32, 3), np.uint8), np.arange(10)
    path = write_cifar10_files(tmp_path, x, y, x[:5], y[:5])

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the data was read")

    monkeypatch.setattr(workload_module, "load_dataset", refuse)
    _, checked = check_workload(model="resnet32", data=f"cifar10:{path}", steps=5)
    assert checked.parameters == 466_906  # counted without a batch: the reference workload
    with pytest.raises(ValueError, match="CIFAR-10 location '/nowhere' does not exist"):
        check_workload(model="resnet32", data="cifar10:/nowhere")  # the spec is still checked


def test_what_cannot_travel_is_named_with_what_to_do():
    import threading

    lock = threading.Lock()
    with pytest.raises(ValueError, match=r"`metric` cannot be sent to the workers \(TypeError"):
        dumps(lambda o, y: lock, "metric")
    on_meta = torch.zeros(2, device="meta")
    with pytest.raises(ValueError, match=r"`data` captured a meta tensor \(on meta\)"):
        dumps((on_meta, on_meta), "data")
    assert cloudpickle.loads(dumps({"a": 1}, "data")) == {"a": 1}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_bad_input_on_a_real_cluster_starts_nothing_and_leaves_nothing() -> None:
    with TransientCluster(workers=1, provisioning_delay=0, preemption="none") as cluster:
        cluster.wait_for_workers(timeout=180)
        requested = [e for e in cluster.monitor.events if e["kind"] == "requested"]
        for kwargs, message in BAD[:4] + BAD[16:20] + BAD[-5:-2]:  # a sample of each kind
            with pytest.raises(ValueError, match=message):
                train(cluster, **{"batch_size": 16, "steps": 10, **kwargs})
        events = list(cluster.monitor.events)
        scheduler = cluster.scheduler
        assert [e for e in events if e["kind"] == "train-started"] == []
        # No VM asked for, no actor or task created, no workload shipped to a worker.
        assert [e for e in events if e["kind"] == "requested"] == requested
        assert len(scheduler.tasks) == 0
        assert not [n for n in scheduler.worker_plugins if n.startswith("transient-workload")]
        # And the cluster still trains (a good run after the bad ones).
        run = train(cluster, model=linear(), data=pairs(), loss="mse", steps=20, batch_size=16)
        run.wait(timeout=300)
        assert run.summary()["steps"] >= 20
        assert not [n for n in scheduler.worker_plugins if n.startswith("transient-workload")]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_captured_cuda_tensor_is_named_on_a_gpu_machine():
    """The issue's own example, with a real CUDA tensor (the meta device stands for it above)."""
    w = torch.zeros(1, 4, device="cuda")

    def make() -> nn.Module:
        assert w is not None
        return nn.Linear(4, 1)

    with pytest.raises(ValueError, match=r"`model` captured a CUDA tensor \(on cuda:0\): build it"):
        check_train_args(model=make, data=pairs(), loss="mse", batch_size=16)
    with pytest.raises(ValueError, match=r"`model` captured a CUDA tensor \('weight' on cuda:0\)"):
        check_train_args(model=nn.Linear(4, 1).cuda(), data=pairs(), loss="mse", batch_size=16)
