"""Before renting anything: what a cluster would do for a model, in time and money.

:func:`estimate` counts the model's FLOPs per sample (forward, loss and backward, with
``torch.utils.flop_counter.FlopCounterMode``) and measures the bytes one step moves between a
worker and the PS (a push and its reply, serialised as Dask sends them). Each GPU type's step
rate is then its published peak FP32 throughput (the price catalog's ``peaks:``) times an
*efficiency* calibrated on the paper's measured step rates of its ResNet-32 (T2T's, 1.86M
parameters, batch 128: K80 4.56, P100 12.2, V100 15.6 steps/s), divided by the FLOPs of one step.
A small model does not go faster than its kernels can be launched: a step takes at least its
operator count times the time per operator of an eager ResNet-32 step on an H200, which is
launch-bound (11.1 ms at batch 128 as at 512, reference/measurements.md).
The PS serves at most the paper's 45 global steps/s for that model, a time per push of a fixed
part and a part that grows with the parameters
(:meth:`~transient_nb.training.emulation.Emulation.ps_service_s`), so a larger model saturates
it sooner and a second shard helps it more. A cluster of ``n`` workers then runs at
``min(n * rate, PS capacity)`` global steps/s; time and money follow from the catalog's prices.

A measured step rate (``measured={"t4": 11.0}``, or a finished run whose workers reported theirs)
replaces the estimate of its GPU type: every figure says which it is (``basis``).

Examples
--------
>>> est = estimate(model="resnet32-t2t", data="synthetic", workers={"k80": 8}, steps=64_000,
...                prices="paper-2019")
>>> row = est.frame.iloc[-1]
>>> int(row.workers), float(round(row.worker_steps_per_s, 2)), float(round(row.steps_per_s, 1))
(8, 4.56, 36.5)
>>> row.bottleneck
'workers'
"""

from __future__ import annotations

import functools
import html
import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch
from distributed.protocol import dumps as dask_dumps
from distributed.protocol import to_serialize
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.data import DataLoader
from torch.utils.flop_counter import FlopCounterMode

from transient_nb import config
from transient_nb.catalog.prices import PriceCatalog
from transient_nb.training.emulation import PAPER_STEPS_PER_S, parse_emulation
from transient_nb.training.flat import flat_layout
from transient_nb.training.spec import resolve
from transient_nb.training.workload import Workload, batch_size_of

#: The batch of the paper's measured step rates.
PAPER_BATCH = 128
#: Items of the batch whose FLOPs are counted (per sample: the count is linear in the batch).
COUNT_BATCH = 4
#: Machine type billed beside each GPU type where the catalog's default does not host it.
MACHINES = {"l4": "g2-standard-4", "a100-40gb": "a2-highgpu-1g"}


#: An eager ResNet-32 training step at batch 128 on one H200, launch-bound (seconds; the same
#: at batch 512), over its operators (:func:`count_step`): the least time one operator takes.
H200_RESNET32_STEP_S = 0.0111


class _Operators(TorchDispatchMode):
    """Counts the operators (kernels, on a GPU) that run."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.count += 1
        return func(*args, **(kwargs or {}))


def count_step(
    workload: Workload, model: torch.nn.Module, batch: int = COUNT_BATCH
) -> tuple[float, int]:
    """FLOPs per sample of one training step (forward, loss and backward, on ``batch`` items),
    and the operators the step runs."""
    x, y = next(iter(_batches(workload, batch)))
    model.train()
    with FlopCounterMode(display=False) as counter, _Operators() as ops:
        loss = workload.loss_fn()(model(x), y)
        loss.backward()
    model.zero_grad(set_to_none=True)
    return float(counter.get_total_flops()) / max(1, batch_size_of(y)), ops.count


def count_flops(workload: Workload, model: torch.nn.Module, batch: int = COUNT_BATCH) -> float:
    """FLOPs per sample of one training step (see :func:`count_step`)."""
    return count_step(workload, model, batch)[0]


@functools.lru_cache(maxsize=1)
def seconds_per_operator() -> float:
    """The least time one operator of a step takes: :data:`H200_RESNET32_STEP_S` over the
    operators of a ResNet-32 step."""
    workload = Workload("resnet32", "synthetic")
    torch.manual_seed(0)
    return H200_RESNET32_STEP_S / count_step(workload, workload.build_model())[1]


def _batches(workload: Workload, n: int) -> Any:
    if workload.builtin_data:
        return workload.train_batches(n, seed=0)
    train = workload.datasets()[0]
    return DataLoader(train, batch_size=min(n, len(train)), collate_fn=workload.collate_fn)


@functools.lru_cache(maxsize=1)
def reference_flops() -> float:
    """FLOPs per image of one training step of the paper's model (T2T ResNet-32, 32x32x3)."""
    workload = Workload("resnet32-t2t", "synthetic")
    torch.manual_seed(0)
    return count_flops(workload, workload.build_model())


def bytes_per_step(parameters: int, buffers: int, wire_dtype: str = "float32") -> int:
    """Bytes of one push (gradient and statistics) and its reply (weights and statistics), as
    Dask serialises them."""
    dtype = np.float16 if wire_dtype == "float16" else np.float32
    # Random values, as gradients are: zeros would compress to nothing on the wire.
    rng = np.random.default_rng(0)
    grad = rng.standard_normal(parameters).astype(dtype)
    bn = rng.standard_normal(buffers).astype(np.float32)
    push = {"grad": to_serialize(grad), "bn_delta": to_serialize(bn), "trainer": "w-0"}
    reply = {"result": (to_serialize(grad), to_serialize(bn), 0)}
    return sum(memoryview(f).nbytes for msg in (push, reply) for f in dask_dumps(msg))


def _peak(catalog: PriceCatalog, gpu: str) -> float | None:
    peak = catalog.peak_tflops(gpu)
    if peak is None and catalog.name != "gce-2025":
        peak = PriceCatalog.load("gce-2025").peak_tflops(gpu)
    return peak


def efficiencies(catalog: PriceCatalog) -> dict[str, float]:
    """Fraction of its peak FP32 throughput each GPU of the paper reached on the paper's model.

    Examples
    --------
    >>> {g: round(e, 3) for g, e in efficiencies(PriceCatalog.load("gce-2025")).items()}
    {'k80': 0.218, 'p100': 0.274, 'v100': 0.208}
    """
    work = reference_flops() * PAPER_BATCH
    out = {}
    for gpu, rate in PAPER_STEPS_PER_S.items():
        peak = _peak(catalog, gpu)
        if peak:
            out[gpu] = rate * work / (peak * 1e12)
    return out


def worker_rate(
    catalog: PriceCatalog,
    gpu: str,
    flops_per_sample: float,
    batch_size: int,
    operators: int = 0,
) -> tuple[float | None, str]:
    """Estimated steps/s of one ``gpu`` worker for a model, and its basis (None: no peak known).

    Examples
    --------
    >>> gce = PriceCatalog.load("gce-2025")
    >>> rate, basis = worker_rate(gce, "k80", reference_flops(), 128)
    >>> round(rate, 2), basis.startswith("4.37 TFLOPS")
    (4.56, True)
    """
    peak = _peak(catalog, gpu)
    if peak is None:
        return None, f"no peak throughput of {gpu} in catalog {catalog.name}"
    eff = efficiencies(catalog)
    e = eff.get(gpu, statistics.median(eff.values()))
    compute_s = flops_per_sample * batch_size / (peak * 1e12 * e)
    floor_s = operators * seconds_per_operator() if operators else 0.0
    how = (
        f"calibrated on the paper's {gpu.upper()} ResNet-32 rate"
        if gpu in eff
        else "the median of the paper's K80, P100 and V100 (not measured for this type)"
    )
    basis = f"{peak:g} TFLOPS FP32 peak (catalog {catalog.name}) x {e:.3f} efficiency ({how})"
    if floor_s > compute_s:
        basis += (
            f"; launch-bound: {operators} operators a step take at least {floor_s * 1e3:.2g} ms "
            "(an eager ResNet-32 step on an H200)"
        )
    return 1.0 / max(compute_s, floor_s), basis


def measured_from_text(text: str | None) -> dict[str, float] | None:
    """``--measured t4=11.5,v100=30`` (the CLI's and the magic's) as GPU type -> steps/s.

    Examples
    --------
    >>> measured_from_text("t4=11.5"), measured_from_text(None)
    ({'t4': 11.5}, None)
    """
    if not text:
        return None
    out = {}
    for item in (t.strip() for t in text.split(",") if t.strip()):
        gpu, _, value = item.partition("=")
        try:
            out[gpu.strip()] = float(value)
        except ValueError:
            raise ValueError(
                f"--measured {item!r}: write TYPE=STEPS_PER_S, e.g. t4=11.5."
            ) from None
    return out


def _measured(measured: Any) -> tuple[dict[str, float], str]:
    """GPU type -> steps/s of one worker, from a mapping or a run (its workers' own rates)."""
    if measured is None:
        return {}, ""
    if isinstance(measured, Mapping) and "by_gpu" not in measured:
        return {str(k).lower(): float(v) for k, v in measured.items()}, "given"
    summary = measured.summary() if hasattr(measured, "summary") else dict(measured)
    rates = {
        str(g).lower(): float(row["steps_per_s"]) / max(1, int(row["workers"]))
        for g, row in (summary.get("by_gpu") or {}).items()
        if row.get("steps_per_s")
    }
    return rates, f"measured by run {summary.get('run')}"


@dataclass
class Estimate:
    """What :func:`estimate` found: one row per GPU type and cluster size, and the basis.

    Attributes
    ----------
    rows
        Dicts with ``gpu``, ``workers``, ``worker_steps_per_s``, ``steps_per_s`` (global),
        ``bottleneck`` (``"workers"`` or ``"PS"``), ``hours``, ``dollars_per_hour``, ``dollars``,
        ``source`` (``"estimate"`` or ``"measured"``).
    parameters, flops_per_sample, bytes_per_step
        The model's trainable parameters, FLOPs of one sample's training step, and bytes a step
        moves between a worker and the PS.
    operators, floor_s
        Operators one training step runs, and the least time they take on a GPU (launches).
    ps_steps_per_s
        Global steps/s the PS (with ``shards`` shards) serves at most for this model.
    basis
        GPU type -> how its rate was found (peak x efficiency, or measured).
    """

    rows: list[dict[str, Any]]
    parameters: int
    flops_per_sample: float
    bytes_per_step: int
    ps_steps_per_s: float
    operators: int
    floor_s: float
    shards: int
    steps: int
    batch_size: int
    catalog: str
    basis: dict[str, str] = field(default_factory=dict)

    @property
    def frame(self) -> pd.DataFrame:
        """:attr:`rows` as a DataFrame."""
        return pd.DataFrame(self.rows)

    def text(self) -> str:
        """The table and its basis, as text."""
        head = (
            f"{self.parameters:,} parameters, {self.flops_per_sample / 1e9:.4g} GFLOP per sample "
            f"(training step), {self.bytes_per_step / 1e6:.3g} MB per step to and from the PS; "
            f"the PS ({self.shards} shard{'s' if self.shards > 1 else ''}) serves at most "
            f"{self.ps_steps_per_s:.1f} steps/s; {self.steps:,} steps of batch "
            f"{self.batch_size}, prices {self.catalog}"
        )
        table = self.frame.to_string(index=False, float_format=lambda v: f"{v:.4g}")
        basis = "\n".join(f"  {g}: {b}" for g, b in self.basis.items())
        return f"{head}\n{table}\nbasis:\n{basis}"

    def __repr__(self) -> str:
        return self.text()

    def _repr_html_(self) -> str:
        head, _, _ = self.text().partition("\n")
        basis = "".join(
            f"<li>{html.escape(g)}: {html.escape(b)}</li>" for g, b in self.basis.items()
        )
        return (
            f"<p>{html.escape(head)}</p>{self.frame.to_html(index=False, float_format='%.4g')}"
            f"<p>basis:</p><ul>{basis}</ul>"
        )


def _hourly(catalog: PriceCatalog, gpu: str, zone: str, spot: bool) -> float:
    """Dollars per hour of one worker VM of ``gpu`` (nan: the catalog does not price it)."""
    for machine in (MACHINES.get(gpu), str(config.get("machine-type"))):
        if machine is None:
            continue
        try:
            return catalog.worker_price(gpu, machine, zone).rate(spot)
        except ValueError:
            continue
    return math.nan


def _sizes(n: int) -> list[int]:
    sizes, k = {n}, 1
    while k < n:
        sizes.add(k)
        k *= 2
    return sorted(sizes)


def _model_figures(workload: Workload, shards: int, wire_dtype: str) -> dict[str, Any]:
    """The model's figures of an :class:`Estimate` (its fields of the same names): parameters,
    FLOPs per sample, operators and their least time, bytes a step moves, and the steps/s the
    PS (``shards`` shards) serves at most."""
    torch.manual_seed(0)
    net = workload.build_model()
    params, buffers = flat_layout(net)
    parameters = sum(p.numel() for p in params)
    flops, operators = count_step(workload, net)
    emu = parse_emulation("paper")
    assert emu is not None
    service = emu.ps_service_s(shards, parameters=parameters)
    assert service is not None
    return {
        "parameters": parameters,
        "flops_per_sample": flops,
        "operators": operators,
        "floor_s": operators * seconds_per_operator(),
        "bytes_per_step": bytes_per_step(parameters, sum(b.numel() for b in buffers), wire_dtype),
        "ps_steps_per_s": 1.0 / service,
    }


def estimate(
    model: Any = None,
    data: Any = None,
    workers: Mapping[str, int] | None = None,
    steps: int = 64_000,
    *,
    batch_size: int = 128,
    shards: int = 1,
    loss: Any = None,
    collate_fn: Any = None,
    measured: Any = None,
    prices: str | None = None,
    zone: str | None = None,
    spot: bool = True,
    wire_dtype: str = "float32",
) -> Estimate:
    """What a cluster would do for ``model`` on ``data``: time and money per GPU type and size,
    and whether the PS is the bottleneck; nothing is started.

    Parameters
    ----------
    model, data, loss, collate_fn
        As :func:`~transient_nb.train` takes them (one batch of ``data`` is run to count FLOPs).
    workers
        GPU type -> the largest cluster to consider, e.g. ``{"t4": 4, "v100": 2}``; each type
        is estimated at 1, 2, 4, ... up to that size (default: the configuration's GPU, 4).
    steps, batch_size, shards
        Global steps to train, items per worker step, PS shards.
    measured
        Steps/s of one worker per GPU type (``{"t4": 11.0}``), or a run (its workers' rates by
        GPU type): these replace the estimate of their type.
    prices, zone, spot
        The price catalog (default: the configuration's), the zone priced, Spot or on-demand
        workers (the PS host is on demand).
    wire_dtype
        What a push and its reply carry (``"float32"`` or ``"float16"``).

    Returns
    -------
    Estimate
        ``.frame`` (a DataFrame), ``.basis``, and the model's figures.

    Examples
    --------
    >>> est = estimate("resnet32", "synthetic", {"v100": 8}, steps=64_000)
    >>> est.frame["workers"].tolist(), est.frame["bottleneck"].tolist()
    ([1, 2, 4, 8], ['workers', 'workers', 'PS', 'PS'])
    """
    workload = resolve(model, data, loss=loss, collate_fn=collate_fn)
    catalog = PriceCatalog.load(prices)
    zone = str(config.get("zone", override_with=zone))
    workers = dict(workers or {str(config.get("gpu")): 4})
    for gpu, n in workers.items():
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"workers[{gpu!r}]={n!r} must be a whole number of at least 1.")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps={steps!r} must be a whole number of at least 1.")
    figures = _model_figures(workload, shards, wire_dtype)
    flops, operators = figures["flops_per_sample"], figures["operators"]
    ps_capacity = figures["ps_steps_per_s"]
    rates, source = _measured(measured)
    ps_price = catalog.machine_price(str(config.get("ps-machine-type")), zone).rate(False)
    rows: list[dict[str, Any]] = []
    basis: dict[str, str] = {}
    for gpu, largest in workers.items():
        gpu = gpu.lower()
        estimated, how = worker_rate(catalog, gpu, flops, batch_size, operators)
        if gpu in rates:
            rate, kind = rates[gpu], "measured"
            basis[gpu] = f"{rate:.4g} steps/s per worker, {source}"
        elif estimated is not None:
            rate, kind = estimated, "estimate"
            basis[gpu] = how
        else:
            raise ValueError(
                f"No peak throughput for GPU type {gpu!r} in catalog {catalog.name!r} and no "
                f"measured rate: pass measured={{{gpu!r}: STEPS_PER_S}} or a catalog with "
                f"'peaks: {gpu}: ...'."
            )
        hourly_one = _hourly(catalog, gpu, zone, spot)
        if math.isnan(hourly_one):
            basis[gpu] += f"; not priced in {zone} by catalog {catalog.name}: no dollars"
        for n in _sizes(largest):
            demand = n * rate
            served = min(demand, ps_capacity)
            hours = steps / served / 3600.0
            hourly = n * hourly_one + shards * ps_price
            rows.append(
                {
                    "gpu": gpu,
                    "workers": n,
                    "worker_steps_per_s": rate,
                    "steps_per_s": served,
                    "bottleneck": "PS" if demand > ps_capacity else "workers",
                    "hours": hours,
                    "dollars_per_hour": hourly,
                    "dollars": hourly * hours,
                    "source": kind,
                }
            )
    return Estimate(
        rows=rows,
        basis=basis,
        steps=steps,
        batch_size=batch_size,
        catalog=catalog.name,
        shards=shards,
        **figures,
    )


__all__ = ["Estimate", "bytes_per_step", "count_flops", "efficiencies", "estimate"]
