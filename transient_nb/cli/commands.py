"""The ``transient-nb`` command: run a training job on a transient cluster from a terminal.

``transient-nb run`` starts a cluster (local backend unless configured otherwise), trains with
asynchronous PS training while the simulator preempts workers, prints a progress bar and a
summary, and writes the run record, the summary and a standalone HTML report into ``--out``.
``transient-nb list`` shows the clusters running on this machine; ``transient-nb sweep`` deletes
the GCE VMs of clusters that are gone. Your own model and data go by import path
(``--model mypkg.nets:make_net --data mypkg.data:make_data --loss mse``); ``transient-nb export``
writes a run's trained weights, ``transient-nb estimate`` what a cluster would do for a model.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from transient_nb.cli import workloads
from transient_nb.cli.control import (
    adapt,
    attach,
    down,
    list_clusters,
    move_ps,
    scale,
    scale_ps,
    status,
    sweep_vms,
)
from transient_nb.cli.parser import CLI_DEFAULTS as CLI_DEFAULTS
from transient_nb.cli.parser import _cluster_kwargs, _parser, _policy_kwargs, _train_kwargs
from transient_nb.cli.terminal import _failure_line, _print_summary, _progress
from transient_nb.deploy import registry


def run(args: argparse.Namespace) -> int:
    from transient_nb.deploy.cluster import TransientCluster
    from transient_nb.notebook.views.report import save_report
    from transient_nb.training.run import check_train_args, train

    # Mistakes are reported before any worker starts.
    if args.steps is not None and args.steps <= 0:
        raise ValueError(f"--steps {args.steps} must be above 0.")
    if not args.resume:
        check_train_args(
            **{
                k: v
                for k, v in _train_kwargs(args).items()
                if k not in ("resume", "budget", "seed")
            }
        )
    goal, policy_kwargs = _policy_kwargs(args, args.adapt) if args.adapt else (None, {})
    if goal is not None:
        from transient_nb.policy.goals import check_goal

        check_goal(goal, policy_kwargs.get("deadline"), policy_kwargs.get("budget"))
    if args.detach:
        return run_detached(args)
    os.makedirs(args.out, exist_ok=True)
    # The terminal shows the progress bar and the summary; the scheduler's chatter (a line per
    # worker that comes or goes) stays in the run's logs.
    logging.getLogger("distributed").setLevel(logging.WARNING)
    t0 = time.time()
    with TransientCluster(
        name=args.name, run_dir=args.out, detached=False, **_cluster_kwargs(args)
    ) as cluster:
        print(f"Cluster {cluster.name}: {cluster.backend.describe()}", file=sys.stderr)
        cluster.wait_for_workers(1, timeout=300)
        job = train(cluster, **_train_kwargs(args))
        if goal is not None:
            cluster.adapt(goal, **policy_kwargs)
        _progress(job, job.hp.steps, quiet=args.quiet)
        try:
            job.wait()
        except RuntimeError:
            # The run failed (a trainer kept failing, the driver raised): one clear line, the
            # record to look into, and a non-zero exit; not a traceback.
            print(_failure_line(job), file=sys.stderr)
            print(f"Run record: {cluster.run_record}", file=sys.stderr)
            return 1
        summary = job.summary()
        summary["startup_s"] = job.started - t0
        events = job.events()
        run_record = cluster.run_record
    report = save_report(
        os.path.join(args.out, "report.html"),
        events,
        summary,
        title=f"transient_nb: {job.model_name} on {job.data}",
    )
    summary["run_record"] = run_record
    summary["report"] = report
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2, default=str)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2, default=str)
    _print_summary(summary)
    print(f"\nRun record: {run_record}\nReport:     {report}")
    print(f"Weights:    transient-nb export {job.id} PATH --run-dir {args.out}")
    return 0


def _start_head(args: argparse.Namespace) -> Any:
    from transient_nb.deploy.detached import start_detached

    return start_detached(_cluster_kwargs(args), name=args.name)


def run_detached(args: argparse.Namespace) -> int:
    """``run --detach``: start a head, start the run in it, say how to follow it, return."""
    from transient_nb.training.run import train

    cluster = _start_head(args)
    try:
        run_view = train(cluster, **{k: v for k, v in _train_kwargs(args).items() if v is not None})
        if args.adapt:
            goal, policy_kwargs = _policy_kwargs(args, args.adapt)
            cluster.adapt(goal, **policy_kwargs)
    except BaseException:
        cluster.shutdown()  # nothing is left running when the run cannot start
        raise
    print(f"Cluster {cluster.name}: {registry.owner(cluster.entry)}; run {run_view.id} started.")
    print(f"  follow it:  transient-nb attach {cluster.name}")
    print(f"  status:     transient-nb status {cluster.name}")
    print(f"  end it:     transient-nb down {cluster.name}")
    cluster.close()
    return 0


def up(args: argparse.Namespace) -> int:
    """``up``: start a detached cluster and return."""
    cluster = _start_head(args)
    print(
        f"Cluster {cluster.name} is up: {registry.owner(cluster.entry)}, scheduler "
        f"{cluster.scheduler_address}."
    )
    print(f"  in a notebook:  transient_nb.connect({cluster.name!r})")
    print(f"  end it:         transient-nb down {cluster.name}")
    cluster.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``transient-nb`` console script (its exit status)."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:  # argparse's: --help (0), or a mistake it has explained (2)
        return e.code if isinstance(e.code, int) else 2
    try:
        commands = {
            "run": run,
            "up": up,
            "status": status,
            "attach": attach,
            "down": down,
            "scale": scale,
            "scale-ps": scale_ps,
            "move-ps": move_ps,
            "adapt": adapt,
            "sweep": sweep_vms,
            "export": workloads.export,
            "estimate": workloads.estimate,
        }
        if args.command in commands:
            return commands[args.command](args)
        return list_clusters()
    except ValueError as e:
        print(f"transient-nb: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
