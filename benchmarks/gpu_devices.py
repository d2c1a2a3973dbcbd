"""A short real training run on the local backend's (dask-cuda) workers, and which device each
trainer really used.

What is measured
----------------
:func:`transient_nb.train` with 2 trainers on synthetic data for ``--steps`` global steps; then,
in every gpu worker process: its ``CUDA_VISIBLE_DEVICES``, the CUDA device torch sees, its name,
and the peak memory the trainer allocated on it (``torch.cuda.max_memory_allocated``). The check:
every worker allocated memory on a CUDA device, and workers have distinct devices whenever the
machine has at least as many GPUs as workers (on one GPU they share device 0, by design).

Run
---
    python benchmarks/gpu_devices.py            # a GPU machine (dask-cuda installed: [gpu] extra)
    python benchmarks/gpu_devices.py --tiny     # CPU smoke configuration
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common
from _common import log, md_table


def device_report(dask_worker: Any) -> dict[str, Any]:
    """Runs in each worker process."""
    import torch

    cuda = torch.cuda.is_available()
    return {
        "name": str(dask_worker.name),
        "visible": os.environ.get("CUDA_VISIBLE_DEVICES", "(unset)"),
        "device": f"cuda:{torch.cuda.current_device()}" if cuda else "cpu",
        "gpu": torch.cuda.get_device_name() if cuda else "-",
        "peak_mb": torch.cuda.max_memory_allocated() / 2**20 if cuda else 0.0,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="CPU smoke configuration")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--model", default="resnet32")
    p.add_argument("--batch", type=int, default=128)
    args = p.parse_args(argv)
    if args.tiny:
        args.steps, args.model, args.batch = 20, "resnet8", 16
    _common.quiet()
    from transient_nb import train

    t0 = time.time()
    with _common.transient_cluster(2) as cluster:
        log(f"cluster up in {time.time() - t0:.1f} s: {cluster.backend.describe()}")
        run = train(
            cluster,
            model=args.model,
            data="synthetic:2048",
            steps=args.steps,
            batch_size=args.batch,
            eval_every=args.steps,
            eval_images=256,
        )
        run.wait(timeout=600)
        summary = run.summary()
        planes = _common.data_planes(run)
        client = cluster.get_client()
        reports = [r for r in client.run(device_report).values() if not r["name"].startswith("ps-")]
        gpus = int(getattr(cluster.backend, "gpus", 0))
    reports.sort(key=lambda r: r["name"])
    rows = [[r["name"], r["visible"], r["device"], r["gpu"], r["peak_mb"]] for r in reports]
    print(md_table(["worker", "CUDA_VISIBLE_DEVICES", "device", "gpu", "peak MB"], rows))
    on_gpu = all(r["device"].startswith("cuda") and r["peak_mb"] > 0 for r in reports)
    distinct = len({r["visible"] for r in reports}) == len(reports)
    verdict = (
        "cpu run (no CUDA)"
        if not gpus
        else ("ok" if on_gpu else "FAILED: a worker did not use its GPU")
    )
    if gpus >= len(reports) and on_gpu and not distinct:
        verdict = "FAILED: workers share a device although the machine has enough GPUs"
    print(
        f"\n{summary['steps']} steps, reason {summary['reason']}, accuracy {summary['accuracy']}; "
        f"{gpus} GPU(s) on the machine; check: {verdict}"
    )
    print(f"data plane of the trainers: {', '.join(planes) or 'unknown'}")
    return 1 if verdict.startswith("FAILED") else 0


if __name__ == "__main__":
    sys.exit(main())
