"""The paper's experiments, run with real processes on the local backend and paced emulation.

Li et al. (ICAC 2019) compared one on-demand K80 with 2, 4 and 8 transient K80s plus one PS
(their Table I/III), and measured cluster speed against the number of K80, P100 and V100 workers
with one and two PS. This module runs the same experiments on a :class:`~transient_nb.
TransientCluster` whose trainers and PS are paced (:mod:`transient_nb.training.emulation`), and puts the
paper's figures beside ours. ``benchmarks/paper_emulation.py`` prints them;
``notebooks/reproduce_paper.ipynb`` shows them.

How a run is scaled down (the same for every setup):

- ``steps`` global steps stand for the paper's 64K: ``emulate_step_scale = 64000 / steps``, so
  each step is paced to that many GPU step times, and the run lasts, in simulated time, as long
  as the paper's did. The paper's lifetimes (``preemption="paper:k80"``), start-up delays and
  per-second prices therefore apply unchanged, and the expected number of revocations per run is
  the paper's; nothing else is rescaled. Lifetimes start when training runs
  (:func:`arm_lifetimes`), not when this host's slow process start-up begins.
- ``time_scale`` is then chosen so that one worker steps ``wall_pace`` times a second per
  paper step/s (``time_scale = wall_pace * emulate_step_scale``), a pace this host keeps.

What is real: processes, the asynchronous PS and its staleness, gradients (a small model on
small data, computed faster than the pace), preemptions with notice, the learning-rate scaling,
the bill. What is emulated: a GPU's step time and a 4-vCPU PS's capacity. Times are measured from
the moment every trainer of the cluster runs (the start-up of worker processes on this host would
otherwise count minutes of simulated time) to the end of the run, and extrapolated to the whole
run at that rate; costs are billed over the same window and extrapolated the same way.

Every table's further keywords (``seed``, ``prices``, ``lifetimes``, ``timeout``, ...) are
:func:`run_setup`'s, with its defaults (seed 0, the paper's prices).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pandas as pd

from transient_nb.eventlog.folds import summarize
from transient_nb.experiments.runs import (
    _metrics,
    _wait_for_trainers,
    arm_lifetimes,
    grow_marks,
    join_delays,
    local_cluster,
    measure,
    run_setup,
    workers_by_zone,
)
from transient_nb.experiments.setups import (
    DYNAMIC_SETUPS,
    MIXED_SETUPS,
    PAPER_DYNAMIC,
    PAPER_MIXED,
    PAPER_REVOKED,
    PAPER_STEPS,
    PAPER_TABLE,
    TABLE_SETUPS,
    TODAY_DYNAMIC_SETUPS,
    TODAY_MIXED_SETUPS,
    TODAY_SETUPS,
    Setup,
    _rate,
    format_types,
    model_speed,
    note,
    paper_speed,
    revoked_by,
)

#: What the module offers: its tables, and the setups and runs they are made of.
__all__ = [
    "DYNAMIC_SETUPS",
    "MIXED_SETUPS",
    "PAPER_DYNAMIC",
    "PAPER_MIXED",
    "PAPER_REVOKED",
    "PAPER_STEPS",
    "PAPER_TABLE",
    "TABLE_SETUPS",
    "TODAY_DYNAMIC_SETUPS",
    "TODAY_MIXED_SETUPS",
    "TODAY_SETUPS",
    "Setup",
    "arm_lifetimes",
    "dynamic_table",
    "format_types",
    "grow_marks",
    "join_delays",
    "local_cluster",
    "measure",
    "mixed_table",
    "model_speed",
    "note",
    "paper_speed",
    "paper_table",
    "revoked_by",
    "run_setup",
    "speed_curve",
    "today_table",
    "workers_by_zone",
]


def _pace(setup: Setup, wall_pace: float) -> float:
    """A wall pace at which ``setup``'s fastest type asks this host for a K80's wall rate."""
    fastest = max(_rate(g) for g in setup.types)
    return wall_pace * _rate("k80") / max(_rate("k80"), fastest)


def _run_paced(
    setups: Sequence[Setup],
    steps_of: Callable[[Setup], int],
    wall_pace: float,
    options: Mapping[str, Any],
) -> pd.DataFrame:
    """Run every setup (``steps_of(setup)`` steps, its fastest type paced at a K80's wall
    rate, ``options`` for :func:`run_setup`); one row each, indexed by setup."""
    rows = [
        run_setup(setup, steps=steps_of(setup), wall_pace=_pace(setup, wall_pace), **options)
        for setup in setups
    ]
    return pd.DataFrame(rows).set_index("setup")


def mixed_table(
    setups: Sequence[Setup] = MIXED_SETUPS,
    *,
    steps_per_worker: int = 160,
    wall_pace: float = 1.2,
    **options: Any,
) -> pd.DataFrame:
    """Experiment 3: a mixed cluster against the same number of workers of one type.

    The first setup is the slow one (4 K80), the last the dear one (4 V100): ``faster`` is the
    time saved against the first, ``cheaper`` the money saved against the last. Every setup gets
    the paper's lifetimes of its own types, and a wall pace at which its fastest type asks this
    host for a K80's rate (so the host keeps every pace).
    """
    ours = _run_paced(setups, lambda s: steps_per_worker * s.workers, wall_pace, options)
    slow, dear = ours.iloc[0], ours.iloc[-1]
    return pd.DataFrame(
        {
            "types": [format_types(t) for t in ours["types"]],
            "hours": ours["hours"],
            "cost $": ours["cost"],
            "faster than first": 1 - ours["hours"] / slow["hours"],
            "cheaper than last": 1 - ours["cost"] / dear["cost"],
            "global steps/s": ours["global_steps_per_s"],
            "of model": [
                r["global_steps_per_s"] / model_speed(s)
                for s, (_, r) in zip(setups, ours.iterrows(), strict=True)
            ],
            "steps by type": [_steps_share(b) for b in ours["by_gpu"]],
            "revocations": ours["revocations"].astype(int),
            "behind": ours["behind"].astype(int),
        }
    )


def dynamic_table(
    setups: Sequence[Setup] = DYNAMIC_SETUPS,
    *,
    steps_per_worker: int = 160,
    wall_pace: float = 1.2,
    **options: Any,
) -> pd.DataFrame:
    """Experiment 4: a cluster that grows by one worker each quarter, against static ones.

    Every setup runs the same ``steps_per_worker`` x 4 global steps (the growing one ends with
    4 workers). ``faster`` and ``cheaper`` are against the first setup (static, the size the
    growing one starts at, its PS billed), as the paper compared its growing cluster with a
    static one. ``join s``: simulated seconds from each scale-up to the new trainer's first step.
    """
    steps = steps_per_worker * max(s.most_workers for s in setups)
    ours = _run_paced(setups, lambda s: steps, wall_pace, options)
    base = ours.iloc[0]
    return pd.DataFrame(
        {
            "hours": ours["hours"],
            "cost $": ours["cost"],
            "faster than first": 1 - ours["hours"] / base["hours"],
            "cheaper than first": 1 - ours["cost"] / base["cost"],
            "global steps/s": ours["global_steps_per_s"],
            # Scale-ups made (at each quarter mark) and the workers that joined in all.
            "added": ours["added"].astype(int),
            "joined": ours["joined"].astype(int),
            "join s": [
                ", ".join(f"{j:.0f}" for j in js) if js else "" for js in ours["join_delays_s"]
            ],
            "revocations": ours["revocations"].astype(int),
            "behind": ours["behind"].astype(int),
            "accuracy": ours["accuracy"],
        }
    )


def _steps_share(by_gpu: Mapping[str, Mapping[str, Any]]) -> str:
    """Each type's share of the workers' steps, e.g. ``"k80 25%, v100 42%"``."""
    total = sum(int(r["steps"]) for r in by_gpu.values())
    if total <= 0:
        return ""
    return ", ".join(f"{g} {int(r['steps']) / total:.0%}" for g, r in by_gpu.items())


def paper_table(
    setups: Sequence[Setup] = TABLE_SETUPS,
    *,
    steps_per_worker: int = 160,
    wall_pace: float = 1.2,
    **options: Any,
) -> pd.DataFrame:
    """Table I/III, the paper's figures beside ours, one row per setup.

    Each setup runs ``steps_per_worker`` x workers global steps (so every run takes about the
    same wall time). Speedups and savings are over the first setup (1 on-demand K80).
    """
    rows = []
    for setup in setups:
        steps = steps_per_worker * setup.workers
        rows.append(run_setup(setup, steps=steps, wall_pace=wall_pace, **options))
    ours = pd.DataFrame(rows).set_index("setup")
    base = ours.iloc[0]
    out = []
    for label, r in ours.iterrows():
        paper = PAPER_TABLE.get(str(label), {})
        p_base = PAPER_TABLE["1 on-demand K80"]
        gpu = "k80"
        out.append(
            {
                "setup": label,
                "paper h": paper.get("hours"),
                "ours h": r["hours"],
                "paper speedup": p_base["hours"] / paper["hours"] if paper else None,
                "ours speedup": base["hours"] / r["hours"],
                "paper $": paper.get("cost"),
                "ours $": r["cost"],
                "paper saved": 1 - paper["cost"] / p_base["cost"] if paper else None,
                "ours saved": 1 - r["cost"] / base["cost"],
                "revocations": int(r["revocations"]),
                "expected revocations": (
                    r["workers"] * revoked_by(gpu, r["hours"]) if "transient" in str(label) else 0.0
                ),
                "global steps/s": r["global_steps_per_s"],
                # What the host delivered of the emulated model's rate: the paced workers, up
                # to the PS's capacity. Below ~0.9 the host (not the emulation) set the pace.
                "of model": r["global_steps_per_s"] / paper_speed(gpu, int(r["workers"]), 1),
                "accuracy": r["accuracy"],
                "steps": int(r["steps"]),
                "time_scale": r["time_scale"],
                "behind": int(r["behind"]),
            }
        )
    return pd.DataFrame(out).set_index("setup")


def today_table(
    setups: Sequence[Setup] = TODAY_SETUPS,
    *,
    steps_per_worker: int = 160,
    wall_pace: float = 1.2,
    lifetimes: str = "paper:k80",
    **options: Any,
) -> pd.DataFrame:
    """The paper's experiment with today's GPUs and prices (``gce-2025``); speedups and savings
    over the first setup.

    No lifetime study of today's GPUs is at hand: Spot workers get ``lifetimes`` (the paper's K80
    curve by default). Step rates other than K80/P100/V100 are estimates. Faster GPUs get a
    lower ``wall_pace`` so that every setup asks this host for about a K80's wall rate.
    """
    options = {"prices": "gce-2025", "lifetimes": lifetimes, **options}
    ours = _run_paced(setups, lambda s: steps_per_worker * s.workers, wall_pace, options)
    base = ours.iloc[0]
    return pd.DataFrame(
        {
            "gpu": ours["gpu"],
            "hours": ours["hours"],
            "speedup": base["hours"] / ours["hours"],
            "cost $": ours["cost"],
            "saved": 1 - ours["cost"] / base["cost"],
            "on-demand $": ours["cost_on_demand"],
            "global steps/s": ours["global_steps_per_s"],
            "of model": [
                r["global_steps_per_s"] / paper_speed(r["gpu"], int(r["workers"]), 1)
                for _, r in ours.iterrows()
            ],
            "revocations": ours["revocations"].astype(int),
            "behind": ours["behind"].astype(int),
        }
    )


def speed_curve(
    gpus: Sequence[str] = ("k80", "p100", "v100"),
    workers: Sequence[int] = (1, 2, 4, 8),
    shards: Sequence[int] = (1, 2),
    *,
    wall_pace: float = 0.3,
    window_s: float = 6.0,
    settle_s: float = 1.5,
    model: str = "resnet8",
    data: str = "digits",
    batch_size: int = 32,
    seed: int = 0,
    log: Any = None,
) -> pd.DataFrame:
    """Cluster speed against the number of workers, one and two PS, the paper's shape beside.

    One cluster per GPU type, scaled up through ``workers``; for every size and PS count a run
    is measured over ``window_s`` wall seconds once every trainer runs. ``wall_pace`` as in
    :func:`run_setup` (0.3: 8 V100s ask for 37 steps/s here, the PS caps them at 13.5/23.6).
    """
    from transient_nb.training.run import train

    step_scale = 10.0
    time_scale = wall_pace * step_scale
    rows = []
    for gpu in gpus:
        setup = Setup(f"{gpu}", gpu, workers[0], True)
        with local_cluster(setup, time_scale=time_scale, seed=seed) as cluster:
            for n in workers:
                cluster.scale(n)
                cluster.wait_for_workers(n, timeout=300)
                for sh in shards:
                    run = train(
                        cluster,
                        model=model,
                        data=data,
                        steps=10**8,  # stopped after the window
                        shards=sh,
                        batch_size=batch_size,
                        emulate="paper",
                        emulate_step_scale=step_scale,
                        warmup_steps=0,
                        metrics_interval_s=0.5,
                        eval_every=10**8,
                        checkpoint_every=10**8,
                        seed=seed,
                    )
                    _wait_for_trainers(run, n)
                    time.sleep(settle_s)
                    t_a = time.time()
                    time.sleep(window_s)
                    t_b = time.time()
                    run.stop(timeout=60)
                    events = run.events()
                    m = [(t, s) for t, s in _metrics(events) if t_a <= t <= t_b]
                    rate = (m[-1][1] - m[0][1]) / (m[-1][0] - m[0][0]) if len(m) > 1 else 0.0
                    behind = summarize(events)["emulation_behind"]
                    row = {
                        "gpu": gpu,
                        "workers": n,
                        "PS": sh,
                        "paper shape": paper_speed(gpu, n, sh),
                        "ours": rate * step_scale / time_scale,
                        "of model": rate * step_scale / time_scale / paper_speed(gpu, n, sh),
                        "behind": behind,
                    }
                    rows.append(row)
                    if log is not None:
                        log(f"{gpu} x{n}, {sh} PS: {row['ours']:.1f} global steps/s")
    return pd.DataFrame(rows)
