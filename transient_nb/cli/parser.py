"""The ``transient-nb`` command's parser, and the keyword arguments its options become.

Every subcommand's options and their types (each error says what to give instead); the
reference page (``docs/reference/cli.md``) is generated from :func:`_parser`.
"""

from __future__ import annotations

import argparse
from typing import Any

from transient_nb.catalog.mix import parse_mix, zero_mix
from transient_nb.cli import workloads

#: The command's one-line description (the first line of its ``--help``).
DESCRIPTION = (
    "The ``transient-nb`` command: run a training job on a transient cluster from a terminal."
)

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
    p = argparse.ArgumentParser(prog="transient-nb", description=DESCRIPTION)
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
