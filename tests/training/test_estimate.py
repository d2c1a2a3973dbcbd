"""estimate(): against the paper's ResNet-32 (its calibration point, and what the paper saw of the
PS), and against a second model whose CPU step time is measured here."""

from __future__ import annotations

import math
import statistics
import sys
import time

import cloudpickle
import pytest
import torch
from torch import nn

from tests.conftest import benchmark
from transient_nb import estimate
from transient_nb.training.emulation import PAPER_STEPS_PER_S
from transient_nb.training.estimate import (
    bytes_per_step,
    count_step,
    measured_from_text,
    worker_rate,
)
from transient_nb.training.workload import Workload

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def test_the_papers_model_at_its_measured_rates_and_its_ps_plateau():
    """The calibration point: the paper's model at batch 128 steps at the paper's K80, P100 and
    V100 rates; the PS (the paper's 45 steps/s for this model) caps what more workers add, as the
    paper saw: K80s linear to 8 (36/s), P100s and V100s flat from 4 on, a second PS 1.75x."""
    est = estimate(
        "resnet32-t2t", "synthetic", {"k80": 8, "p100": 8, "v100": 8}, 64_000, prices="paper-2019"
    )
    rows = {(r["gpu"], r["workers"]): r for r in est.rows}
    for gpu, rate in PAPER_STEPS_PER_S.items():
        assert rows[(gpu, 1)]["worker_steps_per_s"] == pytest.approx(rate, rel=1e-9)
        assert "calibrated on the paper's" in est.basis[gpu]
    assert est.parameters == 1_857_722
    assert est.ps_steps_per_s == pytest.approx(45.0)
    assert rows[("k80", 8)]["steps_per_s"] == pytest.approx(8 * 4.56)
    assert rows[("k80", 8)]["bottleneck"] == "workers"
    assert rows[("p100", 4)]["steps_per_s"] == rows[("v100", 8)]["steps_per_s"] == 45.0
    assert rows[("p100", 4)]["bottleneck"] == "PS"
    # Time and money of the paper's run on 4 K80 (64K steps at 18.2/s: about 1 h; the paper
    # took 1.05 h with revocations): at its preemptible prices with the on-demand PS.
    k4 = rows[("k80", 4)]
    assert k4["hours"] == pytest.approx(64_000 / (4 * 4.56) / 3600)
    assert k4["dollars"] == pytest.approx(k4["hours"] * (4 * 0.256 + 0.143))
    two = estimate("resnet32-t2t", "synthetic", {"v100": 8}, prices="paper-2019", shards=2)
    assert two.ps_steps_per_s == pytest.approx(45.0 * 1.75)  # the paper: ~80 with a second PS


def test_the_flops_and_bytes_are_counted_not_assumed():
    w = Workload("resnet32", "synthetic")
    flops, operators = count_step(w, w.build_model())
    assert flops / 1e9 == pytest.approx(0.414, rel=0.01)  # reference/paper-facts.md
    assert operators > 100
    moved = bytes_per_step(466_906, 1_000)
    assert moved == pytest.approx(2 * 4 * (466_906 + 1_000), rel=0.01)  # push and reply
    assert bytes_per_step(466_906, 0, "float16") == pytest.approx(2 * 2 * 466_906, rel=0.01)


def test_a_measured_rate_replaces_the_estimate_and_says_so():
    est = estimate(
        "resnet8", "digits", {"t4": 2, "v100": 1}, 1000, batch_size=32, measured={"t4": 11.0}
    )
    t4 = [r for r in est.rows if r["gpu"] == "t4"]
    assert [r["source"] for r in t4] == ["measured", "measured"]
    assert t4[1]["steps_per_s"] == pytest.approx(22.0) and "given" in est.basis["t4"]
    assert [r["source"] for r in est.rows if r["gpu"] == "v100"] == ["estimate"]
    # A run's own measurement: its workers' steps per second by GPU type.
    run_like = {"run": "run-1", "by_gpu": {"t4": {"workers": 2, "steps": 400, "steps_per_s": 8.0}}}
    from_run = estimate("resnet8", "digits", {"t4": 1}, 1000, batch_size=32, measured=run_like)
    assert from_run.rows[0]["worker_steps_per_s"] == 4.0
    assert "measured by run run-1" in from_run.basis["t4"]
    assert measured_from_text("t4=11,v100=30.5") == {"t4": 11.0, "v100": 30.5}
    with pytest.raises(ValueError, match="--measured 't4': write TYPE=STEPS_PER_S"):
        measured_from_text("t4")


def test_types_without_a_peak_or_a_price_are_said():
    with pytest.raises(ValueError, match=r"No peak throughput for GPU type 'x9'.*measured="):
        estimate("resnet8", "digits", {"x9": 1}, 100)
    est = estimate("resnet8", "digits", {"k80": 1}, 100, measured=None)  # gce-2025: no K80 price
    assert math.isnan(est.rows[0]["dollars"]) and "not priced" in est.basis["k80"]
    rate, basis = worker_rate(est_catalog(), "t4", 1e9, 128)
    assert rate is not None and "median of the paper's" in basis
    with pytest.raises(ValueError, match=r"workers\['t4'\]=0 must be a whole number"):
        estimate("resnet8", "digits", {"t4": 0}, 100)


def est_catalog():
    from transient_nb.catalog.prices import PriceCatalog

    return PriceCatalog.load("gce-2025")


def test_a_small_model_is_launch_bound_and_a_user_model_is_estimated_too():
    tiny = estimate("resnet8", "digits", {"v100": 1}, 1000, batch_size=32)
    assert "launch-bound" in tiny.basis["v100"]
    assert tiny.rows[0]["worker_steps_per_s"] == pytest.approx(1 / tiny.floor_s)
    data = (
        torch.utils.data.TensorDataset(torch.randn(64, 10), torch.randn(64, 1)),
        torch.utils.data.TensorDataset(torch.randn(16, 10), torch.randn(16, 1)),
    )
    mlp = estimate(lambda: nn.Linear(10, 1), data, {"t4": 2}, 500, loss="mse", batch_size=16)
    assert mlp.parameters == 11 and mlp.flops_per_sample > 0
    assert mlp.frame["workers"].tolist() == [1, 2]
    assert "11 parameters" in mlp.text() and "<table" in mlp._repr_html_()


def _step_s(workload: Workload, net: nn.Module, batch: tuple) -> float:
    x, y = batch
    net.zero_grad()
    # This thread's CPU time, not the wall's: with one torch thread the step runs in this thread
    # (backward too, on the CPU), and the other processes of a busy machine do not count in it.
    t0 = time.thread_time()
    workload.loss_fn()(net(x), y).backward()
    return time.thread_time() - t0


@pytest.mark.slow
def test_a_second_models_cpu_step_time_follows_its_counted_flops():
    """The estimate's premise, measured here: on a compute-bound device a step takes the
    model's FLOPs over the device's throughput. ResNet-32's measured CPU step time predicts a
    plain CNN's from the FLOPs estimate() counts for each (benchmarks/estimate_cpu.py: 0.92 to
    1.0 of the prediction on this 2-core machine, loaded or not)."""
    vgg = benchmark("estimate_cpu").vgg  # a plain CNN: another architecture than ResNet-32
    torch.set_num_threads(1)
    ref, other = Workload("resnet32", "synthetic"), Workload(vgg, "synthetic")
    est_ref = estimate("resnet32", "synthetic", {"t4": 1}, 100, batch_size=16)
    est_other = estimate(vgg, "synthetic", {"t4": 1}, 100, batch_size=16)
    nets = {id(w): w.build_model() for w in (ref, other)}
    batches = {id(w): next(w.train_batches(16, seed=0)) for w in (ref, other)}
    times: dict[int, list[float]] = {id(ref): [], id(other): []}
    for _ in range(6):  # interleaved: what a busy machine does to caches, it does to both
        for w in (ref, other):
            times[id(w)].append(_step_s(w, nets[id(w)], batches[id(w)]))
    measured_ref = statistics.median(times[id(ref)][1:])
    measured_other = statistics.median(times[id(other)][1:])
    predicted = measured_ref * est_other.flops_per_sample / est_ref.flops_per_sample
    assert measured_other / predicted == pytest.approx(1.0, abs=0.35)
    # And that measured rate, given, replaces the estimate of its type.
    mine = estimate(
        vgg, "synthetic", {"t4": 1}, 100, batch_size=16, measured={"t4": 1 / measured_other}
    )
    assert mine.rows[0]["worker_steps_per_s"] == pytest.approx(1 / measured_other)
