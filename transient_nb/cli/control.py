"""The commands on a cluster that runs: ``status``, ``attach``, ``adapt``, ``scale``,
``scale-ps``, ``move-ps``, ``down``, ``list``, and ``sweep`` of the VMs of clusters that are gone.

Each one connects to the cluster by name (:func:`transient_nb.connect`), asks, and lets go; the
cluster's owner (a kernel or a head) does the work.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from transient_nb.catalog.mix import format_mix
from transient_nb.cli.parser import _policy_kwargs
from transient_nb.cli.terminal import _failure_line, _print_summary, _progress
from transient_nb.deploy import registry


def sweep_vms(args: argparse.Namespace) -> int:
    from transient_nb.deploy.sweep import sweep

    def confirm(doomed: list[dict[str, Any]]) -> bool:
        if args.yes:
            return True
        answer = input(f"Delete these {len(doomed)}? [y/N] ")
        return answer.strip().lower() in ("y", "yes")

    def choose(unknown: list[dict[str, Any]]) -> list[str]:
        ids = sorted({str(f["id"]) for f in unknown if f["id"]})
        answer = input(
            f"Type the cluster ids to delete anyway, separated by spaces ({', '.join(ids)}); "
            "nothing to keep them all: "
        )
        typed = answer.split()
        unknown_ids = [i for i in typed if i not in ids]
        if unknown_ids:
            print(f"Not among them, ignored: {', '.join(unknown_ids)}")
        return [i for i in typed if i in ids]

    sweep(
        args.project,
        args.zone,
        args.dry_run,
        force=args.force,
        ids=args.ids,
        choose=choose if args.force and args.ids is None else None,
        confirm=confirm,
    )
    return 0


def _connect(name: str) -> Any:
    from transient_nb.deploy.connect import connect

    return connect(name, prefer_local=False)


def _ask(name: str, request: str, *args: Any, **kwargs: Any) -> None:
    """Connect to the cluster ``name``, make one request of its owner (``request``: a method of
    the handle) and close the handle."""
    cluster = _connect(name)
    try:
        getattr(cluster, request)(*args, **kwargs)
    finally:
        cluster.close()


def status(args: argparse.Namespace) -> int:
    """``status NAME``: workers, money and runs of a cluster."""
    cluster = _connect(args.name)
    try:
        counts = cluster.state.counts()
        cost = cluster.cost()
        print(f"Cluster {cluster.name} ({registry.owner(cluster.entry)})")
        print(f"  scheduler   {cluster.scheduler_address}")
        print(
            "  workers     " + ", ".join(f"{n} {state}" for state, n in sorted(counts.items()) if n)
        )
        print(f"  cost        ${cost.total:.4f} (on demand ${cost.total_on_demand:.4f})")
        by_gpu = cost.by_gpu
        if len(by_gpu) > 2:  # more than one GPU type beside the PS host
            print(
                "  per type    "
                + ", ".join(
                    f"{g} {int(r['vms'])} VMs ${r['cost']:.4f}" for g, r in by_gpu.iterrows()
                )
            )
        for r in cluster.runs():
            acc = f"{r.accuracy:.1%}" if r.accuracy is not None else "-"
            steps = r.started_event.get("steps", "?")
            state = r.reason or ("running" if not r.done else "gone")
            print(
                f"  {r.id}  {r.model_name} on {r.data}: step {r.step}/{steps}, accuracy {acc}, {state}"
            )
        if not cluster.runs():
            print("  no training run yet")
    finally:
        cluster.close()
    return 0


def attach(args: argparse.Namespace) -> int:
    """``attach NAME``: follow the cluster's newest run; Ctrl-C leaves it running."""
    cluster = _connect(args.name)
    try:
        job = cluster.run
        if job is None:
            print(f"Cluster {cluster.name} has no training run yet.")
            return 0
        try:
            _progress(job, int(job.started_event.get("steps") or 0), quiet=args.quiet)
        except KeyboardInterrupt:
            print(f"\nDetached; run {job.id} goes on (transient-nb attach {cluster.name}).")
            return 0
        if job.finished_event is None:
            print(f"Cluster {cluster.name} went away before run {job.id} finished.")
            return 1
        if job.error is not None:
            print(_failure_line(job), file=sys.stderr)
            return 1
        _print_summary(job.summary())
    finally:
        cluster.close()
    return 0


def adapt(args: argparse.Namespace) -> int:
    """``adapt NAME GOAL``: start (``off``: stop) the policy of a running cluster."""
    goal, kwargs = _policy_kwargs(args, args.goal)
    _ask(args.name, "adapt", goal, **kwargs)
    state = "off" if goal is None else f"on, goal {args.goal}"
    print(f"Cluster {args.name}: policy {state}.")
    return 0


def scale(args: argparse.Namespace) -> int:
    """``scale NAME N [--gpu G] [--on-demand M]``: ask the owner to keep N workers (of type G),
    or a mix, M of them on demand."""
    kwargs: dict[str, Any] = {}
    if args.gpu is not None:
        kwargs["gpu"] = args.gpu
    if args.on_demand is not None:
        kwargs["on_demand"] = args.on_demand
    _ask(args.name, "scale", args.n, **kwargs)
    what = format_mix(args.n) if isinstance(args.n, dict) else f"{args.n}"
    share = ""
    if args.on_demand is not None:
        od = args.on_demand
        text = format_mix(od) if isinstance(od, dict) else str(od or "")
        share = f", {text or 'none'} on demand"
    print(
        f"Cluster {args.name}: scaling to {what}{f' {args.gpu}' if args.gpu else ''} "
        f"workers{share}."
    )
    return 0


def scale_ps(args: argparse.Namespace) -> int:
    """``scale-ps NAME N``: ask the owner to keep N PS hosts (a run without ``shards=`` follows)."""
    _ask(args.name, "scale_ps", args.n)
    print(f"Cluster {args.name}: keeping {args.n} PS host(s), one PS shard each.")
    return 0


def move_ps(args: argparse.Namespace) -> int:
    """``move-ps NAME ZONE``: ask the owner to move its PS hosts to ZONE (a run follows)."""
    _ask(args.name, "move_ps", args.zone, reason=args.reason)
    print(f"Cluster {args.name}: moving the PS to {args.zone}.")
    return 0


def down(args: argparse.Namespace) -> int:
    """``down NAME``: close the cluster (its runs stop first) and wait for its owner to go."""
    import psutil

    cluster = _connect(args.name)
    pid = int(cluster.entry.get("pid") or 0)
    detached = cluster.detached
    cluster.shutdown()
    if detached and pid:
        try:
            psutil.Process(pid).wait(args.timeout)
        except psutil.NoSuchProcess:
            pass
        except psutil.TimeoutExpired:
            print(f"The head (pid {pid}) is still closing after {args.timeout:g} s.")
            return 1
    print(f"Cluster {args.name} is down.")
    return 0


def list_clusters() -> int:
    entries = registry.entries()
    if not entries:
        print("No transient clusters are running.")
        return 0
    for e in entries:
        state = "stale (owner gone)" if e["stale"] else "running"
        owner = registry.owner(e)
        print(
            f"{e['name']:<24} {e.get('backend', '?'):<6} {state:<20} {owner:<14} "
            f"{e.get('scheduler_address', '')}"
        )
    return 0
