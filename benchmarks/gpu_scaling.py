"""GPU scaling: N trainers through the PS against N plain processes sharing one GPU.

What is measured
----------------
For N in ``--trainers`` (1, 2, 4): images/s summed over

* ``plain``: N fresh processes, each training the model on the one device with the Trainer's
  settings (data pipeline, batch, float32, NCHW; the Trainer has no autocast or channels_last
  option yet), started together;
* ``ps``: :func:`transient_nb.train` on a local :class:`~transient_nb.TransientCluster` scaled to
  N gpu workers, all on the one GPU (the local backend gives every worker GPU 0 when there is
  one), each running a Trainer actor that makes one PS round trip per step; the PS is a worker
  process of its own (no GPU).

Rates: the completion time of every step (plain: in the processes; ps: by polling the PS's step
count every 20 ms), summed over the N loops, median over windows of at least ``--window`` s
after ``--warmup`` s. The ratio is ps / plain (target: >= 0.90 at N = 4).

For a GPU machine; the full run finishes in under 5 minutes on one H200. ``--tiny`` runs a
seconds-long CPU configuration (resnet8, N = 1, 2) so CI proves the script still runs.

Run
---
    python benchmarks/gpu_scaling.py                    # device cuda, resnet32, batch 128
    python benchmarks/gpu_scaling.py --tiny             # CPU smoke configuration
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common
from _common import fmt, log, md_table


def summed_rate(step_times: list[list[float]], warmup: float, window: float) -> float:
    span = _common.steady_window(step_times, warmup)
    if span is None:
        return math.nan
    return _common.aggregate_rate(step_times, window, span)[0]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="seconds-long CPU smoke configuration")
    p.add_argument("--device", default=None, help="default: cuda (cpu with --tiny)")
    p.add_argument("--model", default="resnet32")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--data", default="synthetic:4096")
    p.add_argument("--trainers", nargs="+", type=int, default=[1, 2, 4])
    p.add_argument("--warmup", type=float, default=4.0)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--window", type=float, default=0.5)
    args = p.parse_args(argv)
    if args.tiny:
        args.device = args.device or "cpu"
        args.model, args.batch, args.data = "resnet8", 16, "synthetic:256"
        # A loaded host once left a one-second span too few steps for a window ("n/a"); every
        # loop now takes _common.MIN_STEADY_STEPS past its warm-up however long they take, so
        # the smoke run measures as long as worker_efficiency's.
        args.trainers, args.warmup, args.seconds, args.window = [1, 2], 0.5, 1.5, 0.2
    device = args.device or "cuda"
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            p.error("no CUDA device here: run on a GPU machine, or use --tiny (CPU)")
    _common.quiet()
    counts = sorted(set(args.trainers))
    rows = []
    t0 = time.time()
    with _common.transient_cluster(counts[0]) as cluster:
        log(f"cluster with {counts[0]} worker(s) up in {time.time() - t0:.1f} s")
        for n in counts:
            if len(cluster.workers) - 1 < n:  # the PS host is one of cluster.workers
                cluster.scale(n)
                cluster.wait_for_workers(n, timeout=300)
            plain_times = _common.run_plain_processes(
                n,
                model_name=args.model,
                data=args.data,
                batch_size=args.batch,
                device=device,
                threads=1,
                warmup=args.warmup,
                seconds=args.seconds,
            )
            plain = summed_rate(plain_times, args.warmup, args.window) * args.batch
            log(f"{n} plain: {plain:.0f} img/s")
            per_trainer, steps = _common.run_through_ps(
                cluster,
                model=args.model,
                data=args.data,
                batch_size=args.batch,
                device=device,
                trainers=n,
                warmup=args.warmup,
                seconds=args.seconds,
            )
            span = _common.steady_window(per_trainer, args.warmup)
            ps = (
                _common.aggregate_rate([steps], args.window, span)[0] * args.batch
                if span
                else math.nan
            )
            log(f"{n} ps:    {ps:.0f} img/s")
            rows.append([device, args.model, args.batch, n, plain, ps, ps / plain])
    print(md_table(["device", "model", "batch", "N", "plain img/s", "ps img/s", "ps/plain"], rows))
    print(
        f"\nimg/s summed over N loops on one device; median of >= {fmt(args.window)} s windows "
        f"after {fmt(args.warmup)} s warm-up, {fmt(args.seconds)} s measured; float32 NCHW "
        "(the Trainer's settings) in both."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
