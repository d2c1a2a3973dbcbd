"""Worker efficiency: a trainer's step rate through the PS over the same training in a plain process.

What is measured
----------------
* ``plain``: one fresh process trains the model with the Trainer's data pipeline, batch, thread
  count (1 torch thread on CPU) and device, with ``torch.optim.SGD`` and no PS.
* ``ps``: :func:`transient_nb.train` on a local :class:`~transient_nb.TransientCluster` with one
  gpu worker (real ``dask worker`` processes, no provisioning delay): the Trainer actor computes
  the same steps and makes one PS round trip per step (gradient up, weights back).

Each step's completion time is recorded (plain: in the process; ps: by polling the PS's accepted
count every 20 ms); after ``--warmup`` seconds, the rate over consecutive windows of at least
``--window`` seconds (and 4 steps) is taken, and the median window is reported. Efficiency is
ps / plain. ``--repeats`` alternates plain and ps runs; the table gives each system's median and
range over repeats and the ratio of the medians.

Run
---
    python benchmarks/worker_efficiency.py                  # CPU: resnet32, batch 32, ~3 min
    python benchmarks/worker_efficiency.py --device cuda    # on a GPU: batch 128
    python benchmarks/worker_efficiency.py --tiny           # seconds-long smoke configuration
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common
from _common import fmt, log, md_table, median, spread


def rate_of(step_times: list[list[float]], warmup: float, window: float) -> tuple[float, int]:
    """Median window rate (steps/s) of one loop after its warm-up, and the number of windows."""
    span = _common.steady_window(step_times, warmup)
    if span is None:
        return math.nan, 0
    return _common.aggregate_rate(step_times, window, span)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="seconds-long smoke configuration")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--model", default="resnet32")
    p.add_argument("--batch", type=int, default=None, help="default: 32 on CPU, 128 on CUDA")
    p.add_argument("--data", default="synthetic:2048")
    p.add_argument("--threads", type=int, default=1, help="torch threads (the workers' count)")
    p.add_argument("--warmup", type=float, default=None, help="s; default 5 (CPU), 3 (CUDA)")
    p.add_argument("--seconds", type=float, default=None, help="s; default 30 (CPU), 10 (CUDA)")
    p.add_argument("--window", type=float, default=0.5, help="s, at least (and 4 steps)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument(
        "--pipeline", action="store_true", help="pipelined trainers (push k while computing k+1)"
    )
    args = p.parse_args(argv)
    cuda = args.device.startswith("cuda")
    if args.tiny:
        args.model, args.data, args.repeats = "resnet8", "synthetic:256", 1
        args.batch = args.batch or 16
        args.warmup = 0.5 if args.warmup is None else args.warmup
        args.seconds = 1.5 if args.seconds is None else args.seconds
        args.window = 0.2
    batch = args.batch or (128 if cuda else 32)
    warmup = args.warmup if args.warmup is not None else (3.0 if cuda else 5.0)
    seconds = args.seconds if args.seconds is not None else (10.0 if cuda else 30.0)
    _common.quiet()

    plain: list[float] = []
    ps: list[float] = []
    t0 = time.time()
    with _common.transient_cluster(1, nthreads=args.threads) as cluster:
        log(f"cluster up in {time.time() - t0:.1f} s")
        for rep in range(args.repeats):
            times = _common.run_plain_processes(
                1,
                model_name=args.model,
                data=args.data,
                batch_size=batch,
                device=args.device,
                threads=args.threads,
                warmup=warmup,
                seconds=seconds,
            )
            rate, n = rate_of(times, warmup, args.window)
            plain.append(rate)
            log(f"rep {rep + 1}: plain {rate:.2f} steps/s ({n} windows)")
            per_trainer, _ = _common.run_through_ps(
                cluster,
                model=args.model,
                data=args.data,
                batch_size=batch,
                device=args.device,
                trainers=1,
                warmup=warmup,
                seconds=seconds,
                pipeline=args.pipeline,
            )
            rate, n = rate_of(per_trainer, warmup, args.window)
            ps.append(rate)
            log(f"rep {rep + 1}: ps    {rate:.2f} steps/s ({n} windows)")

    m_plain, m_ps = median(plain), median(ps)
    columns = [
        "device",
        "model",
        "batch",
        "threads",
        "pipeline",
        "plain steps/s",
        "plain range",
        "ps steps/s",
        "ps range",
        "efficiency",
        "ps ms/step extra",
    ]
    row = [
        args.device,
        args.model,
        batch,
        args.threads,
        "on" if args.pipeline else "off",
        m_plain,
        spread(plain),
        m_ps,
        spread(ps),
        m_ps / m_plain if m_plain > 0 else math.nan,
        1000 / m_ps - 1000 / m_plain if m_ps > 0 and m_plain > 0 else math.nan,
    ]
    print(md_table(columns, [row]))
    print(
        f"\n{args.repeats} repeat(s), each {fmt(seconds)} s measured after {fmt(warmup)} s "
        f"warm-up; median of >= {fmt(args.window)} s windows; efficiency = ps / plain (target "
        ">= 0.90)."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
