"""PS micro-costs: CPU time of the PS update and of the float16 casts, in one process, no Dask.

What is measured
----------------
CPU milliseconds (``time.process_time``, one torch/BLAS thread) per call, median of
``--repeats`` batches of ``--calls`` calls, for a flat vector of each model's size:

* ``push_pull (current)``: ``ParameterServer.push_pull`` as in ``transient_nb/training/ps.py``
  (torch in-place update on the numpy buffers, torch casts, a fresh reply buffer), without the
  network;
* ``push_pull (legacy)``: ``_variants.LegacyParameterServer.push_pull``, the previous round's
  path (numpy update with temporaries, numpy casts, the live array as the reply);
* the casts alone, numpy vs torch: float32 -> float16 (a trainer's gradient, the PS's reply) and
  back, for gradients of the scale of real ones (entries ~ N(0, 1e-4^2): about 45% of them are
  float16 subnormals, which numpy converts one by one) and of scale 1.

These are the costs that the network and Dask add to in ``ps_throughput.py``.

Run
---
    python benchmarks/ps_micro.py          # ~1 minute
    python benchmarks/ps_micro.py --tiny   # seconds
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np
import torch
from _common import md_table

SIZES = {"resnet32": 466_906, "resnet32-t2t": 1_857_722}


def cpu_ms(fn: Callable[[], Any], calls: int, repeats: int) -> float:
    """Median over ``repeats`` of the mean CPU ms of ``calls`` calls of ``fn``."""
    fn()
    runs = []
    for _ in range(repeats):
        t = time.process_time()
        for _ in range(calls):
            fn()
        runs.append((time.process_time() - t) / calls * 1e3)
    return statistics.median(runs)


def make_ps(cls: type, n: int, wire: str) -> Any:
    from transient_nb.training.hparams import HParams

    hp = HParams(steps=10**9, wire_dtype=wire).to_dict()
    w = (np.random.default_rng(0).standard_normal(n) * 0.05).astype(np.float32)
    mask = np.ones(n, np.uint8)
    return cls("micro", 0, 1, w, mask, None, hp, tempfile.mkdtemp(prefix="ps-micro-"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="seconds-long smoke configuration")
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    sizes = dict(SIZES)
    if args.tiny:
        sizes, args.calls, args.repeats = {"resnet32": SIZES["resnet32"]}, 3, 1
    torch.set_num_threads(1)
    from _variants import LegacyParameterServer

    from transient_nb.training.ps import ParameterServer

    loop = asyncio.new_event_loop()
    rng = np.random.default_rng(1)
    rows = []
    for model, n in sizes.items():
        g_real = (rng.standard_normal(n) * 1e-4).astype(np.float32)
        g_unit = rng.standard_normal(n).astype(np.float32)
        for wire in ("float32", "float16"):
            g = g_real if wire == "float32" else torch.from_numpy(g_real).half().numpy()
            for label, cls in (("current", ParameterServer), ("legacy", LegacyParameterServer)):
                ps = make_ps(cls, n, wire)
                step = [0]

                def call(ps: Any = ps, g: np.ndarray = g, step: list[int] = step) -> None:
                    step[0] += 1
                    loop.run_until_complete(
                        ps.push_pull(
                            trainer="t", grad=g, base_version=step[0] - 1, local_step=step[0]
                        )
                    )

                rows.append(
                    [model, f"push_pull ({label})", wire, cpu_ms(call, args.calls, args.repeats)]
                )
        for scale, g32 in (("1e-4", g_real), ("1", g_unit)):
            g16 = g32.astype(np.float16)
            for what, fn in (
                ("numpy f32->f16", lambda g32=g32: g32.astype(np.float16)),
                ("torch f32->f16", lambda g32=g32: torch.from_numpy(g32).half().numpy()),
                ("numpy f16->f32", lambda g16=g16: g16.astype(np.float32)),
                ("torch f16->f32", lambda g16=g16: torch.from_numpy(g16).float().numpy()),
            ):
                rows.append([model, what, f"scale {scale}", cpu_ms(fn, args.calls, args.repeats)])
    loop.close()
    print(md_table(["model", "operation", "wire / data", "cpu ms"], rows))
    print(
        f"\nCPU ms per call, median of {args.repeats} x {args.calls} calls, 1 thread; "
        "'scale 1e-4': entries ~ N(0, 1e-4^2) like real gradients (45% float16 subnormals)."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
