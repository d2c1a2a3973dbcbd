"""Pipelined trainers against one round trip per step: the same training, accuracy and time.

What is measured
----------------
For each data set (``digits``, ``synthetic``) and each mode (``pipeline`` off, on), ``--repeats``
runs of :func:`transient_nb.train` on a fresh local cluster of ``--workers`` workers (resnet8,
the same steps, batch and seeds), no preemptions: the final test accuracy and the wall time of
the run. The table gives the mean and the range over repeats; on 2 shared cores the wall time
says little about a GPU machine (where the overlap hides the round trip), the accuracy is what
this script is for: pipelining adds one version of staleness.

Run
---
    python benchmarks/pipeline_accuracy.py              # ~6 min on 2 cores
    python benchmarks/pipeline_accuracy.py --tiny       # smoke configuration
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common
from _common import log, md_table


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="smoke configuration")
    p.add_argument("--data", nargs="+", default=["digits", "synthetic:2048"])
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args(argv)
    if args.tiny:
        args.data, args.steps, args.repeats = ["digits"], 40, 1
    _common.quiet()
    from transient_nb import train

    rows = []
    for data in args.data:
        for pipeline in (False, True):
            accs, walls = [], []
            for rep in range(args.repeats):
                with _common.transient_cluster(args.workers) as cluster:
                    run = train(
                        cluster,
                        model="resnet8",
                        data=data,
                        steps=args.steps,
                        batch_size=32,
                        eval_every=args.steps,
                        eval_images=1000,
                        seed=rep,
                        pipeline=pipeline,
                    )
                    run.wait(timeout=900)
                    s = run.summary()
                accs.append(float(s["accuracy"]))
                walls.append(float(s["wall_s"]))
                log(
                    f"{data} pipeline={pipeline} rep {rep + 1}: {accs[-1]:.4f} in {walls[-1]:.1f} s"
                )
            rows.append(
                [
                    data,
                    "on" if pipeline else "off",
                    args.steps,
                    statistics.mean(accs),
                    f"{min(accs):.4f}-{max(accs):.4f}",
                    statistics.mean(walls),
                ]
            )
    print(md_table(["data", "pipeline", "steps", "accuracy", "accuracy range", "wall s"], rows))
    print(
        f"\n{args.repeats} run(s) each, {args.workers} workers, resnet8, batch 32, no preemptions; "
        "accuracy on up to 1000 test images."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
