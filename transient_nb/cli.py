"""The ``transient-nb`` command: run a training job on a transient cluster from a terminal.

``transient-nb run`` starts a cluster (local backend unless configured otherwise), trains with
asynchronous PS training while the simulator preempts workers, prints a progress bar and a
summary, and writes the run record, the summary and a standalone HTML report into ``--out``.
``transient-nb list`` shows the clusters running on this machine; ``transient-nb sweep`` deletes
the GCE VMs of clusters that are gone.
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

from transient_nb import registry


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="transient-nb", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser(
        "run", help="train on a transient cluster and report speed, accuracy and cost"
    )
    r.add_argument("--workers", type=int, default=4, help="preemptible GPU workers (default 4)")
    r.add_argument(
        "--max-workers",
        type=int,
        default=None,
        help="refuse more workers than this (default: transient.limits.max-workers, 64)",
    )
    r.add_argument(
        "--max-hourly-cost",
        type=float,
        default=None,
        help="refuse workers that could cost more dollars per hour than this (with the PS host)",
    )
    r.add_argument("--gpu", default=None, help="GPU type (price catalog key), e.g. t4, k80")
    r.add_argument("--zone", default=None, help="zone of the workers, e.g. us-central1-a")
    r.add_argument("--on-demand", action="store_true", help="on-demand workers instead of Spot")
    r.add_argument("--backend", default=None, help="local (default) or gce")
    r.add_argument(
        "--preemption",
        default="exp:mean=60s",
        help="none | paper:k80 | exp:mean=60s | trace:PATH (default exp:mean=60s)",
    )
    r.add_argument(
        "--time-scale",
        type=float,
        default=None,
        help="simulated seconds per wall second (default: config, 1)",
    )
    r.add_argument(
        "--provisioning-delay",
        default="5s",
        help="time from request to running VM: 'paper' or a duration (default 5s)",
    )
    r.add_argument(
        "--prices", default=None, help="price catalog: gce-2025, paper-2019 or a YAML path"
    )
    r.add_argument(
        "--model",
        default="resnet8",
        help="resnet32 | resnet32-t2t | resnet20 | resnet8 (default resnet8: minutes on 2 CPU cores)",
    )
    r.add_argument("--data", default="synthetic", help="synthetic | digits | cifar10:PATH-OR-URL")
    r.add_argument("--steps", type=int, default=2000, help="global steps (default 2000)")
    r.add_argument("--batch-size", type=int, default=32, help="images per worker step (default 32)")
    r.add_argument("--lr", type=float, default=0.1, help="base learning rate (default 0.1)")
    r.add_argument("--shards", type=int, default=1, help="parameter-server shards (default 1)")
    r.add_argument("--target-accuracy", type=float, default=None, help="stop at this test accuracy")
    r.add_argument(
        "--budget", type=float, default=None, help="stop when this many dollars are spent"
    )
    r.add_argument("--deadline", default=None, help="stop after this long, e.g. 10m")
    r.add_argument(
        "--eval-images", type=int, default=1000, help="test images per evaluation (default 1000)"
    )
    r.add_argument("--seed", type=int, default=0)
    r.add_argument(
        "--out", default="runs/latest", help="folder for the run record, summary and report"
    )
    r.add_argument(
        "--json", default=None, metavar="PATH", help="also write the summary as JSON here"
    )
    r.add_argument("--quiet", action="store_true", help="no progress bar")
    sub.add_parser("list", help="clusters registered on this machine")
    # -- sweep (GCE backend) --
    w = sub.add_parser(
        "sweep", help="delete GCE VMs left behind by transient clusters that are gone"
    )
    w.add_argument("--project", default=None, help="GCE project (default: config or gcloud's)")
    w.add_argument(
        "--zone",
        action="append",
        default=None,
        help="zone to look in; repeat for more (default: every zone of the price catalog)",
    )
    w.add_argument("--dry-run", action="store_true", help="only list what would be deleted")
    w.add_argument(
        "--force",
        action="store_true",
        help="also delete VMs created from other machines (their owner cannot be checked)",
    )
    w.add_argument("--yes", action="store_true", help="delete without asking")
    return p


def sweep_vms(args: argparse.Namespace) -> int:
    from transient_nb.backends.gce import sweep

    def confirm(doomed: list[dict[str, Any]]) -> bool:
        if args.yes:
            return True
        answer = input(f"Delete these {len(doomed)}? [y/N] ")
        return answer.strip().lower() in ("y", "yes")

    sweep(args.project, args.zone, args.dry_run, force=args.force, confirm=confirm)
    return 0


def _print_summary(s: dict[str, Any]) -> None:
    acc = f"{s['accuracy']:.2%}" if s.get("accuracy") is not None else "n/a"
    speedup = s.get("speedup_over_one_worker")
    lines = [
        ("wall time", f"{s['wall_s']:.1f} s"),
        ("global steps", f"{s['steps']}"),
        ("final test accuracy", acc),
        ("preemptions survived", f"{s['preemptions']} (replacements: {s['replacements']})"),
        ("PS recoveries", f"{s['ps_recoveries']} ({s['steps_lost']} steps lost)"),
        ("cost", f"${s['cost']:.4f}"),
        ("on-demand cost", f"${s['cost_on_demand']:.4f}"),
        ("savings", f"${s['saved']:.4f} ({s['saved_fraction']:.0%})"),
        ("throughput", f"{s['img_per_s']:.0f} images/s"),
        (
            "speedup over one worker",
            f"{speedup:.2f}x" if speedup else f"n/a ({s.get('speedup_note') or 'not measured'})",
        ),
    ]
    width = max(len(k) for k, _ in lines)
    print("\nSummary")
    for k, v in lines:
        print(f"  {k:<{width}}  {v}")


def run(args: argparse.Namespace) -> int:
    from transient_nb import TransientCluster
    from transient_nb.training.data import check_data_spec
    from transient_nb.training.models import MODELS
    from transient_nb.training.run import train
    from transient_nb.views.report import save_report

    # Mistakes are reported before any worker starts.
    if args.model not in MODELS:
        raise ValueError(f"Unknown model {args.model!r}: use one of {', '.join(MODELS)}.")
    check_data_spec(args.data)
    if args.steps <= 0:
        raise ValueError(f"--steps {args.steps} must be above 0.")
    os.makedirs(args.out, exist_ok=True)
    # The terminal shows the progress bar and the summary; the scheduler's chatter (a line per
    # worker that comes or goes) stays in the run's logs.
    logging.getLogger("distributed").setLevel(logging.WARNING)
    t0 = time.time()
    with TransientCluster(
        workers=args.workers,
        max_workers=args.max_workers,
        max_hourly_cost=args.max_hourly_cost,
        gpu=args.gpu,
        zone=args.zone,
        spot=False if args.on_demand else None,
        backend=args.backend,
        preemption=args.preemption,
        time_scale=args.time_scale,
        provisioning_delay=args.provisioning_delay,
        prices=args.prices,
        seed=args.seed,
        run_dir=args.out,
    ) as cluster:
        print(f"Cluster {cluster.name}: {cluster.backend.describe()}", file=sys.stderr)
        cluster.wait_for_workers(1, timeout=300)
        job = train(
            cluster,
            model=args.model,
            data=args.data,
            steps=args.steps,
            batch_size=args.batch_size,
            lr=args.lr,
            shards=args.shards,
            target_accuracy=args.target_accuracy,
            budget=args.budget,
            deadline=args.deadline,
            eval_images=args.eval_images,
            seed=args.seed,
        )
        _progress(job, args.steps, quiet=args.quiet)
        job.wait()
        summary = job.summary()
        summary["startup_s"] = job.started - t0
        events = job.events()
        run_record = cluster.run_record
    report = save_report(
        os.path.join(args.out, "report.html"),
        events,
        summary,
        title=f"transient_nb: {args.model} on {args.data}",
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
    return 0


def _progress(job: Any, steps: int, quiet: bool) -> None:
    from tqdm import tqdm

    bar = tqdm(total=steps, unit="step", disable=quiet, dynamic_ncols=True)
    try:
        while not job.done:
            bar.n = min(job.step, steps)
            acc = f"{job.accuracy:.1%}" if job.accuracy is not None else "-"
            active = len(job.status.get("active", [])) if job.status else 0
            bar.set_postfix_str(f"acc {acc}, {active} active workers", refresh=False)
            bar.refresh()
            time.sleep(0.5)
        bar.n = min(job.step, steps)
        bar.refresh()
    finally:
        bar.close()


def list_clusters() -> int:
    entries = registry.entries()
    if not entries:
        print("No transient clusters are running.")
        return 0
    for e in entries:
        state = "stale (owner gone)" if e["stale"] else "running"
        print(
            f"{e['name']:<24} {e.get('backend', '?'):<6} {state:<20} {e.get('scheduler_address', '')}"
        )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``transient-nb`` console script."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "run":
            return run(args)
        if args.command == "sweep":
            return sweep_vms(args)
        return list_clusters()
    except ValueError as e:
        print(f"transient-nb: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
