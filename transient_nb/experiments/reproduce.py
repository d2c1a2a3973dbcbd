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
"""

from __future__ import annotations

import bisect
import contextlib
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from transient_nb.catalog.lifetimes import PAPER_LIFETIME_CDF
from transient_nb.eventlog.bill import Bill
from transient_nb.eventlog.folds import event_log, summarize
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


@contextlib.contextmanager
def local_cluster(
    setup: Setup,
    *,
    time_scale: float,
    seed: int = 0,
    prices: str = "paper-2019",
    **options: Any,
) -> Iterator[Any]:
    """A local cluster of ``setup`` at ``prices``, its records in a temporary folder.

    No preemptions yet: :func:`arm_lifetimes` starts the workers' lifetimes once training runs
    (see there why). Revoked workers are not replaced (the paper's clusters went on with the
    workers they had left).
    """
    import dask

    from transient_nb.deploy.cluster import TransientCluster

    folder = tempfile.mkdtemp(prefix="transient-paper-")
    settings = {"transient.run-dir": folder, "transient.registry-dir": folder}
    with dask.config.set(settings):
        kwargs: dict[str, Any] = {
            "workers": setup.types if setup.mix else setup.workers,
            "gpu": None if setup.mix else setup.gpu,
            "spot": setup.spot,
            "zone": "us-central1-a",
            "prices": prices,
            "machine_type": setup.machine,
            "ps_machine_type": "n1-standard-4",
            "time_scale": time_scale,
            "preemption": "none",
            "provisioning_delay": "paper",
            "replace": False,
            "seed": seed,
            **options,
        }
        cluster = TransientCluster(**kwargs)
        try:
            cluster.wait_for_workers(setup.workers, timeout=300)
            yield cluster
        finally:
            cluster.close()
            shutil.rmtree(folder, ignore_errors=True)


def arm_lifetimes(cluster: Any, spec: str) -> None:
    """Draw every running worker's lifetime from ``spec`` now, and use it for later workers.

    Why not from the VM's start, as the simulator does: starting a worker process and its
    trainer takes seconds here, which at a time scale of 60-480 are minutes to hours of
    simulated time; a K80 revoked in those (the paper's curve revokes 7.8% within the first
    hour) would be gone before training began, where the paper's servers started training about
    two minutes after they booted. From the moment training runs, the paper's curve applies as
    measured.
    """
    from transient_nb.catalog.lifetimes import parse_preemption

    model = parse_preemption(spec)

    async def arm() -> None:
        cluster.simulator.model = model
        for name, vm in list(cluster.workers.items()):
            spec_ = getattr(vm, "spec", None)
            # Spot workers only: an on-demand one is never revoked.
            if spec_ is not None and spec_.role == "worker" and spec_.spot and not vm.stopped:
                cluster.simulator.vm_running(name, spec_.gpu, spec_.zone)

    cluster.sync(arm)


def _wait_for_trainers(run: Any, n: int, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while len(_paced_times(run.events())) < n and time.monotonic() < deadline:
        if run.done:
            return
        time.sleep(0.2)


def _joined_workers(events: Iterable[Mapping[str, Any]]) -> int:
    """How many worker VMs joined the cluster, replacements and scale-ups included."""
    return len(
        {e.get("worker") for e in events if e.get("kind") == "joined" and e.get("role") == "worker"}
    )


def _wait_for_joins(cluster: Any, n: int, timeout: float) -> None:
    """Wait until ``n`` worker VMs have joined (revoked ones count), at most ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while _joined_workers(event_log(cluster)) < n and time.monotonic() < deadline:
        time.sleep(0.2)


def _paced_times(events: Sequence[Mapping[str, Any]]) -> list[float]:
    return sorted(
        float(e["time"])
        for e in events
        if e.get("kind") == "emulation-paced" and e.get("role") == "worker"
    )


def _metrics(events: Sequence[Mapping[str, Any]]) -> list[tuple[float, int]]:
    return [
        (float(e["time"]), int(e["step"]))
        for e in events
        if e.get("kind") == "metrics" and e.get("shard", 0) == 0
    ]


def measure(
    events: Sequence[Mapping[str, Any]],
    *,
    workers: int,
    steps: int,
    time_scale: float,
    step_scale: float,
    with_ps: bool = True,
) -> dict[str, Any]:
    """The figures of one finished run, from its events alone.

    Parameters
    ----------
    events
        The run's events (``run.events()``).
    workers
        Trainers the cluster started with: the window opens once that many run.
    steps, time_scale, step_scale
        The run's global steps and its two clocks (see the module's docstring).
    with_ps
        Bill the PS host (False for the paper's one-GPU baseline, which had none).

    Returns
    -------
    ``hours`` (the whole run in simulated hours), ``cost`` and ``cost_on_demand`` (dollars,
    the whole run), ``global_steps_per_s`` (in the emulated run's steps), ``revocations``,
    ``behind`` (paced processes that fell behind) and ``note`` (the summary's emulation note).
    """
    finished = next((e for e in events if e.get("kind") == "train-finished"), None)
    started = next((e for e in events if e.get("kind") == "train-started"), None)
    if finished is None or started is None:
        raise ValueError("measure() needs a finished run's events")
    paced = _paced_times(events)
    t_all = paced[min(workers, len(paced)) - 1] if paced else float(started["time"])
    # From the first PS metrics once every trainer runs to the last one: the run's final
    # evaluation and checkpoint (the driver's, before ``train-finished``) are no training time.
    after = [(t, s) for t, s in _metrics(events) if t >= t_all]
    if len(after) < 2:
        raise ValueError("the run was too short to measure: fewer than two metrics events")
    (t_a, s_a), (t_b, s_b) = after[0], after[-1]
    rate = (s_b - s_a) / (t_b - t_a) if t_b > t_a and s_b > s_a else float("nan")
    t_end = float(finished["time"])
    full_wall_s = steps / rate
    bill = Bill()
    for e in events:
        bill.feed(e)
    per_vm = bill.report(now=t_b).per_vm
    cost = cost_od = 0.0
    for _, vm in per_vm.iterrows():
        if vm["start"] is None or pd.isna(vm["start"]) or (vm["role"] == "ps" and not with_ps):
            continue
        end = t_b if vm["end"] is None or pd.isna(vm["end"]) else float(vm["end"])
        overlap = max(0.0, min(end, t_b) - max(float(vm["start"]), t_a))
        cost += vm["price"] * overlap * time_scale / 3600
        cost_od += vm["price_on_demand"] * overlap * time_scale / 3600
    stretch = full_wall_s / (t_b - t_a) if t_b > t_a else float("nan")
    t_s = float(started["time"])
    revocations = sum(
        1
        for e in events
        if e.get("kind") == "preempted" and e.get("role") == "worker" and t_s <= e["time"] <= t_end
    )
    summary = summarize(events)
    return {
        "by_gpu": summary["by_gpu"],
        "hours": full_wall_s * time_scale / 3600,
        "cost": cost * stretch,
        "cost_on_demand": cost_od * stretch,
        "global_steps_per_s": rate * step_scale / time_scale,
        "revocations": revocations,
        "behind": summary["emulation_behind"],
        "note": summary["emulation_note"],
        "accuracy": summary["accuracy"],
    }


def run_setup(
    setup: Setup,
    *,
    steps: int,
    wall_pace: float = 1.2,
    model: str = "resnet8",
    data: str = "digits",
    batch_size: int = 32,
    emulate: str = "paper",
    seed: int = 0,
    timeout: float = 900,
    prices: str = "paper-2019",
    lifetimes: str | None = None,
    replace: bool = False,
    adapt: Mapping[str, Any] | None = None,
    fallback_zones: Sequence[str] = (),
) -> dict[str, Any]:
    """Run ``setup`` for ``steps`` global steps standing for the paper's 64K; its figures.

    ``wall_pace``: wall-clock steps/s of one worker per paper step/s (a K80 then steps 4.56 x
    ``wall_pace`` times a second here). A growing setup (``grow_to``) scales the cluster up by
    one worker of its type at each of its step marks, through ``cluster.scale``: the new VM
    waits out the paper's start-up delay, its trainer joins the running job, and the learning
    rate follows the active workers (the trainer's rule). ``lifetimes``: default
    ``"paper"``, each worker its own type's curve from the paper. ``replace``: replace revoked
    workers (today's reactive default) rather than go on without them (the paper's rule).
    ``adapt``: the keywords of ``cluster.adapt`` (a transient-aware policy from the moment the
    lifetimes are armed; a ``budget`` then counts from that moment, as the figures' window does).
    ``fallback_zones``: zones besides us-central1-a where the cluster may place workers (for
    lifetimes by zone).
    """
    from transient_nb.training.run import train

    step_scale = PAPER_STEPS / steps
    time_scale = wall_pace * step_scale
    with local_cluster(
        setup,
        time_scale=time_scale,
        seed=seed,
        prices=prices,
        replace=replace,
        fallback_zones=list(fallback_zones),
        # A policy's first choice may split the PS (one host per shard, as it adds them);
        # the paper's setups place their shards on its one PS host.
        ps_hosts=setup.shards if adapt else 1,
    ) as cluster:
        run = train(
            cluster,
            model=model,
            data=data,
            steps=steps,
            # Under a policy the run follows the PS hosts it adds (no shards= given).
            shards=None if adapt else setup.shards,
            batch_size=batch_size,
            emulate=emulate,
            emulate_step_scale=step_scale,
            warmup_steps=max(0, round(100 / step_scale)),  # the paper's 100 of 64K steps
            metrics_interval_s=0.5,
            eval_every=max(1, steps // 4),
            seed=seed,
        )
        if setup.spot:
            _wait_for_trainers(run, setup.workers)
            arm_lifetimes(cluster, lifetimes or "paper")
        if adapt:
            goal = dict(adapt)
            if goal.get("budget") is not None:
                goal["budget"] = float(goal["budget"]) + float(cluster.cost().total)
            cluster.adapt(**goal)
        marks = grow_marks(setup, steps)
        deadline = time.monotonic() + timeout
        while not run.done and time.monotonic() < deadline:
            if marks and run.step >= marks[0]:
                marks.pop(0)
                cluster.scale(cluster.mix[setup.gpu] + 1, gpu=setup.gpu)
            if not replace and not any(
                vm.spec.role == "worker" and not vm.stopped for vm in list(cluster.workers.values())
            ):
                # Revoked workers are not replaced (the paper's rule): nobody is left to train.
                run.stop(timeout=60)
                raise RuntimeError(
                    f"{setup.label}: every worker was revoked before the run had its steps "
                    "(revoked workers are not replaced, as in the paper); try another seed."
                )
            time.sleep(0.5)
        if run.reason != "steps":
            raise RuntimeError(f"{setup.label}: the run ended with {run.reason}: {run.error}")
        added = len(grow_marks(setup, steps)) - len(marks)
        if added:
            # Every worker the run asked for joins, whatever this host's pace: a loaded host's
            # process start-up (minutes of simulated time) may outlast the run, but never the
            # join. The trainers that started before the end are in ``join_delays``.
            _wait_for_joins(cluster, setup.workers + added, timeout=120 + timeout / 10)
        out = measure(
            run.events(),
            workers=setup.workers,
            steps=steps,
            time_scale=time_scale,
            step_scale=step_scale,
            with_ps=setup.bills_ps,
        )
        joins = join_delays(run.events(), time_scale) if setup.grow_to else []
        joined = _joined_workers(event_log(cluster))
        final_mix = {g: n for g, n in cluster.mix.items() if n}
        final_on_demand = dict(getattr(cluster, "on_demand", {}) or {})
        ps_zone = getattr(getattr(cluster, "placement", None), "ps_zone", None)
        ps_hosts = cluster.ps_hosts
        decisions = [e for e in run.events() if e.get("kind") == "policy-decision"]
        zones = workers_by_zone(event_log(cluster))
    return {
        "final_mix": final_mix,
        "final_on_demand": final_on_demand,
        "ps_zone": ps_zone,
        "zones": zones,
        "ps_hosts": ps_hosts,
        "decisions": decisions,
        "setup": setup.label,
        "gpu": setup.gpu,
        "workers": setup.workers,
        "types": setup.types,
        "join_delays_s": joins,
        "added": added,
        "joined": joined,
        "steps": steps,
        "time_scale": time_scale,
        "step_scale": step_scale,
        **out,
    }


def workers_by_zone(events: Iterable[Mapping[str, Any]]) -> dict[str, tuple[int, int]]:
    """Zone -> (workers that joined there, workers revoked there), zones in order of first use.

    Examples
    --------
    >>> workers_by_zone([
    ...     {"kind": "joined", "role": "worker", "worker": "w-0", "zone": "us-central1-a"},
    ...     {"kind": "joined", "role": "ps", "worker": "ps-0", "zone": "us-central1-a"},
    ...     {"kind": "preempted", "role": "worker", "worker": "w-0", "zone": "us-central1-a"},
    ...     {"kind": "joined", "role": "worker", "worker": "w-1", "zone": "us-east1-c"},
    ... ])
    {'us-central1-a': (1, 1), 'us-east1-c': (1, 0)}
    """
    out: dict[str, list[int]] = {}
    for e in events:
        if e.get("role") != "worker" or e.get("kind") not in ("joined", "preempted"):
            continue
        counts = out.setdefault(str(e.get("zone")), [0, 0])
        counts[0 if e["kind"] == "joined" else 1] += 1
    return {zone: (joined, revoked) for zone, (joined, revoked) in out.items()}


def grow_marks(setup: Setup, steps: int) -> list[int]:
    """Global steps at which a growing setup adds a worker (none for a static one).

    Examples
    --------
    >>> grow_marks(Setup("dyn", "k80", 1, True, grow_to=4), 64000)
    [16000, 32000, 48000]
    """
    adds = setup.grow_to - setup.workers
    if adds <= 0:
        return []
    every = steps / (adds + 1)
    return [round(every * (i + 1)) for i in range(adds)]


def join_delays(events: Sequence[Mapping[str, Any]], time_scale: float) -> list[float]:
    """Simulated seconds from each scale-up to the first paced step of the trainer it added.

    What a growing cluster loses per added worker: the VM's start-up (the paper's 81-98 s) and
    this host's own process start-up (counted at ``time_scale``: seconds here are minutes of
    simulated time; the paper's restart took 79 s cold).
    """
    scales = [float(e["time"]) for e in events if e.get("kind") == "scale"]
    paced = sorted(
        (float(e["time"]), str(e.get("worker")))
        for e in events
        if e.get("kind") == "emulation-paced" and e.get("role") == "worker"
    )
    out = []
    used: set[str] = set()
    for t in scales:
        nxt = next(((tp, w) for tp, w in paced if tp >= t and w not in used), None)
        if nxt is not None:
            used.add(nxt[1])
            out.append((nxt[0] - t) * time_scale)
    return out


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


def _pace(setup: Setup, wall_pace: float) -> float:
    """A wall pace at which ``setup``'s fastest type asks this host for a K80's wall rate."""
    fastest = max(_rate(g) for g in setup.types)
    return wall_pace * _rate("k80") / max(_rate("k80"), fastest)


def mixed_table(
    setups: Sequence[Setup] = MIXED_SETUPS,
    *,
    steps_per_worker: int = 160,
    wall_pace: float = 1.2,
    seed: int = 0,
    prices: str = "paper-2019",
    **options: Any,
) -> pd.DataFrame:
    """Experiment 3: a mixed cluster against the same number of workers of one type.

    The first setup is the slow one (4 K80), the last the dear one (4 V100): ``faster`` is the
    time saved against the first, ``cheaper`` the money saved against the last. Every setup gets
    the paper's lifetimes of its own types, and a wall pace at which its fastest type asks this
    host for a K80's rate (so the host keeps every pace).
    """
    rows = []
    for setup in setups:
        r = run_setup(
            setup,
            steps=steps_per_worker * setup.workers,
            wall_pace=_pace(setup, wall_pace),
            seed=seed,
            prices=prices,
            **options,
        )
        rows.append(r)
    ours = pd.DataFrame(rows).set_index("setup")
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
    seed: int = 0,
    prices: str = "paper-2019",
    **options: Any,
) -> pd.DataFrame:
    """Experiment 4: a cluster that grows by one worker each quarter, against static ones.

    Every setup runs the same ``steps_per_worker`` x 4 global steps (the growing one ends with
    4 workers). ``faster`` and ``cheaper`` are against the first setup (static, the size the
    growing one starts at, its PS billed), as the paper compared its growing cluster with a
    static one. ``join s``: simulated seconds from each scale-up to the new trainer's first step.
    """
    steps = steps_per_worker * max(s.most_workers for s in setups)
    rows = []
    for setup in setups:
        rows.append(
            run_setup(
                setup,
                steps=steps,
                wall_pace=_pace(setup, wall_pace),
                seed=seed,
                prices=prices,
                **options,
            )
        )
    ours = pd.DataFrame(rows).set_index("setup")
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


def format_types(types: Mapping[str, int]) -> str:
    """``{"k80": 2, "v100": 1}`` as ``"2 k80 + 1 v100"``."""
    return " + ".join(f"{n} {g}" for g, n in types.items())


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
    seed: int = 0,
    **options: Any,
) -> pd.DataFrame:
    """Table I/III, the paper's figures beside ours, one row per setup.

    Each setup runs ``steps_per_worker`` x workers global steps (so every run takes about the
    same wall time). Speedups and savings are over the first setup (1 on-demand K80).
    """
    rows = []
    for setup in setups:
        steps = steps_per_worker * setup.workers
        rows.append(run_setup(setup, steps=steps, wall_pace=wall_pace, seed=seed, **options))
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
    seed: int = 0,
    lifetimes: str = "paper:k80",
    **options: Any,
) -> pd.DataFrame:
    """The paper's experiment with today's GPUs and prices (``gce-2025``); speedups and savings
    over the first setup.

    No lifetime study of today's GPUs is at hand: Spot workers get ``lifetimes`` (the paper's K80
    curve by default). Step rates other than K80/P100/V100 are estimates. Faster GPUs get a
    lower ``wall_pace`` so that every setup asks this host for about a K80's wall rate.
    """
    rows = []
    for setup in setups:
        pace = wall_pace * _rate("k80") / max(_rate("k80"), _rate(setup.gpu))
        r = run_setup(
            setup,
            steps=steps_per_worker * setup.workers,
            wall_pace=pace,
            seed=seed,
            prices="gce-2025",
            lifetimes=lifetimes,
            **options,
        )
        rows.append(r)
    ours = pd.DataFrame(rows).set_index("setup")
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
