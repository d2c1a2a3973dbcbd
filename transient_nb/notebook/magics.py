"""IPython magics: ``%transient_cluster`` (line) and ``%%transient_cluster`` (cell).

Load with ``%load_ext transient_nb``. The magics only parse what the user typed and call the public
Python API (:class:`~transient_nb.TransientCluster`, :func:`~transient_nb.train`,
:func:`~transient_nb.connect`, the views); every mistake is an IPython ``UsageError`` whose one
sentence says what to type instead.
"""

from __future__ import annotations

import argparse
import inspect
import logging
import os
import sys
import time
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.display import display

from transient_nb import config
from transient_nb.catalog.mix import format_mix
from transient_nb.deploy import options, registry
from transient_nb.notebook.magic_cell import BACKEND_OPTIONS as BACKEND_OPTIONS
from transient_nb.notebook.magic_cell import cell_spec, check_train
from transient_nb.notebook.magic_parsers import (
    NEEDS_CLUSTER,
    SUBCOMMANDS,
    _cell,
    _kwargs,
    _parse,
    _usage_errors,
)

#: Execution count at which the magic itself displayed the view of an object (by ``id``): the
#: same object returned as the cell's result is then not displayed a second time.
_shown: dict[int, int] = {}


def _quiet_dask_logs() -> None:
    """Keep the in-process scheduler's INFO lines out of the cells' output.

    A transient cluster's scheduler runs in the kernel, so Dask's default ``info`` level would
    print every worker joining and leaving under the cell that started it; LocalCluster silences
    its logs the same way (``silence_logs``). Levels set below INFO by the user are left alone.
    """
    log = logging.getLogger("distributed")
    if log.getEffectiveLevel() == logging.INFO:
        log.setLevel(logging.WARNING)


@magics_class
class TransientMagics(Magics):
    """The ``%transient_cluster`` magics; ``%load_ext transient_nb`` registers them."""

    def __init__(self, shell: Any):
        super().__init__(shell)
        #: The cluster that scale, preempt, status, train and down act on.
        self.cluster: Any = None
        #: Clusters created or connected in this kernel, by name.
        self.clusters: dict[str, Any] = {}
        #: Training runs started here.
        self.runs: list[Any] = []
        #: Live views shown here, by cluster name (stopped by ``down``).
        self.views: dict[str, list[Any]] = {}
        _quiet_dask_logs()

    # -- the magic ----------------------------------------------------------------------------------
    @line_cell_magic
    def transient_cluster(self, line: str, cell: str | None = None) -> Any:
        """Transient GPU clusters from the notebook: start, scale, preempt, train, watch, stop.

        Line form: ``%transient_cluster SUBCOMMAND [options]``; cell form: ``%%transient_cluster``
        with a YAML body (``cluster:`` keyword arguments of TransientCluster, optional ``train:``
        arguments of train()), so that an experiment is one cell.

        Examples
        --------
        ::

            %load_ext transient_nb
            %transient_cluster up --workers 4 --gpu t4 --spot --preemption paper:k80 --name demo
            %transient_cluster train --model resnet8 --data digits --steps 500
            %transient_cluster train --model net --data data --loss mse --metrics mae
            %transient_cluster save weights.pt
            %transient_cluster estimate --model net --data data --workers t4=4,v100=2
            %transient_cluster preempt 1
            %transient_cluster scale 6
            %transient_cluster up --workers k80=2,p100=1,v100=1 --prices paper-2019 --name mixed
            %transient_cluster scale 3 --gpu v100
            %transient_cluster scale-ps 2
            %transient_cluster move-ps us-east1-c
            %transient_cluster scale 3 --gpu v100 --on-demand 1
            %transient_cluster status
            %transient_cluster down

            %%transient_cluster --as cluster --run-as run
            cluster:
              workers: 3
              preemption: exp:mean=20s
              provisioning_delay: 2s
            train:
              model: resnet8
              data: digits
              steps: 300
        """
        if cell is not None:
            return self._run_cell(line, cell)
        command, _, rest = line.strip().partition(" ")
        if not command:
            raise UsageError(
                "Give a subcommand: %transient_cluster up (or scale, scale-ps, move-ps, adapt, "
                "preempt, status, train, save, estimate, down, list, connect); "
                "%transient_cluster? shows the help."
            )
        if command not in SUBCOMMANDS:
            raise UsageError(
                f"Unknown subcommand {command!r}: type one of {', '.join(SUBCOMMANDS)}, e.g. "
                "%transient_cluster up --workers 4."
            )
        args = _parse(SUBCOMMANDS[command], rest, command)
        if command in NEEDS_CLUSTER and command != "down":
            self._require_cluster(command)
        handler = getattr(self, f"_do_{command.replace('-', '_')}")
        return handler(args)

    # -- helpers --------------------------------------------------------------------------------------
    def _require_cluster(self, command: str) -> Any:
        cluster = self.cluster
        status = getattr(getattr(cluster, "status", None), "name", None)
        if cluster is None or status in ("closed", "closing", "failed"):
            raise UsageError(
                f"No running cluster for `{command}`: start one with %transient_cluster up "
                "(or attach one with %transient_cluster connect NAME)."
            )
        return cluster

    def _bind(self, var: str | None, obj: Any) -> None:
        if var and self.shell is not None:
            self.shell.user_ns[var] = obj

    def _adopt(self, cluster: Any, var: str | None, panel: bool) -> Any:
        from transient_nb.notebook.views.panel import panel_for

        self.cluster = cluster
        self.clusters[cluster.name] = cluster
        self._bind(var, cluster)
        if panel:
            self._show(cluster, panel_for(cluster), cluster.name)
        return cluster

    def _show(self, obj: Any, view: Any, cluster_name: str) -> None:
        display(view)
        # The cell's result is this same object: its display hook must not show it again.
        _shown[id(obj)] = self.shell.execution_count if self.shell is not None else -1
        self.views.setdefault(cluster_name, []).append(view)

    # -- subcommands ----------------------------------------------------------------------------------
    def _do_up(self, args: argparse.Namespace) -> Any:
        from transient_nb.deploy.cluster import TransientCluster

        kwargs = _kwargs(args, options.dests(*options.CLUSTER))
        if args.detach:
            kwargs["detached"] = True
        with _usage_errors("%transient_cluster up: "):
            cluster = TransientCluster(**kwargs)
        return self._adopt(cluster, args.var, not args.no_panel)

    def _do_adapt(self, args: argparse.Namespace) -> None:
        from transient_nb.policy.goals import parse_goal

        with _usage_errors():
            goal, kwargs = parse_goal(args.goal)
            kwargs.update(_kwargs(args, ("gpus", "max_workers", "interval")))
            if args.spot_only and goal is not None:
                kwargs["on_demand"] = False
            if args.memory and goal is not None:
                kwargs["memory"] = args.memory
            self.cluster.adapt(goal, **kwargs)
        if goal is None:
            print(f"{self.cluster.name}: policy off; the cluster keeps its workers.")
        else:
            print(f"{self.cluster.name}: policy on, goal {args.goal}.")

    def _do_scale(self, args: argparse.Namespace) -> None:
        with _usage_errors():
            self.cluster.scale(args.n, **_kwargs(args, ("gpu", "on_demand")))
        if isinstance(args.n, dict):
            what = f"workers {format_mix(args.n)}"
        elif args.gpu:
            what = f"{args.n} {args.gpu.lower()} GPU workers"
        else:
            what = f"{args.n} GPU workers"
        if args.on_demand is not None:
            od = args.on_demand
            text = format_mix(od) if isinstance(od, dict) else str(od or "")
            what += f", {text or 'none'} on demand"
        print(f"{self.cluster.name}: scaling to {what}.")

    def _do_scale_ps(self, args: argparse.Namespace) -> None:
        with _usage_errors():
            self.cluster.scale_ps(args.n)
        print(f"{self.cluster.name}: keeping {args.n} PS host(s), one PS shard each.")

    def _do_move_ps(self, args: argparse.Namespace) -> None:
        with _usage_errors():
            self.cluster.move_ps(args.zone, reason=args.reason)
        print(f"{self.cluster.name}: moving the PS to {args.zone}.")

    def _do_preempt(self, args: argparse.Namespace) -> None:
        target: int | str = args.target
        if str(target).lstrip("-").isdigit():
            target = int(target)
            if target < 1:
                raise UsageError(
                    f"Cannot preempt {target} workers: give a count of at least 1 or a worker "
                    "name, e.g. %transient_cluster preempt w-1."
                )
        notice = not args.no_notice
        with _usage_errors():
            result = self.cluster.preempt(target, notice=notice)
        names = result if isinstance(result, list) else [target]
        how = "with the notice" if notice else "without notice"
        print(f"{self.cluster.name}: preempting {', '.join(map(str, names))} ({how}).")

    def _do_status(self, args: argparse.Namespace) -> Any:
        from transient_nb.notebook.views.status import cluster_status

        return cluster_status(self.cluster)

    def _do_train(self, args: argparse.Namespace) -> Any:
        if not hasattr(self.cluster, "run_path") and not getattr(self.cluster, "detached", False):
            raise UsageError(
                f"Cluster {self.cluster.name!r} belongs to another kernel: train from that kernel "
                "(connect gives control and views, not training)."
            )
        # The table's options, and the magic's own (its decorators in magic_parsers._train).
        own = ("eval_every", "checkpoint_every", "checkpoint_url")
        kwargs = _kwargs(args, (*options.dests(*options.TRAIN, "seed"), *own))
        kwargs = self._named(kwargs)
        return self._start_run(kwargs, args.var, not args.no_dashboard, args.wait)

    def _named(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """Names of the notebook's variables replaced by what they hold."""
        from transient_nb.notebook.workloads import from_namespace

        namespace = self.shell.user_ns if self.shell is not None else {}
        with _usage_errors("%transient_cluster train: "):
            return from_namespace(kwargs, namespace)

    def _do_save(self, args: argparse.Namespace) -> None:
        from transient_nb.notebook.workloads import save

        if args.run_var:
            namespace = self.shell.user_ns if self.shell is not None else {}
            run = namespace.get(args.run_var)
            if not hasattr(run, "save"):
                raise UsageError(
                    f"{args.run_var!r} is not a training run of this notebook; give --run VAR of "
                    "one (or leave it out for the latest)."
                )
        elif self.runs:
            run = self.runs[-1]
        else:
            raise UsageError(
                "No training run in this kernel to save: start one with %transient_cluster train."
            )
        with _usage_errors("%transient_cluster save: "):
            print(save(run, args.path))

    def _do_estimate(self, args: argparse.Namespace) -> Any:
        from transient_nb.training.estimate import estimate, measured_from_text

        named = self._named({"model": args.model, "data": args.data, "loss": args.loss})
        workers = (
            args.workers
            if isinstance(args.workers, dict) or args.workers is None
            else {str(config.get("gpu")): args.workers}
        )
        with _usage_errors("%transient_cluster estimate: "):
            return estimate(
                named["model"],
                named["data"],
                workers,
                args.steps,
                batch_size=args.batch_size,
                shards=args.shards,
                loss=named["loss"],
                measured=measured_from_text(args.measured),
                prices=args.prices,
            )

    def _start_run(
        self,
        kwargs: dict[str, Any],
        var: str | None,
        dashboard: bool,
        wait: bool,
        with_cluster: bool = False,
    ) -> Any:
        from transient_nb.notebook.views.dashboard import Dashboard
        from transient_nb.notebook.views.panel import ClusterPanel, panel_for
        from transient_nb.training.run import train

        with _usage_errors("%transient_cluster train: "):
            run = train(self.cluster, **kwargs)
        self.runs.append(run)
        self._bind(var, run)
        # The cluster's panel was shown by `up`: the run shows its progress only. The cell form
        # shows one panel for both, the cluster with its run.
        view = ClusterPanel(self.cluster, run=run) if with_cluster else panel_for(run)
        self._show(run, view, self.cluster.name)
        if dashboard:
            self._show(run, Dashboard(self.cluster, run), self.cluster.name)
        if wait:
            run.wait()
        return run

    def _do_down(self, args: argparse.Namespace) -> None:
        if args.name:
            cluster = self.clusters.get(args.name)
            if cluster is None:
                known = ", ".join(self.clusters) or "none"
                raise UsageError(
                    f"No cluster named {args.name!r} in this kernel (known: {known}); use "
                    f"%transient_cluster connect {args.name} first to close another kernel's."
                )
        else:
            cluster = self._require_cluster("down")
        for run in self.runs:
            if run.cluster is cluster and not run.done:
                run.stop(wait=True, timeout=60)
        if hasattr(cluster, "shutdown"):
            with _usage_errors():
                cluster.shutdown()
        else:
            cluster.close()
        cost = cluster.cost()
        for view in self.views.pop(cluster.name, []):
            view.update()  # the final state, now that the loop that drove it is gone
            view.stop()
        self.clusters.pop(cluster.name, None)
        if self.cluster is cluster:
            self.cluster = None
        print(
            f"Cluster {cluster.name} is down: ${cost.total:.4f} spent, "
            f"${cost.total_on_demand:.4f} on demand, saved {cost.saved_fraction:.0%}."
        )

    def _do_list(self, args: argparse.Namespace) -> Any:
        import pandas as pd

        now = time.time()
        rows = [
            {
                "name": e["name"],
                "state": "stale (owner gone)" if e.get("stale") else "running",
                "owner": "this kernel" if e.get("pid") == os.getpid() else registry.owner(e),
                "backend": e.get("backend"),
                "gpu": e.get("gpu"),
                "zone": e.get("zone"),
                "pricing": "spot" if e.get("spot") else "on-demand",
                "scheduler": e.get("scheduler_address"),
                "up for": f"{(now - float(e.get('registered', now))) / 60:.1f} min",
            }
            for e in registry.entries()
        ]
        if not rows:
            print("No transient clusters are running; start one with %transient_cluster up.")
            return None
        return pd.DataFrame(rows).set_index("name")

    def _do_connect(self, args: argparse.Namespace) -> Any:
        from transient_nb.deploy.connect import connect

        with _usage_errors("%transient_cluster connect: "):
            cluster = connect(args.name)
        return self._adopt(cluster, args.var, not args.no_panel)

    # -- the cell form ------------------------------------------------------------------------------
    def _run_cell(self, line: str, cell: str) -> Any:
        from transient_nb.deploy.cluster import TransientCluster

        args = _parse(_cell, line, "(cell)")
        cluster_kwargs, train_kwargs = cell_spec(cell)
        if train_kwargs is not None:
            # Names of the notebook's variables stand for what they hold; other text is a
            # built-in name or import path. Checked before anything starts, as train() checks it.
            train_kwargs = self._named(train_kwargs)
            check_train(train_kwargs, cluster_kwargs)
        with _usage_errors("cluster: "):
            cluster = TransientCluster(**cluster_kwargs)
        if train_kwargs is None:
            return self._adopt(cluster, args.var, not args.no_panel)
        # The run's panel shows the cluster too: one panel, not two.
        self._adopt(cluster, args.var, False)
        wait = bool(train_kwargs.pop("wait", False))
        return self._start_run(
            train_kwargs, args.run_var, not args.no_dashboard, wait, with_cluster=not args.no_panel
        )


def _help() -> str:
    doc = inspect.cleandoc(TransientMagics.transient_cluster.__doc__ or "")
    parts = [doc, "Subcommands\n-----------"]
    for func in SUBCOMMANDS.values():
        parts.append(func.parser.format_help().rstrip())
    parts.append("Cell form\n---------")
    parts.append(_cell.parser.format_help().rstrip())
    return "\n\n".join(parts)


# `%transient_cluster?` shows the magic's docstring: make it the whole help, every subcommand's
# options included, generated from the very parsers that parse them.
TransientMagics.transient_cluster.__doc__ = _help()


def display_view(obj: Any) -> None:
    """IPython display hook for clusters and runs: their live control panel.

    Skips the object the magic returns when the magic has just shown its panel in this cell.
    """
    from IPython import get_ipython

    shell = get_ipython()
    count = shell.execution_count if shell is not None else None
    if _shown.pop(id(obj), None) == count and count is not None:
        return
    from transient_nb.notebook.views.panel import panel_for

    display(panel_for(obj))


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext transient_nb``: the magics, and clusters and runs that display as panels."""
    from transient_nb.deploy.cluster import TransientCluster
    from transient_nb.deploy.remote import RemoteCluster

    ipython.register_magics(TransientMagics)
    formatter = ipython.display_formatter.ipython_display_formatter
    formatter.for_type(TransientCluster, display_view)
    formatter.for_type(RemoteCluster, display_view)
    # By name: registering must not import the training code (and torch) before it is used.
    formatter.for_type_by_name("transient_nb.training.run", "TrainingRun", display_view)


def unload_ipython_extension(ipython: Any) -> None:
    """``%unload_ext transient_nb``: clusters and runs display as plain objects again."""
    from transient_nb.deploy.cluster import TransientCluster
    from transient_nb.deploy.remote import RemoteCluster

    formatter = ipython.display_formatter.ipython_display_formatter
    for cls in (TransientCluster, RemoteCluster):
        formatter.pop(cls, None)
    formatter.deferred_printers.pop(("transient_nb.training.run", "TrainingRun"), None)
    run = sys.modules.get("transient_nb.training.run")  # registered by name: never import torch
    if run is not None:
        formatter.type_printers.pop(run.TrainingRun, None)
