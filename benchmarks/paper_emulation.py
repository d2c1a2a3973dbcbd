"""The paper's Table I/III and its speed-against-workers curve, reproduced with paced emulation.

Runs real worker processes on the local backend (:mod:`transient_nb.experiments.reproduce`): 1 on-demand K80
against 2, 4 and 8 transient K80 plus one PS, with the paper's K80 lifetimes, start-up delays and
2019 prices; then the cluster speed of 1-8 K80, P100 and V100 workers with one and two PS. Each
GPU's step time and the PS's capacity are emulated (paced); everything else is real. The paper's
figures are printed beside ours.

Scaling: a run of ``steps`` global steps stands for the paper's 64K (``emulate_step_scale =
64000 / steps``), so it lasts the paper's simulated time and the paper's lifetimes apply
unchanged (expected revocations per run are the paper's); ``time_scale = wall_pace *
emulate_step_scale`` makes one K80 step 4.56 x wall_pace times a wall second. The host must keep
the pace: the ``behind`` column counts paced processes that could not (then the row's figures
are too slow, not emulated ones).

Examples::

    python benchmarks/paper_emulation.py               # both tables (~8 min on 2 cores)
    python benchmarks/paper_emulation.py --table       # Table I/III only (~3 min)
    python benchmarks/paper_emulation.py --curve --gpus v100 --workers 1 4 8
    python benchmarks/paper_emulation.py --mixed       # 4 K80 / 2 K80+P100+V100 / 4 V100
    python benchmarks/paper_emulation.py --dynamic     # 1 K80 growing to 4, against static
    python benchmarks/paper_emulation.py --today       # the same questions at gce-2025 prices
    python benchmarks/paper_emulation.py --tiny        # smoke configuration (CI)

``--mixed`` and ``--dynamic`` run mixed GPU types and a growing cluster through the public API
(``TransientCluster(workers={"k80": 2, "p100": 1, "v100": 1})``, ``cluster.scale(n, gpu=...)``),
with each worker's lifetimes drawn from the paper's curve of its own GPU type.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import log, md_table, quiet


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="seconds-long smoke configuration")
    parser.add_argument("--table", action="store_true", help="only Table I/III")
    parser.add_argument("--curve", action="store_true", help="only the speed curve")
    parser.add_argument(
        "--today", action="store_true", help="only the same questions at today's prices (gce-2025)"
    )
    parser.add_argument("--mixed", action="store_true", help="only mixed GPU types (experiment 3)")
    parser.add_argument(
        "--dynamic", action="store_true", help="only the growing cluster (experiment 4)"
    )
    parser.add_argument(
        "--dynamic-pace",
        type=float,
        default=0.4,
        help="Dynamic: wall pace (lower: this host's worker start-up costs less simulated time)",
    )
    parser.add_argument("--steps-per-worker", type=int, default=160, help="Table: steps per worker")
    parser.add_argument(
        "--wall-pace", type=float, default=1.2, help="Table: wall steps/s per paper step/s"
    )
    parser.add_argument("--curve-pace", type=float, default=0.3, help="Curve: the same, lower")
    parser.add_argument(
        "--window", type=float, default=6.0, help="Curve: seconds measured per point"
    )
    parser.add_argument("--gpus", nargs="+", default=["k80", "p100", "v100"])
    parser.add_argument("--workers", nargs="+", type=int, default=[1, 2, 4, 8])
    parser.add_argument("--shards", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    only = args.table or args.curve or args.today or args.mixed or args.dynamic
    both = not only
    quiet()
    os.environ.setdefault("TRANSIENT_NB_STRICT_EVENTS", "1")
    from transient_nb.experiments import reproduce

    setups = reproduce.TABLE_SETUPS
    if args.tiny:
        setups = setups[:2]
        args.steps_per_worker, args.gpus, args.workers, args.shards = 40, ["v100"], [4], [1]
        args.window = 3.0
    mixed_setups, dynamic_setups = reproduce.MIXED_SETUPS, reproduce.DYNAMIC_SETUPS
    today_mixed, today_dynamic = reproduce.TODAY_MIXED_SETUPS, reproduce.TODAY_DYNAMIC_SETUPS
    if args.tiny:
        mixed_setups, dynamic_setups = mixed_setups[1:2], dynamic_setups[1:2]
        today_mixed, today_dynamic = today_mixed[1:2], today_dynamic[1:2]
    print(reproduce.note())
    print()
    if args.table or both:
        t0 = time.time()
        log(f"Table I/III: {len(setups)} setups, {args.steps_per_worker} steps per worker")
        table = reproduce.paper_table(
            setups, steps_per_worker=args.steps_per_worker, wall_pace=args.wall_pace, seed=args.seed
        )
        _print_frame(table)
        print()
        print(
            f"Table: seed {args.seed}, wall pace {args.wall_pace}, {time.time() - t0:.0f} s. "
            "'paper saved' and 'ours saved' are over 1 on-demand K80; costs at the paper's prices "
            "(K80 $0.723/h on demand, $0.256 preemptible; PS $0.143/h; the baseline has no PS)."
        )
        _warn_if_behind(table)
        print()
    if args.curve or both:
        t0 = time.time()
        curve = reproduce.speed_curve(
            args.gpus,
            args.workers,
            args.shards,
            wall_pace=args.curve_pace,
            window_s=args.window,
            seed=args.seed,
            log=log,
        )
        print(md_table(list(curve.columns), curve.astype(object).values.tolist()))
        print()
        print(
            f"Curve: global steps/s in the paper's units; 'paper shape' = min(workers x the "
            f"paper's per-worker rate, 45 for one PS or 78.75 for two). Wall pace "
            f"{args.curve_pace}, {args.window} s windows, {time.time() - t0:.0f} s."
        )
        _warn_if_behind(curve)
    if args.today:
        t0 = time.time()
        today = reproduce.today_table(steps_per_worker=args.steps_per_worker, seed=args.seed)
        _print_frame(today)
        print()
        print(
            f"Today: gce-2025 list prices (GPU + machine type; PS n1-standard-4 on demand), Spot "
            f"lifetimes from the paper's K80 curve (none measured for these GPUs), T4/L4/A100 step "
            f"rates estimated (transient_nb.training.emulation). Seed {args.seed}, {time.time() - t0:.0f} s."
        )
        print()
    for kind, wanted, setups_ in (
        ("mixed", args.mixed, today_mixed if args.today else mixed_setups),
        ("dynamic", args.dynamic, today_dynamic if args.today else dynamic_setups),
    ):
        if wanted or both or args.today:
            _setups_report(kind, setups_, args)
    return 0


def _setups_report(kind: str, setups: Any, args: Any) -> None:
    """The ``kind`` table (``mixed`` or ``dynamic``) of ``setups`` at the prices and lifetimes of
    ``--today`` or of the paper, printed with its caption (what the columns say, the paper's
    figures beside the paper's setups, the lifetimes, the pace, the seed and the seconds it took)
    and a warning if the host fell behind the pace."""
    from transient_nb.experiments import reproduce

    if kind == "mixed":
        table, wall_pace, more = reproduce.mixed_table, args.wall_pace, ""
        what = (
            f"Mixed ({_prices(args.today)}): 'faster than first' is time saved against "
            f"{setups[0].label}, 'cheaper than last' money saved against {setups[-1].label}"
        )
        figures = reproduce.PAPER_MIXED
        paper = (
            f"mixed up to {figures['faster than 4 K80']:.0%} faster than 4 K80, or "
            f"{figures['cheaper than 4 V100']:.0%} cheaper than 4 V100"
        )
    else:
        table, wall_pace = reproduce.dynamic_table, args.dynamic_pace
        what = (
            f"Dynamic ({_prices(args.today)}): one worker more at each quarter of the run, LR "
            f"scaled by the active workers; 'faster/cheaper than first' against "
            f"{setups[0].label} (PS billed)"
        )
        figures = reproduce.PAPER_DYNAMIC
        paper = (
            f"{figures['faster than static']:.1%} faster, "
            f"{figures['cheaper than static']:.1%} cheaper than static"
        )
        more = (
            " 'join s': simulated seconds from each scale-up to the new trainer's first step "
            "(paper: 81-98 s boot + 79 s cold restart)."
        )
    t0 = time.time()
    # Today's GPUs have no lifetime study: every Spot worker gets the paper's K80 curve, as in
    # the --today table; the paper's own GPUs get their own curves.
    frame = table(
        setups,
        steps_per_worker=args.steps_per_worker,
        wall_pace=wall_pace,
        seed=args.seed,
        prices=_prices(args.today),
        lifetimes="paper:k80" if args.today else "paper",
    )
    _print_frame(frame)
    print(
        what
        + _paper_says(args.today, paper)
        + f". Lifetimes: {_lifetimes(args.today)}.{more} Wall pace {wall_pace}, seed {args.seed}, "
        f"{time.time() - t0:.0f} s."
    )
    _warn_if_behind(frame)
    print()


def _paper_says(today: bool, what: str) -> str:
    """`` (paper: WHAT)``, beside a table of the paper's setups (none for ``--today``'s)."""
    return "" if today else f" (paper: {what})"


def _prices(today: bool) -> str:
    return "gce-2025" if today else "paper-2019"


def _lifetimes(today: bool) -> str:
    if today:
        return "the paper's K80 curve for every Spot GPU (no study of today's GPUs is at hand)"
    return "the paper's curve of each worker's own GPU type"


def _warn_if_behind(frame: Any) -> None:
    if frame["behind"].sum():
        print("WARNING: this host could not keep the emulated pace in some rows (see 'behind').")


def _print_frame(frame: object) -> None:
    """A reproduce table (setup as index) as markdown."""
    import pandas as pd

    assert isinstance(frame, pd.DataFrame)
    print(
        md_table(
            ["setup", *frame.columns],
            [
                [i, *r]
                for i, r in zip(frame.index, frame.astype(object).values.tolist(), strict=True)
            ],
        )
    )


if __name__ == "__main__":
    sys.exit(main())
