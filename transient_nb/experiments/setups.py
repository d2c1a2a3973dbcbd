"""The paper's setups and figures (its Table I/III, the mixed and growing clusters), and its model
of a cluster's speed, for :mod:`transient_nb.experiments.reproduce`."""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import dataclass

from transient_nb.catalog.lifetimes import PAPER_LIFETIME_CDF
from transient_nb.training.emulation import (
    PAPER_PS_STEPS_PER_S,
    PAPER_TWO_SHARD_GAIN,
    parse_emulation,
)

#: Global steps of the paper's runs.
PAPER_STEPS = 64_000


#: The paper's Table I/III (mean of 32 clusters): hours, dollars. 4 K80: $1.05-1.16 in the
#: paper, whose "62.9% cheaper than 1 on-demand K80" is $1.05.
PAPER_TABLE: dict[str, dict[str, float]] = {
    "1 on-demand K80": {"workers": 1, "hours": 3.91, "cost": 2.83},
    "2 transient K80": {"workers": 2, "hours": 2.16, "cost": 1.31},
    "4 transient K80": {"workers": 4, "hours": 1.05, "cost": 1.05},
    "8 transient K80": {"workers": 8, "hours": 0.51, "cost": 1.11},
}


#: The paper's revocations: 13 of 128 transient servers over its 32 clusters.
PAPER_REVOKED = (13, 128)


@dataclass(frozen=True)
class Setup:
    """One cluster of the experiments: ``workers`` GPUs of one type, Spot or on-demand.

    ``machine``: the worker's machine type (the paper's prices are whole-VM prices on the GPU,
    so ``n1-standard-8`` costs nothing extra in ``paper-2019``; today's catalog bills it).
    ``mix``: GPU type and count pairs of a mixed cluster (then ``gpu`` is its first type and
    ``workers`` the sum). ``grow_to``: start with ``workers`` and add one worker at equal
    intervals of the run until there are ``grow_to`` (the paper's dynamic experiment: 1 to 4
    K80, one more every 16K of 64K steps). ``bill_ps``: bill the PS host (default: with more
    than one worker at any time; the paper's one-GPU baseline had none).
    """

    label: str
    gpu: str
    workers: int
    spot: bool
    shards: int = 1
    machine: str = "n1-standard-8"
    mix: tuple[tuple[str, int], ...] = ()
    grow_to: int = 0
    bill_ps: bool | None = None

    @property
    def types(self) -> dict[str, int]:
        """GPU type -> workers at the start."""
        return dict(self.mix) if self.mix else {self.gpu: self.workers}

    @property
    def most_workers(self) -> int:
        """Workers at the end of the run (the most it has)."""
        return max(self.workers, self.grow_to)

    @property
    def bills_ps(self) -> bool:
        """Whether the PS host is billed: ``bill_ps``, else whether the cluster ever has more
        than one worker (a growing one has its PS from the start)."""
        return self.most_workers > 1 if self.bill_ps is None else self.bill_ps


#: The rows of Table I/III.
TABLE_SETUPS = (
    Setup("1 on-demand K80", "k80", 1, False),
    Setup("2 transient K80", "k80", 2, True),
    Setup("4 transient K80", "k80", 4, True),
    Setup("8 transient K80", "k80", 8, True),
)


#: Experiment 3 of issue 15: mixed GPU types against one type (paper §3: "up to 50% faster than
#: 4 K80, or 26% cheaper than 4 V100").
MIXED_SETUPS = (
    Setup("4 transient K80", "k80", 4, True),
    Setup("2 K80 + P100 + V100", "k80", 4, True, mix=(("k80", 2), ("p100", 1), ("v100", 1))),
    Setup("4 transient V100", "v100", 4, True),
)


#: The same at today's prices (``gce-2025``; every type on ``n1-standard-8``, which T4 and V100
#: attach to).
TODAY_MIXED_SETUPS = (
    Setup("4 Spot T4", "t4", 4, True),
    Setup("2 T4 + 2 V100", "t4", 4, True, mix=(("t4", 2), ("v100", 2))),
    Setup("4 Spot V100", "v100", 4, True),
)


#: Experiment 4: start with one transient K80 and add one every quarter of the run, against the
#: static cluster it starts as (1 transient K80 + 1 PS, the PS billed) and the 4 K80 it ends as.
DYNAMIC_SETUPS = (
    Setup("static 1 transient K80", "k80", 1, True, bill_ps=True),
    Setup("dynamic 1->4 transient K80", "k80", 1, True, grow_to=4),
    Setup("static 4 transient K80", "k80", 4, True),
)


#: The same with today's Spot T4.
TODAY_DYNAMIC_SETUPS = (
    Setup("static 1 Spot T4", "t4", 1, True, bill_ps=True),
    Setup("dynamic 1->4 Spot T4", "t4", 1, True, grow_to=4),
    Setup("static 4 Spot T4", "t4", 4, True),
)


#: The paper's figures for experiments 3 and 4 (relative; its absolute times are not given).
PAPER_MIXED = {"faster than 4 K80": 0.50, "cheaper than 4 V100": 0.26}


PAPER_DYNAMIC = {"faster than static": 0.408, "cheaper than static": 0.215}


#: The paper's question at today's prices (``gce-2025``): one on-demand T4 against four Spot
#: GPUs of each current type, one PS. Step rates of T4/L4/A100 are estimates
#: (:data:`~transient_nb.training.emulation.ESTIMATED_STEPS_PER_S`).
TODAY_SETUPS = (
    Setup("1 on-demand T4", "t4", 1, False),
    Setup("4 Spot T4", "t4", 4, True),
    Setup("4 Spot L4", "l4", 4, True, machine="g2-standard-4"),
    Setup("4 Spot V100", "v100", 4, True),
    Setup("4 Spot A100", "a100-40gb", 4, True, machine="a2-highgpu-1g"),
)


def revoked_by(gpu: str, hours: float) -> float:
    """Fraction of the paper's ``gpu`` servers revoked within ``hours`` (its Fig. 3 CDF).

    Examples
    --------
    >>> round(revoked_by("k80", 1.05), 3)
    0.081
    """
    cdf = PAPER_LIFETIME_CDF[gpu]
    xs = [h for h, _ in cdf]
    i = min(max(bisect.bisect_right(xs, hours), 1), len(xs) - 1)
    (h0, f0), (h1, f1) = cdf[i - 1], cdf[i]
    return f0 + (f1 - f0) * min(max(hours - h0, 0.0), h1 - h0) / (h1 - h0)


def model_speed(setup: Setup, shards: int = 1) -> float:
    """The paper's model of ``setup``'s cluster speed at the start (global steps/s): the sum of
    its workers' rates, up to the PS's plateau.

    Examples
    --------
    >>> round(model_speed(MIXED_SETUPS[1]), 2)
    36.92
    """
    emu = parse_emulation("paper")
    assert emu is not None
    cap = PAPER_PS_STEPS_PER_S * (PAPER_TWO_SHARD_GAIN if shards == 2 else 1.0)
    return min(sum(n * emu.steps_per_s[g] for g, n in setup.types.items()), cap)


def format_types(types: Mapping[str, int]) -> str:
    """``{"k80": 2, "v100": 1}`` as ``"2 k80 + 1 v100"``."""
    return " + ".join(f"{n} {g}" for g, n in types.items())


def _rate(gpu: str) -> float:
    emu = parse_emulation("paper")
    assert emu is not None
    return emu.steps_per_s[gpu]


def paper_speed(gpu: str, workers: int, shards: int) -> float:
    """The paper's cluster speed (global steps/s), as its shape: each worker's rate, up to
    the PS's plateau (45 for one PS, 1.75x that for two). Measured points: K80 linear to 8
    (36/s), P100/V100 plateau at 43-47 from 4-5 workers, about 80 at 8 V100 with two PS."""
    emu = parse_emulation("paper")
    assert emu is not None
    cap = PAPER_PS_STEPS_PER_S * (PAPER_TWO_SHARD_GAIN if shards == 2 else 1.0)
    return min(workers * emu.steps_per_s[gpu], cap)


def note() -> str:
    """How the runs were scaled and what was emulated, in words (for the notebook and script)."""
    revoked, servers = PAPER_REVOKED
    return (
        "Emulated: each GPU's step time (paper: K80 4.56, P100 12.2, V100 15.6 steps/s) and one "
        "4-vCPU PS's capacity (45 global steps/s; two shards 1.75x). Real: worker processes, the "
        "asynchronous PS, gradients of a small model, preemptions with notice drawn from the "
        "paper's lifetimes of each worker's GPU type (its K80 curve for types it did not "
        "measure), the learning rate, per-second billing at the paper's prices. "
        f"Each step stands for 64000/steps of the paper's: a run lasts the paper's simulated "
        f"time, so lifetimes are NOT rescaled (they start when training runs) and the expected "
        f"revocations per run are the "
        f"paper's ({revoked} of {servers} servers over its runs)."
    )
