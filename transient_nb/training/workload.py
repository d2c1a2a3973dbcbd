"""What a run trains: the model, the data, the loss and the metrics, as every process runs them.

A :class:`Workload` is what :func:`~transient_nb.training.spec.resolve` makes of what the user
gave ``train()``: one of the built-in names (``"resnet32"`` on ``"synthetic"``, the paper's
reference workload), or the user's own ``nn.Module`` (an instance, a zero-argument factory or an
import path ``"package.module:attr"``), their own ``(train, test)`` pair of map-style
``Dataset`` objects (a pair, a factory that builds it where it runs, or an import path), a loss
and metrics. It is what the driver evaluates with, and what every trainer builds its model and
draws its batches from: it travels to the workers once, by value (cloudpickle, as Dask ships
functions), so things defined in a notebook cell work on a worker that never saw the notebook.

The built-in names keep exactly their old code path: :func:`~transient_nb.training.models.build_model`,
:class:`~transient_nb.training.batches.BatchStream` with the paper's augmentation, cross entropy and
:func:`~transient_nb.training.models.evaluate`.
"""

from __future__ import annotations

import copy
import importlib
import itertools
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import cloudpickle
import numpy as np
import torch
import torch.nn.functional as F
from distributed import WorkerPlugin, get_worker
from torch import nn
from torch.utils.data import DataLoader, Dataset, RandomSampler, Subset

from transient_nb.training.data import DATA_KINDS, BatchStream, load_dataset, to_tensor
from transient_nb.training.flat import flat_layout
from transient_nb.training.models import MODELS, build_model, evaluate

#: Losses known by name.
LOSSES = ("cross_entropy", "mse")
#: Metrics known by name.
METRICS = ("accuracy", "mse")
#: Test-set batch of an evaluation (a short last batch is weighted by its size).
EVAL_BATCH = 256
#: Words that make a metric "lower is better" when its direction is not given (``stop_at``).
LOWER_IS_BETTER = ("loss", "error", "err", "mse", "mae", "rmse", "nll", "perplexity", "distance")

#: What a metric callable is: ``(output, target) -> float``.
Metric = Callable[[Any, Any], Any]


def import_path(text: str, what: str) -> Any:
    """The object that ``"package.module:attr"`` names, or a ValueError that says what failed.

    Examples
    --------
    >>> import_path("math:pi", "model") > 3
    True
    >>> import_path("math:tau_x", "model")
    Traceback (most recent call last):
    ...
    ValueError: model='math:tau_x': module 'math' has no attribute 'tau_x'; give 'package.module:attr' of an importable module.
    """
    module, sep, attr = text.partition(":")
    if not sep or not module or not attr:
        raise ValueError(
            f"{what}={text!r} is not an import path: write 'package.module:attr' "
            "(e.g. 'mypkg.nets:make_net')."
        )
    try:
        obj: Any = importlib.import_module(module)
    except Exception as e:
        raise ValueError(
            f"{what}={text!r}: module {module!r} cannot be imported ({type(e).__name__}: {e}); "
            "install it or put it on PYTHONPATH where train() and the workers run."
        ) from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(
                f"{what}={text!r}: module {module!r} has no attribute {attr!r}; give "
                "'package.module:attr' of an importable module."
            )
        obj = getattr(obj, part)
    return obj


def is_builtin_data(data: Any) -> bool:
    """Whether ``data`` is one of the built-in data specs (``synthetic``, ``digits``, ``cifar10:...``).

    Examples
    --------
    >>> is_builtin_data("cifar10:/data"), is_builtin_data("mypkg.data:make"), is_builtin_data(3)
    (True, False, False)
    """
    return isinstance(data, str) and data.partition(":")[0] in DATA_KINDS


def lower_is_better(name: str, metric: Any = None) -> bool:
    """The direction of a metric: ``accuracy`` and unknown names go up, loss-like names down.

    A metric is loss-like when it is ``"mse"``, ``test_loss``, or its name holds one of
    :data:`LOWER_IS_BETTER` as a word (``val_mae``, ``error_rate``); ``stop_at`` can say it
    outright with ``"<=0.3"`` or ``">=0.9"``.

    Examples
    --------
    >>> lower_is_better("mae"), lower_is_better("accuracy"), lower_is_better("f1")
    (True, False, False)
    """
    if metric == "mse" or name == "test_loss":
        return True
    if metric == "accuracy":
        return False
    words = name.lower().replace("-", "_").split("_")
    return any(w in LOWER_IS_BETTER for w in words)


def _accuracy(output: torch.Tensor, target: torch.Tensor) -> float:
    return float((output.argmax(dim=1) == target).float().mean())


def _mse(output: torch.Tensor, target: torch.Tensor) -> float:
    return float(F.mse_loss(output, target.to(output.dtype)))


def _mse_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(output, target.to(output.dtype))


def _infinite(loader: DataLoader) -> Iterator[Any]:
    while True:  # one pass per epoch; a new permutation each time (the sampler's generator)
        yield from loader


def to_device(value: Any, device: str | torch.device) -> Any:
    """``value`` (a tensor, or tuples, lists and dicts of them) on ``device``."""
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=True)
    if isinstance(value, (list, tuple)):
        return type(value)(to_device(v, device) for v in value)
    if isinstance(value, Mapping):
        return {k: to_device(v, device) for k, v in value.items()}
    return value


def batch_size_of(value: Any) -> int:
    """How many items a collated batch holds (its first tensor's first dimension)."""
    if isinstance(value, torch.Tensor):
        return int(value.shape[0]) if value.dim() else 1
    if isinstance(value, (list, tuple)) and value:
        return batch_size_of(value[0])
    if isinstance(value, Mapping) and value:
        return batch_size_of(next(iter(value.values())))
    return len(value)


@dataclass
class Workload:
    """The model, data, loss and metrics of a run (see :func:`~transient_nb.training.spec.resolve`).

    Parameters
    ----------
    model
        A built-in name, an import path, an ``nn.Module`` or a zero-argument factory.
    data
        A built-in spec, an import path, a ``(train, test)`` pair or a zero-argument factory.
    loss
        ``"cross_entropy"``, ``"mse"`` or ``(output, target) -> scalar tensor``.
    metrics
        Name -> ``"accuracy"``, ``"mse"`` or ``(output, target) -> float``.
    optimizer
        ``"sgd"`` (the paper's, on the PS) or a ``torch.optim`` class or factory.
    collate_fn, num_workers
        Passed to the ``DataLoader`` of a user's data set.
    model_name, data_name
        How events, panels and checkpoints name them.

    Examples
    --------
    >>> w = Workload("resnet8", "digits")
    >>> w.builtin, w.model_name, sorted(w.metrics)
    (True, 'resnet8', ['accuracy'])
    >>> sum(p.numel() for p in w.build_model().parameters())
    78042
    """

    model: Any = "resnet32"
    data: Any = "synthetic"
    loss: Any = "cross_entropy"
    metrics: dict[str, Any] = field(default_factory=lambda: {"accuracy": "accuracy"})
    optimizer: Any = "sgd"
    collate_fn: Any = None
    num_workers: int = 0
    model_name: str = ""
    data_name: str = ""
    #: Caches of this process (never pickled): the data sets, the model source resolved.
    _cache: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.model_name = self.model_name or (
            self.model if isinstance(self.model, str) else _name_of(self.model)
        )
        self.data_name = self.data_name or (
            self.data if isinstance(self.data, str) else _name_of(self.data)
        )

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_cache"] = {}
        return state

    # -- what kind of thing each part is --------------------------------------------------------------
    @property
    def builtin_model(self) -> bool:
        """The model is one of :data:`~transient_nb.training.models.MODELS`."""
        return isinstance(self.model, str) and self.model in MODELS

    @property
    def builtin_data(self) -> bool:
        """The data is one of the built-in specs."""
        return is_builtin_data(self.data)

    @property
    def builtin(self) -> bool:
        """Everything is the reference workload's kind: built-in model and data, cross entropy,
        accuracy, the paper's SGD (the code path of before custom workloads, unchanged)."""
        return (
            self.builtin_model
            and self.builtin_data
            and self.loss == "cross_entropy"
            and self.metrics == {"accuracy": "accuracy"}
            and self.optimizer == "sgd"
            and self.collate_fn is None
        )

    @property
    def model_by_value(self) -> bool:
        """Whether the model must travel as an object (an instance or a callable)."""
        return not isinstance(self.model, str)

    @property
    def model_ref(self) -> str | None:
        """A name that rebuilds the model anywhere (a built-in name or an import path), or None
        when the model travels by value."""
        return self.model if isinstance(self.model, str) else None

    # -- the data -------------------------------------------------------------------------------------
    def datasets(self) -> Any:
        """The ``(train, test)`` pair, made once per process (a factory runs here); what a
        factory returned, unchecked (see :func:`~transient_nb.training.spec.preflight`)."""
        if "data" not in self._cache:
            source = self.data
            if self.builtin_data:
                pair: Any = (self.train_set(), self.test_set())
            else:
                if isinstance(source, str):
                    source = import_path(source, "data")
                pair = source() if callable(source) and not isinstance(source, Dataset) else source
            # A (train, test) list is a pair too; anything else stays as it is, for the message.
            two = isinstance(pair, (list, tuple)) and len(pair) == 2
            self._cache["data"] = tuple(pair) if two else pair
        return self._cache["data"]

    def train_set(self) -> Any:
        """The training set (a built-in set alone: a trainer never reads the test split)."""
        if self.builtin_data:
            if "train" not in self._cache:  # read once (load_dataset caches, but the once is ours)
                self._cache["train"] = load_dataset(self.data, train=True)
            return self._cache["train"]
        return self.datasets()[0]

    def test_set(self) -> Any:
        """The test set."""
        if self.builtin_data:
            return load_dataset(self.data, train=False)
        return self.datasets()[1]

    def num_classes(self) -> int:
        """Classes of a classification set: the built-in set's; else ``classes`` of the
        training set (torchvision's convention), else one more than its largest target."""
        train = self.train_set()
        if self.builtin_data:
            return int(train.num_classes)
        classes = getattr(train, "classes", None)
        if classes is not None:
            return len(classes)
        top = -1
        for i in range(min(len(train), 10_000)):
            target = train[i][1]
            top = max(top, int(torch.as_tensor(target).max()))
        return top + 1

    def train_batches(self, batch_size: int, seed: int) -> Iterator[tuple[Any, Any]]:
        """Endless training batches, drawn with ``seed`` (each worker its own)."""
        train = self.train_set()
        if self.builtin_data:
            return BatchStream(train, batch_size, seed=seed)
        generator = torch.Generator()
        generator.manual_seed(int(seed))
        loader = DataLoader(
            train,
            batch_size=batch_size,
            sampler=RandomSampler(train, generator=generator),
            drop_last=len(train) >= batch_size,  # full batches, as the built-in stream's
            collate_fn=self.collate_fn,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
        )
        return _infinite(loader)

    def test_batches(self, limit: int | None = None) -> Iterator[tuple[Any, Any]]:
        """The test set (its first ``limit`` items) in batches of :data:`EVAL_BATCH`."""
        test = self.test_set()
        if self.builtin_data:
            n = len(test) if limit is None else min(len(test), limit)
            x, y = to_tensor(test.images[:n]), torch.from_numpy(np.array(test.labels[:n], np.int64))
            for a in range(0, n, EVAL_BATCH):
                yield x[a : a + EVAL_BATCH], y[a : a + EVAL_BATCH]
            return
        subset = test if limit is None or limit >= len(test) else Subset(test, range(limit))
        yield from DataLoader(subset, batch_size=EVAL_BATCH, collate_fn=self.collate_fn)

    # -- the model ------------------------------------------------------------------------------------
    def build_model(self) -> nn.Module:
        """A fresh model on the CPU (an instance: a copy, with its weights)."""
        if self.builtin_model:
            return build_model(self.model, num_classes=self.num_classes())
        source = self.model
        if isinstance(source, str):
            source = import_path(source, "model")
        if isinstance(source, nn.Module):
            return copy.deepcopy(source)
        return source()

    # -- loss and metrics -----------------------------------------------------------------------------
    def loss_fn(self) -> Callable[[Any, Any], torch.Tensor]:
        """The training loss ``(output, target) -> scalar tensor``."""
        if self.loss == "cross_entropy":
            return F.cross_entropy
        if self.loss == "mse":
            return _mse_loss
        return self.loss

    def metric_fns(self) -> dict[str, Metric]:
        """Name -> ``(output, target) -> float`` of every metric."""
        known = {"accuracy": _accuracy, "mse": _mse}
        return {name: known[m] if isinstance(m, str) else m for name, m in self.metrics.items()}

    def evaluate(
        self, model: nn.Module, limit: int | None = None, device: str = "cpu"
    ) -> tuple[dict[str, float], float]:
        """Every metric over the test set (each batch weighted by its size) and the test loss.

        The model runs in eval mode under ``no_grad``; its mode is restored afterwards.
        """
        if self.builtin:  # the reference workload: the evaluation of before, unchanged
            key = f"test-{limit}"
            if key not in self._cache:
                test = self.test_set()
                n = len(test) if limit is None else min(len(test), limit)
                self._cache[key] = (to_tensor(test.images[:n]), test.labels[:n])
            acc, loss = evaluate(model, *self._cache[key])
            return {"accuracy": float(acc)}, float(loss)
        fns = self.metric_fns()
        loss_fn = self.loss_fn()
        totals = dict.fromkeys(fns, 0.0)
        total_loss, seen = 0.0, 0
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                for x, y in self.test_batches(limit):
                    x, y = to_device(x, device), to_device(y, device)
                    out = model(x)
                    n = batch_size_of(y)
                    total_loss += float(loss_fn(out, y)) * n
                    for name, fn in fns.items():
                        totals[name] += float(fn(out, y)) * n
                    seen += n
        finally:
            model.train(was_training)
        if seen == 0:
            raise ValueError(f"The test set of {self.data_name} is empty: nothing to evaluate.")
        return {k: v / seen for k, v in totals.items()}, total_loss / seen

    def describe(self) -> dict[str, Any]:
        """Plain facts for events and checkpoints: names of the parts."""
        return {
            "model": self.model_name,
            "data": self.data_name,
            "loss": self.loss if isinstance(self.loss, str) else _name_of(self.loss),
            "metrics": list(self.metrics),
            "optimizer": self.optimizer
            if isinstance(self.optimizer, str)
            else _name_of(self.optimizer),
        }


def _name_of(obj: Any) -> str:
    """A short human name: ``Net``, ``make_net``, ``partial(AdamW, lr=0.001)``, ``pair``."""
    func = getattr(obj, "func", None)
    if func is not None and hasattr(obj, "keywords"):  # functools.partial
        kw = ", ".join(f"{k}={v!r}" for k, v in (obj.keywords or {}).items())
        return f"partial({_name_of(func)}{', ' if kw else ''}{kw})"
    if isinstance(obj, nn.Module):
        return type(obj).__name__
    if isinstance(obj, (tuple, list)):
        return "(" + ", ".join(type(x).__name__ for x in itertools.islice(obj, 2)) + ")"
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    return str(name) if name else type(obj).__name__


def fixed_state(model: nn.Module) -> dict[str, np.ndarray]:
    """What the PS never holds, by state-dict name: frozen parameters and non-float buffers.

    Every trainer loads these from the driver's build, so frozen weights are the same
    everywhere (a factory's random init is not) and stay bit for bit as given.

    Examples
    --------
    >>> net = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    >>> net[0].bias.requires_grad_(False)  # doctest: +ELLIPSIS
    Parameter containing:...
    >>> sorted(fixed_state(net))
    ['0.bias', '1.num_batches_tracked']
    """
    params, buffers = flat_layout(model)
    flat = {id(t) for t in [*params, *buffers]}
    return {
        name: t.detach().cpu().numpy().copy()
        for name, t in model.state_dict(keep_vars=True).items()
        if isinstance(t, torch.Tensor) and id(t) not in flat
    }


def load_fixed(model: nn.Module, fixed: Mapping[str, np.ndarray]) -> None:
    """Copy :func:`fixed_state`'s arrays into ``model`` (in place, on its device)."""
    state = model.state_dict(keep_vars=True)
    with torch.no_grad():
        for name, value in fixed.items():
            t = state[name]
            t.copy_(torch.from_numpy(np.array(value, copy=True)).to(t.device))


class WorkloadPlugin(WorkerPlugin):
    """A run's workload on every worker, present and future: shipped once per worker, not
    inside every task (a replacement gets it when it joins, from the scheduler).

    Parameters
    ----------
    blob
        The :class:`Workload`, cloudpickled (:func:`~transient_nb.training.spec.payload`).
    fixed
        :func:`fixed_state` of the driver's build (every trainer loads it).

    Examples
    --------
    >>> import cloudpickle
    >>> plugin = WorkloadPlugin(cloudpickle.dumps(Workload("resnet8", "digits")), {})
    >>> plugin.get()[0].model_name
    'resnet8'
    """

    def __init__(self, blob: bytes, fixed: Mapping[str, np.ndarray]):
        self.blob = blob
        self.fixed = dict(fixed)
        self._workload: Workload | None = None
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {"blob": self.blob, "fixed": self.fixed}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["blob"], state["fixed"])  # type: ignore[misc]

    def get(self) -> tuple[Workload, dict[str, np.ndarray]]:
        """The workload (rebuilt once per process) and the fixed arrays."""
        with self._lock:
            if self._workload is None:
                self._workload = cloudpickle.loads(self.blob)
        return self._workload, self.fixed


def plugin_name(run: str) -> str:
    """The name under which a run's :class:`WorkloadPlugin` is registered."""
    return f"transient-workload-{run}"


def from_worker(run: str) -> tuple[Workload, dict[str, np.ndarray]]:
    """The run's workload on this worker (its :class:`WorkloadPlugin`)."""
    plugin = get_worker().plugins.get(plugin_name(run))
    if not isinstance(plugin, WorkloadPlugin):
        raise RuntimeError(
            f"this worker has no workload of run {run} (its plugin {plugin_name(run)} is missing)"
        )
    return plugin.get()


def for_trainer(
    workload: Workload | str | None, run: str, model: str, data: str
) -> tuple[Workload, dict[str, np.ndarray]]:
    """What a trainer trains and the fixed arrays it loads: a :class:`Workload` as is,
    ``"plugin"`` from this worker's :class:`WorkloadPlugin`, None the built-in ``model`` on
    ``data`` (no fixed arrays: it builds them as ever).

    Examples
    --------
    >>> for_trainer(None, "run-1", "resnet8", "digits")[0].builtin
    True
    """
    if isinstance(workload, Workload):
        return workload, {}
    if workload == "plugin":
        return from_worker(run)
    return Workload(model, data), {}
