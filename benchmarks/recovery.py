"""Recovery: the framework's own share of the time lost to a preemption or to losing the PS.

What is measured
----------------
A small run (``train(model="resnet8", data="digits")``) on a local
:class:`~transient_nb.TransientCluster` with two gpu workers (``--workers``; one with ``--tiny``) and the provisioning delay set to
zero, so every second below is the framework's (process start, imports, joining, trainer start,
PS re-creation), not the provider's. Three scenarios, ``--repeats`` times each:

* ``worker, notice``: ``cluster.preempt(name, notice=True)`` on a training worker. Phases: notice
  -> the worker left (drain: its trainer finishes its step, pushes it and leaves), -> the VM is
  gone (``preempted``; the replacement is asked for now, ``replace_at="preempted"``), -> the
  replacement joined, -> its first accepted update. Framework share = left -> first update (the
  drain is useful work).
* ``worker, no notice``: ``cluster.preempt(name, notice=False)`` (SIGKILL). Phases: kill -> the
  cluster's ``preempted`` event, -> replacement joined, -> first update. Share = kill -> first
  update.
* ``ps``: ``os.killpg(pid, SIGKILL)`` of the ps VM. Phases: kill -> ``ps-lost`` (the driver
  noticed), -> ``ps-recovered`` (a new ps host joined and the PS was re-created from its last
  checkpoint), -> the first update on the new PS. Share = kill -> first update.

Times come from the run's event log (``notice``, ``preempted``, ``joined``, ``ps-lost``,
``ps-recovered``) and, for "first update", from polling the PS status every 20 ms (the
replacement's ``accepted`` count > 0; for the PS, its step above the resumed step).

Targets: worker < 3 s, PS < 30 s (framework share).

Run
---
    python benchmarks/recovery.py              # 3 repeats of each scenario, ~2 minutes
    python benchmarks/recovery.py --tiny       # one of each (CI)
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common
from _common import log, md_table, median, spread

#: Issue 29's worker target (3 s, from 5 s in round two); the PS's is round two's.
TARGETS = {"worker, notice": 3.0, "worker, no notice": 3.0, "ps": 30.0}
#: The columns of the table it prints.
COLUMNS = [
    "scenario",
    "repeats",
    "drain s",
    "stop s",
    "replacement up s",
    "first update s",
    "framework share s",
    "share range",
    "target s",
]


def wait_until(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.02)


def first_event(run: Any, kind: str, after: float, **match: Any) -> dict[str, Any] | None:
    for e in run.events():
        if (
            e.get("kind") == kind
            and e["time"] >= after
            and all(e.get(k) == v for k, v in match.items())
        ):
            return e
    return None


def training_workers(run: Any, poller: Any, since: float) -> list[str]:
    """Workers whose trainer is pushing now (an update seen in the last two seconds)."""
    now = time.time()
    return sorted(
        name
        for name, ts in poller.per_trainer.items()
        if ts and ts[-1] > max(since, now - 2.0) and name in run.status.get("active", [])
    )


def worker_scenario(cluster: Any, run: Any, poller: Any, notice: bool) -> dict[str, float]:
    """Preempt one training worker; the phases until its replacement's first update."""
    t_start = time.time()
    victim = wait_until(
        lambda: training_workers(run, poller, t_start - 2.0), 120, "a training worker"
    )[0]
    known = {e.get("worker") for e in run.events() if e.get("kind") == "requested"}
    t0 = time.time()
    cluster.preempt(victim, notice=notice)
    if notice:
        t0 = wait_until(
            lambda: first_event(run, "notice", t0, worker=victim), 30, "the notice event"
        )["time"]
        left = wait_until(
            lambda: first_event(run, "left", t0, worker=victim), 120, f"{victim} left"
        )["time"]
    gone = wait_until(
        lambda: first_event(run, "preempted", t0, worker=victim), 120, f"{victim} gone"
    )["time"]
    repl = wait_until(
        lambda: next(
            (
                e
                for e in run.events()
                if e.get("kind") == "requested"
                and e.get("role") == "worker"
                and e.get("worker") not in known
            ),
            None,
        ),
        60,
        "a replacement",
    )["worker"]
    joined = wait_until(lambda: first_event(run, "joined", t0, worker=repl), 300, f"{repl} joined")[
        "time"
    ]
    first = wait_until(lambda: poller.first_seen.get(repl), 300, f"{repl}'s first update")
    if notice:
        # The drain is useful work (the trainer finishes and pushes its step); the framework's
        # share starts when the worker has left.
        return {
            "drain": left - t0,
            "stop": gone - left,
            "up": joined - gone,
            "first": first - joined,
            "share": first - left,
        }
    return {
        "drain": math.nan,
        "stop": gone - t0,
        "up": joined - gone,
        "first": first - joined,
        "share": first - t0,
    }


def ps_scenario(cluster: Any, run: Any, poller: Any) -> dict[str, float]:
    """Kill the PS host's process group; the phases until the first update on the new PS."""
    t_start = time.time()
    wait_until(lambda: training_workers(run, poller, t_start - 2.0), 120, "training workers")
    gen = poller.generation
    vm = next(w for w in cluster.workers.values() if w.spec.role == "ps")
    t0 = time.time()
    os.killpg(vm.pid, signal.SIGKILL)
    lost = wait_until(lambda: first_event(run, "ps-lost", t0), 120, "ps-lost")["time"]
    recovered = wait_until(lambda: first_event(run, "ps-recovered", t0), 300, "ps-recovered")
    resumed = int(recovered["step"])

    def first_update() -> float | None:
        return next(
            (t for t, g, step in poller.samples if g != gen and t >= t0 and step > resumed),
            None,
        )

    first = wait_until(first_update, 300, "the first update on the new PS")
    return {
        "drain": math.nan,
        "stop": lost - t0,
        "up": recovered["time"] - lost,
        "first": first - recovered["time"],
        "share": first - t0,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="one of each scenario (CI)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--notice", default="5s", help="preemption notice (simulated = wall time)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--settle", type=float, default=3.0, help="s of training between scenarios")
    p.add_argument("--workers", type=int, default=2, help="gpu workers (the others keep training)")
    args = p.parse_args(argv)
    if args.tiny:
        args.repeats, args.notice, args.settle, args.workers = 1, "1s", 0.3, 1
    _common.quiet()
    scenarios = ["worker, notice", "worker, no notice", "ps"]
    results: dict[str, list[dict[str, float]]] = {s: [] for s in scenarios}
    t0 = time.time()
    with _common.transient_cluster(args.workers, notice=args.notice) as cluster:
        log(f"cluster up in {time.time() - t0:.1f} s")
        from transient_nb import train

        run = train(
            cluster,
            model="resnet8",
            data="digits",
            steps=10**9,
            batch_size=args.batch,
            eval_every=10**9,
            checkpoint_every=100,
        )
        try:
            wait_until(lambda: run.status or run.done, 120, "the PS")
            with _common.PSPoller(cluster, run.variable) as poller:
                for rep in range(args.repeats):
                    for s in scenarios:
                        if run.done:
                            run.wait(0)
                            raise RuntimeError(f"run ended: {run.reason}")
                        time.sleep(args.settle)
                        if s == "ps":
                            r = ps_scenario(cluster, run, poller)
                        else:
                            r = worker_scenario(cluster, run, poller, notice=s == "worker, notice")
                        results[s].append(r)
                        log(
                            f"rep {rep + 1} {s}: "
                            + ", ".join(f"{k} {v:.2f} s" for k, v in r.items())
                        )
        finally:
            run.stop(wait=True, timeout=60)

    rows = []
    for s in scenarios:
        rs = results[s]

        def med(key: str, rs: list[dict[str, float]] = rs) -> float:
            return median([r[key] for r in rs]) if rs else math.nan

        rows.append(
            [
                s,
                len(rs),
                med("drain") if s == "worker, notice" else "-",
                med("stop"),
                med("up"),
                med("first"),
                med("share"),
                spread([r["share"] for r in rs]),
                TARGETS[s],
            ]
        )
    print(md_table(COLUMNS, rows))
    print(
        "\nmedians of the phases, in order; provisioning delay 0. drain: notice -> the worker "
        "left; stop: left (no notice, ps: the kill) -> the VM is seen gone ('preempted'; ps: "
        "'ps-lost'); replacement up: -> the new worker joined (ps: PS re-created from its "
        "checkpoint, 'ps-recovered'); first update: -> the replacement's first accepted update. "
        "Framework share: left (no notice, ps: the kill) -> first update."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
