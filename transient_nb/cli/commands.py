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

from transient_nb.catalog.mix import format_mix, parse_mix, zero_mix
from transient_nb.cli import workloads
from transient_nb.deploy import registry
from transient_nb.eventlog.format import metrics_text, model_text

#: Defaults of ``run``'s training options (a resumed run keeps its own instead): minutes on 2 cores.
CLI_DEFAULTS: dict[str, Any] = {
    "model": "resnet8",
    "data": "synthetic",
    "steps": 2000,
    "batch_size": 32,
    "lr": 0.1,
    "shards": 1,
}


def _workers(text: str) -> int | dict[str, int]:
    """``--workers``: a number, or a mix of GPU types such as ``k80=2,p100=1,v100=1``."""
    try:
        if "=" not in text:
            n = int(text)
            if n < 0:
                raise ValueError(f"workers={n} must be a whole number of at least 0.")
            return n
        return parse_mix(text, "")
    except ValueError as e:
        msg = str(e) if "=" in text or "workers=" in str(e) else f"{text!r} is not a number"
        raise argparse.ArgumentTypeError(
            f"{msg} (give a number of workers, or TYPE=COUNT pairs such as k80=2,v100=1)"
        ) from None


def _on_demand(text: str) -> int | dict[str, int]:
    """``scale --on-demand``: how many of the workers run on demand, a number (of the type N
    counts) or TYPE=COUNT pairs such as ``v100=1`` (``0``, or every type at 0: none)."""
    if zero_mix(text):
        return {}
    return _workers(text)


def _add_cluster_options(r: argparse.ArgumentParser) -> None:
    r.add_argument("--name", default=None, help="cluster name (default: a fresh one)")
    r.add_argument(
        "--workers",
        type=_workers,
        default=4,
        metavar="N|TYPE=N,...",
        help="preemptible GPU workers (default 4), or a mix of GPU types: k80=2,p100=1,v100=1",
    )
    r.add_argument(
        "--ps-hosts",
        type=int,
        default=None,
        help="never-preemptible PS hosts (default 1); shards default to one per host",
    )
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
    r.add_argument("--seed", type=int, default=0)
    r.add_argument(
        "--cluster-budget",
        type=float,
        default=None,
        help="close the cluster once it has spent this many dollars",
    )
    r.add_argument(
        "--cluster-deadline", default=None, help="close the cluster after this long, e.g. 2h"
    )


def _add_goal_options(r: argparse.ArgumentParser, flag: str, help: str) -> None:
    r.add_argument(flag, default=None, metavar="GOAL", help=help)
    r.add_argument("--gpus", default=None, help="GPU types the policy may use, e.g. t4,v100")
    r.add_argument(
        "--policy-max-workers", type=int, default=None, help="largest cluster the policy asks for"
    )
    r.add_argument(
        "--spot-only",
        action="store_true",
        help="the policy keeps every worker Spot (by default it may run some on demand where "
        "its goal needs them, e.g. a deadline a storm of revocations makes Spot miss)",
    )
    r.add_argument(
        "--history",
        default=None,
        metavar="PATH",
        help="the policy plans from what earlier runs saw, kept in PATH (this run added); "
        "default: the configuration's policy.history",
    )


def _policy_kwargs(args: argparse.Namespace, goal_text: str) -> tuple[str | None, dict[str, Any]]:
    from transient_nb.policy.goals import parse_goal

    goal, kwargs = parse_goal(goal_text)
    if args.gpus:
        kwargs["gpus"] = [g.strip() for g in args.gpus.split(",") if g.strip()]
    if args.policy_max_workers is not None:
        kwargs["max_workers"] = args.policy_max_workers
    if getattr(args, "spot_only", False) and goal is not None:
        kwargs["on_demand"] = False
    if getattr(args, "history", None) and goal is not None:
        kwargs["history"] = args.history
    return goal, kwargs


def _add_train_options(r: argparse.ArgumentParser) -> None:
    r.add_argument(
        "--model",
        default=None,
        help="resnet32 | resnet32-t2t | resnet20 | resnet8 (default resnet8: minutes on 2 CPU "
        "cores), or your own: the import path pkg.mod:attr of an nn.Module or its factory",
    )
    r.add_argument(
        "--data",
        default=None,
        help="synthetic | digits | cifar10:PATH-OR-URL, or the import path pkg.mod:attr of a "
        "(train, test) pair of Datasets or its factory",
    )
    r.add_argument("--steps", type=int, default=None, help="global steps (default 2000)")
    r.add_argument(
        "--batch-size", type=int, default=None, help="images per worker step (default 32)"
    )
    r.add_argument("--lr", type=float, default=None, help="base learning rate (default 0.1)")
    r.add_argument(
        "--shards",
        type=int,
        default=None,
        help="parameter-server shards (default: one per PS host)",
    )
    r.add_argument("--target-accuracy", type=float, default=None, help="stop at this test accuracy")
    r.add_argument(
        "--budget", type=float, default=None, help="stop when this many dollars are spent"
    )
    r.add_argument("--deadline", default=None, help="stop after this long, e.g. 10m")
    r.add_argument(
        "--eval-images", type=int, default=1000, help="test images per evaluation (default 1000)"
    )
    r.add_argument(
        "--resume",
        default=None,
        metavar="RUN_ID_OR_URL",
        help="continue this run from its newest complete checkpoint (its settings are kept)",
    )
    workloads.add_workload_options(r)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="transient-nb", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser(
        "run", help="train on a transient cluster and report speed, accuracy and cost"
    )
    _add_cluster_options(r)
    _add_train_options(r)
    _add_goal_options(
        r,
        "--adapt",
        "let the transient-aware policy choose the GPU mix during the run: deadline:DURATION, "
        "budget:DOLLARS or cost-per-step",
    )
    r.add_argument(
        "--detach",
        action="store_true",
        help="run in a head process that outlives this command; follow it with "
        "`transient-nb attach NAME`, end it with `transient-nb down NAME`",
    )
    r.add_argument(
        "--out", default="runs/latest", help="folder for the run record, summary and report"
    )
    r.add_argument(
        "--json", default=None, metavar="PATH", help="also write the summary as JSON here"
    )
    r.add_argument("--quiet", action="store_true", help="no progress bar")
    u = sub.add_parser("up", help="start a detached cluster (a head process) and return")
    _add_cluster_options(u)
    sub.add_parser("list", help="clusters registered on this machine")
    st = sub.add_parser("status", help="a cluster's workers, money and training runs")
    st.add_argument("name")
    at = sub.add_parser(
        "attach", help="follow a cluster's current run until it ends (Ctrl-C detaches)"
    )
    at.add_argument("name")
    at.add_argument("--quiet", action="store_true", help="no progress bar")
    sc = sub.add_parser(
        "scale", help="keep N GPU workers (of type --gpu), or a whole mix such as k80=2,v100=1"
    )
    sc.add_argument("name")
    sc.add_argument("n", type=_workers, metavar="N|TYPE=N,...")
    sc.add_argument("--gpu", default=None, help="the GPU type N counts (others keep theirs)")
    sc.add_argument(
        "--on-demand",
        dest="on_demand",
        type=_on_demand,
        default=None,
        metavar="N|TYPE=N,...",
        help="how many of the workers run on demand (a Spot cluster): a number of the type N "
        "counts, or per type such as v100=1 (types left out: none)",
    )
    sp = sub.add_parser(
        "scale-ps", help="keep N PS hosts, one PS shard each (only grows; at most 4)"
    )
    sp.add_argument("name")
    sp.add_argument("n", type=int, metavar="N")
    mp = sub.add_parser(
        "move-ps", help="move the PS hosts to ZONE (the cluster's zone or a fallback zone)"
    )
    mp.add_argument("name")
    mp.add_argument("zone", metavar="ZONE")
    mp.add_argument("--reason", default="", help="said in the ps-move event")
    ad = sub.add_parser(
        "adapt", help="let the transient-aware policy choose a cluster's GPU mix for a goal"
    )
    ad.add_argument("name")
    _add_goal_options(ad, "goal", "deadline:DURATION, budget:DOLLARS, cost-per-step, or off")
    d = sub.add_parser("down", help="stop a cluster and everything it runs")
    d.add_argument("name")
    d.add_argument(
        "--timeout", type=float, default=180, help="seconds to wait for it to stop (default 180)"
    )
    # -- sweep (GCE backend) --
    w = sub.add_parser(
        "sweep",
        help="delete GCE VMs left behind by transient clusters that are gone (their lease ran "
        "out, or their head VM stopped)",
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
        help="also delete what cannot be proven dead (no lease, a head elsewhere): it is shown, "
        "owner and lease included, and only the cluster ids you then type are deleted",
    )
    w.add_argument(
        "--id",
        action="append",
        default=None,
        dest="ids",
        help="with --force: a cluster id to delete without being asked (repeat for more)",
    )
    w.add_argument("--yes", action="store_true", help="delete without asking")
    workloads.add_parsers(sub)
    return p


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


def _print_summary(s: dict[str, Any]) -> None:
    acc = f"{s['accuracy']:.2%}" if s.get("accuracy") is not None else "n/a"
    speedup = s.get("speedup_over_one_worker")
    lines = [
        ("model", model_text(s.get("model"), s.get("parameters"))),
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
    metrics = s.get("metrics") or {}
    if set(metrics) - {"accuracy"}:  # a run's own metrics, each by name
        lines.insert(4, ("final test metrics", metrics_text(metrics)))
    by_gpu = s.get("by_gpu") or {}
    if len(by_gpu) > 1:  # a mixed cluster: each type's share of the workers' steps
        lines.append(
            (
                "steps per GPU type",
                ", ".join(
                    f"{g} {r['steps']} ({r['workers']} workers, {r['steps_per_s']:.2f}/s)"
                    for g, r in by_gpu.items()
                ),
            )
        )
    width = max(len(k) for k, _ in lines)
    print("\nSummary")
    for k, v in lines:
        print(f"  {k:<{width}}  {v}")


def _cluster_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "workers": args.workers,
        "max_workers": args.max_workers,
        "max_hourly_cost": args.max_hourly_cost,
        "gpu": args.gpu,
        "zone": args.zone,
        "spot": False if args.on_demand else None,
        "backend": args.backend,
        "preemption": args.preemption,
        "time_scale": args.time_scale,
        "provisioning_delay": args.provisioning_delay,
        "prices": args.prices,
        "seed": args.seed,
        "budget": args.cluster_budget,
        "deadline": args.cluster_deadline,
        "ps_hosts": getattr(args, "ps_hosts", None),
    }


def _train_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    given = {
        "model": args.model,
        "data": args.data,
        "steps": args.steps,
        "batch_size": args.batch_size,
        "lr": args.lr,
        "shards": args.shards,
    }
    if args.resume:
        # The run's own settings go on; only what was typed is passed (and checked against them).
        given = {k: v for k, v in given.items() if v is not None}
    else:
        given = {k: CLI_DEFAULTS[k] if v is None else v for k, v in given.items()}
        if args.optimizer is not None and args.lr is None:
            del given["lr"]  # a user's optimizer has its own learning rate
        if args.shards is None:  # one shard per PS host, as train() does
            given["shards"] = getattr(args, "ps_hosts", None) or CLI_DEFAULTS["shards"]
    return {
        **given,
        **workloads.workload_kwargs(args),
        "resume": args.resume,
        "target_accuracy": args.target_accuracy,
        "budget": args.budget,
        "deadline": args.deadline,
        "eval_images": args.eval_images,
        "seed": args.seed,
    }


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


def _connect(name: str) -> Any:
    from transient_nb.deploy.connect import connect

    return connect(name, prefer_local=False)


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
    cluster = _connect(args.name)
    try:
        cluster.adapt(goal, **kwargs)
    finally:
        cluster.close()
    state = "off" if goal is None else f"on, goal {args.goal}"
    print(f"Cluster {args.name}: policy {state}.")
    return 0


def scale(args: argparse.Namespace) -> int:
    """``scale NAME N [--gpu G] [--on-demand M]``: ask the owner to keep N workers (of type G),
    or a mix, M of them on demand."""
    cluster = _connect(args.name)
    try:
        kwargs: dict[str, Any] = {}
        if args.gpu is not None:
            kwargs["gpu"] = args.gpu
        if args.on_demand is not None:
            kwargs["on_demand"] = args.on_demand
        cluster.scale(args.n, **kwargs)
    finally:
        cluster.close()
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
    cluster = _connect(args.name)
    try:
        cluster.scale_ps(args.n)
    finally:
        cluster.close()
    print(f"Cluster {args.name}: keeping {args.n} PS host(s), one PS shard each.")
    return 0


def move_ps(args: argparse.Namespace) -> int:
    """``move-ps NAME ZONE``: ask the owner to move its PS hosts to ZONE (a run follows)."""
    cluster = _connect(args.name)
    try:
        cluster.move_ps(args.zone, reason=args.reason)
    finally:
        cluster.close()
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


def _failure_line(job: Any) -> str:
    """One line saying which run failed, how (its reason) and its error."""
    error = " ".join(str(job.error).split())  # one line, whatever the error's own layout
    return f"transient-nb: run {job.id} failed ({job.reason}): {error}"


def _progress_text(job: Any, p: Any) -> str:
    """The bar's text: accuracy, active workers and the run's ETA, the one the panels show
    (:attr:`~transient_nb.eventlog.folds.RunProgress.eta_s`, from the run's recent pace)."""
    from transient_nb.eventlog.format import duration

    acc = f"{job.accuracy:.1%}" if job.accuracy is not None else "-"
    active = len(job.status.get("active", [])) if job.status else 0
    eta = duration(p.eta_s) if p is not None and p.state == "running" else "-"
    return f"acc {acc}, {active} active workers, ETA {eta}"


def _progress(job: Any, steps: int, quiet: bool) -> None:
    from tqdm import tqdm

    from transient_nb.eventlog.folds import RunTracker, event_log

    # No tqdm ETA of its own (it would differ from the panels'): the postfix carries the run's.
    bar = tqdm(
        total=steps,
        unit="step",
        disable=quiet,
        dynamic_ncols=True,
        bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]",
    )
    tracker, seen = RunTracker(job.id), 0
    try:
        while not job.done:
            log = event_log(job.cluster)
            end = len(log)
            tracker.feed(log[seen:end])
            seen = end
            bar.n = min(job.step, steps)
            bar.set_postfix_str(_progress_text(job, tracker.progress), refresh=False)
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
        owner = registry.owner(e)
        print(
            f"{e['name']:<24} {e.get('backend', '?'):<6} {state:<20} {owner:<14} "
            f"{e.get('scheduler_address', '')}"
        )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``transient-nb`` console script."""
    args = _parser().parse_args(argv)
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
