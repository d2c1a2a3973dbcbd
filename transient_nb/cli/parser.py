"""The ``transient-nb`` command's parser, and the keyword arguments its options become.

Every subcommand's options and their types (each error says what to give instead); those the
magic takes too come from the one option table (:mod:`transient_nb.deploy.options`). The
reference page (``docs/reference/cli.md``) is generated from :func:`_parser`.
"""

from __future__ import annotations

import argparse
from typing import Any

from transient_nb.cli import workloads
from transient_nb.deploy import arg_types, options

#: The command's one-line description (the first line of its ``--help``).
DESCRIPTION = (
    "The ``transient-nb`` command: run a training job on a transient cluster from a terminal."
)

#: Defaults of ``run``'s training options, filled in after parsing (a resumed run keeps its own
#: instead): the option table's (:data:`transient_nb.deploy.options.CLI_RUN_DEFAULTS`).
CLI_DEFAULTS: dict[str, Any] = options.CLI_RUN_DEFAULTS


def _add_cluster_options(r: argparse.ArgumentParser) -> None:
    options.add(r, *options.CLUSTER)
    r.add_argument(
        "--cluster-budget",
        type=arg_types.money("budget"),
        default=None,
        metavar="USD",
        help="close the cluster once it has spent this many dollars",
    )
    r.add_argument(
        "--cluster-deadline",
        type=arg_types.length("deadline", "2h"),
        default=None,
        metavar="DURATION",
        help="close the cluster after this long, e.g. 2h",
    )


def _add_goal_options(r: argparse.ArgumentParser, flag: str, help: str) -> None:
    if flag.startswith("-"):
        r.add_argument(flag, default=None, metavar="GOAL", help=help)
    else:
        options.add(r, "goal")
    options.add(r, "gpus")
    r.add_argument(
        "--policy-max-workers",
        type=arg_types.whole("workers", 1),
        default=None,
        metavar="N",
        help="largest cluster the policy asks for",
    )
    options.add(r, "spot_only", "memory", "history")


def _policy_kwargs(args: argparse.Namespace, goal_text: str) -> tuple[str | None, dict[str, Any]]:
    from transient_nb.policy.goals import parse_goal

    goal, kwargs = parse_goal(goal_text)
    if args.gpus:
        kwargs["gpus"] = args.gpus
    if args.policy_max_workers is not None:
        kwargs["max_workers"] = args.policy_max_workers
    if getattr(args, "spot_only", False) and goal is not None:
        kwargs["on_demand"] = False
    if getattr(args, "memory", None) and goal is not None:
        kwargs["memory"] = args.memory
    return goal, kwargs


def _add_train_options(r: argparse.ArgumentParser) -> None:
    options.add(r, *options.TRAIN)
    r.add_argument(
        "--resume",
        default=None,
        metavar="RUN_ID_OR_URL",
        help="continue this run from its newest complete checkpoint (its settings are kept)",
    )


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
    options.add(r, "detach")
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
    options.add(sc, *options.SCALE)
    sp = sub.add_parser(
        "scale-ps", help="keep N PS hosts, one PS shard each (only grows; at most 4)"
    )
    sp.add_argument("name")
    options.add(sp, "ps_n")
    mp = sub.add_parser(
        "move-ps", help="move the PS hosts to ZONE (the cluster's zone or a fallback zone)"
    )
    mp.add_argument("name")
    options.add(mp, "ps_zone", "reason")
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
        "spot": args.spot,
        "backend": args.backend,
        "preemption": args.preemption,
        "time_scale": args.time_scale,
        "provisioning_delay": args.provisioning_delay,
        "notice": args.notice,
        "prices": args.prices,
        "fallback_zones": args.fallback_zones,
        "fallback_gpus": args.fallback_gpus,
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
        given = {k: CLI_DEFAULTS.get(k) if v is None else v for k, v in given.items()}
        if given["lr"] is None:
            del given["lr"]  # train()'s own (0.1), or a user's optimizer's
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
