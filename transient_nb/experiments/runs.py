"""One setup of the paper, run: a paced local cluster, its lifetimes armed once training runs,
grown at its marks, measured over the window every trainer ran (see
:mod:`transient_nb.experiments.reproduce` for how a run is scaled down)."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import pandas as pd

from transient_nb.eventlog.bill import Bill
from transient_nb.eventlog.folds import event_log, summarize
from transient_nb.experiments.setups import PAPER_STEPS, Setup


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
    ``behind`` (paced processes that fell behind, one more where a trainer joined too late
    for two windows of them all) and ``note`` (the summary's emulation note).
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
    # A host too busy to start every trainer in time (a trainer's first call timed out and was
    # retried) can end the run before two windows of all of them: then the pace is read over
    # every window there was, and the row says the host did not keep the pace (``behind``).
    late = len(after) < 2
    if late:
        after = _metrics(events)
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
        "behind": summary["emulation_behind"] + int(late),
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
