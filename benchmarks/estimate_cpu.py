"""How well ``transient_nb.estimate``'s premise holds on this machine: a compute-bound device's
step time is the model's FLOPs per step over the device's throughput.

For each model, the FLOPs and operators of one training step come from ``estimate()``'s own
counters; its CPU step time (forward, loss, backward; 1 torch thread, the batch below) is measured
here, interleaved with the reference model's (canonical ResNet-32) so that a busy machine slows
both alike. The step time predicted from the reference's measured throughput is printed beside
the measured one. On a GPU the same rule, with an efficiency calibrated on the paper's ResNet-32
rates, gives ``estimate()``'s per-GPU rates.

    python benchmarks/estimate_cpu.py            # 4 models, batch 32, 7 repeats
    python benchmarks/estimate_cpu.py --tiny     # 2 models, batch 8, 2 repeats (the test's)
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch
from _common import log, md_table
from torch import nn

from transient_nb.training.estimate import count_step, estimate
from transient_nb.training.workload import Workload


def vgg() -> nn.Module:
    """A plain (no residual, no batch norm) CNN: another architecture than the reference's."""
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(64, 128, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(128, 10),
    )


MODELS: dict[str, Any] = {
    "resnet32": "resnet32",
    "vgg-3": vgg,
    "resnet20": "resnet20",
    "resnet32-t2t": "resnet32-t2t",
}


def step_seconds(workload: Workload, batch: int) -> float:
    """One timed training step (forward, loss, backward) on a fixed batch."""
    net = workload.build_model()
    x, y = next(workload.train_batches(batch, seed=0))
    loss_fn = workload.loss_fn()
    loss_fn(net(x), y).backward()  # warm-up
    net.zero_grad()
    t0 = time.perf_counter()
    loss_fn(net(x), y).backward()
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiny", action="store_true", help="2 models, batch 8, 2 repeats")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args()
    names = ["resnet32", "vgg-3"] if args.tiny else list(MODELS)
    batch, repeats = (8, 2) if args.tiny else (args.batch, args.repeats)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    workloads = {n: Workload(MODELS[n], "synthetic") for n in names}
    counted = {n: count_step(w, w.build_model()) for n, w in workloads.items()}
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeats):  # interleaved: a busy machine slows every model alike
        for n, w in workloads.items():
            times[n].append(step_seconds(w, batch))
        log(f"repeat {r + 1}/{repeats}")
    ref = statistics.median(times["resnet32"])
    ref_flops = counted["resnet32"][0]
    rows = []
    for n in names:
        flops, ops = counted[n]
        measured = statistics.median(times[n])
        predicted = ref * flops / ref_flops
        rows.append(
            [
                n,
                flops / 1e9,
                ops,
                measured * 1e3,
                predicted * 1e3,
                measured / predicted,
                flops * batch / measured / 1e9,
            ]
        )
    print(f"CPU, 1 torch thread, batch {batch}, median of {repeats}")
    print(
        md_table(
            [
                "model",
                "GFLOP/sample",
                "operators",
                "measured ms",
                "predicted ms",
                "measured/predicted",
                "GFLOP/s",
            ],
            rows,
        )
    )
    est = estimate(
        "resnet32-t2t", "synthetic", {"k80": 8, "p100": 8, "v100": 8}, 64_000, prices="paper-2019"
    )
    print("\nThe paper's model (the calibration), estimate() at batch 128, 1 PS:")
    print(
        md_table(
            ["gpu", "workers", "worker steps/s", "global steps/s", "bottleneck"],
            [
                [r["gpu"], r["workers"], r["worker_steps_per_s"], r["steps_per_s"], r["bottleneck"]]
                for r in est.rows
            ],
        )
    )


if __name__ == "__main__":
    main()
