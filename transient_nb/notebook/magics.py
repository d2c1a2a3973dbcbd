"""IPython magics: ``%transient_cluster`` (line) and ``%%transient_cluster`` (cell).

Load with ``%load_ext transient_nb``. The magics only parse what the user typed and call the public
Python API (:class:`~transient_nb.TransientCluster`, :func:`~transient_nb.train`,
:func:`~transient_nb.connect`, the views); every mistake is an IPython ``UsageError`` whose one
sentence says what to type instead.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import keyword
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import yaml
from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from IPython.display import display

from transient_nb import config, limits
from transient_nb.catalog.mix import format_mix, parse_mix, zero_mix
from transient_nb.deploy import registry

#: Execution count at which the magic itself displayed the view of an object (by ``id``): the
#: same object returned as the cell's result is then not displayed a second time.
_shown: dict[int, int] = {}

#: Keyword arguments of the local backend that a ``cluster:`` mapping may also give.
BACKEND_OPTIONS = ("stockouts", "nthreads", "cuda", "death_timeout")


# -- argument types: each error says what to type ---------------------------------------------------
def _whole(what: str, minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a whole number of {what} of at least {minimum}; type e.g. "
                f"{max(minimum, 4)}"
            )
        return value

    parse.__name__ = f"whole number of {what}"
    return parse


def _workers(minimum: int) -> Callable[[str], int | dict[str, int]]:
    """A number of workers, or a mix of GPU types such as ``k80=2,p100=1,v100=1``."""

    def parse(text: str) -> int | dict[str, int]:
        if "=" not in text:
            return _whole("workers", minimum)(text)
        try:
            return parse_mix(text, "")
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    parse.__name__ = "number of workers or TYPE=COUNT,..."
    return parse


def _on_demand(text: str) -> int | dict[str, int]:
    """``scale --on-demand``: a number of workers (of the type N counts) or TYPE=COUNT pairs such
    as ``v100=1``; ``0``, or every type at 0, is none on demand."""
    if zero_mix(text):
        return {}
    return _workers(0)(text)


_on_demand.__name__ = "number of workers or TYPE=COUNT,..."


def _positive(what: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = -1.0
        if not value > 0:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a positive number of {what}; type e.g. 120"
            )
        return value

    parse.__name__ = f"positive number of {what}"
    return parse


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a fraction in (0, 1]; type e.g. 0.9")
    return value


def _names(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _variable(text: str) -> str:
    if not text.isidentifier() or keyword.iskeyword(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a Python variable name; type e.g. --as cluster"
        )
    return text


def _bind_as(default: str, what: str) -> argument:
    """The ``--as VAR`` option of the subcommands that bind a variable."""
    return argument(
        "--as",
        dest="var",
        type=_variable,
        default=default,
        metavar="VAR",
        help=f"variable to bind the {what} to (default: {default})",
    )


#: ``--no-panel``, shared by the subcommands that show the control panel.
_NO_PANEL = argument("--no-panel", action="store_true", help="do not show the control panel")


# -- the subcommands' parsers (their help is the magic's help) --------------------------------------
@magic_arguments(name="transient_cluster up")
@argument(
    "--workers",
    type=_workers(1),
    metavar="N|TYPE=N,...",
    help="GPU workers (default: config), or a mix of GPU types such as k80=2,p100=1,v100=1",
)
@argument("--gpu", help="GPU type, a key of the price catalog (t4, l4, v100, k80, ...)")
@argument("--spot", dest="spot", action="store_true", default=None, help="Spot workers")
@argument("--on-demand", dest="spot", action="store_false", help="on-demand workers")
@argument("--zone", help="zone of the workers, e.g. us-central1-a")
@argument("--ps-hosts", type=_whole("PS hosts", 1), metavar="N", help="PS hosts (default 1)")
@argument(
    "--preemption",
    help="none | paper:k80 | paper:v100 | exp:mean=60s | trace:PATH | "
    "'zones:us-central1-a=exp:mean=300s;*=paper' (local backend)",
)
@argument("--name", help="cluster name (lowercase letters, digits, dashes)")
@argument("--backend", help="local (the default) or gce")
@argument(
    "--time-scale",
    type=_positive("simulated seconds per second"),
    metavar="X",
    help="simulated seconds per wall second (120: an hour in 30 s)",
)
@argument("--provisioning-delay", metavar="DURATION", help="'paper' or e.g. 5s (simulated)")
@argument("--notice", metavar="DURATION", help="preemption notice, e.g. 30s (simulated)")
@argument("--prices", metavar="CATALOG", help="gce-2025, paper-2019 or a YAML path")
@argument("--fallback-zones", type=_names, metavar="Z1,Z2", help="zones to try when one runs out")
@argument("--fallback-gpus", type=_names, metavar="G1,G2", help="GPU types to try next")
@argument("--seed", type=_whole("seed", 0), help="seed of the simulator's draws")
@argument(
    "--max-workers", type=_whole("workers", 1), metavar="N", help="refuse more workers than this"
)
@argument(
    "--max-hourly-cost",
    type=_positive("dollars per hour"),
    metavar="USD",
    help="refuse workers that could cost more per hour than this",
)
@argument(
    "--detach",
    action="store_true",
    help="run the cluster and its training in a head process that outlives this kernel",
)
@_bind_as("cluster", "cluster")
@_NO_PANEL
def _up() -> None:
    """Start a cluster, bind it to a variable, show its control panel and return it."""


@magic_arguments(name="transient_cluster scale")
@argument(
    "n",
    type=_workers(0),
    metavar="N|TYPE=N,...",
    help="number of GPU workers to keep (of type --gpu), or a whole mix such as k80=2,v100=1",
)
@argument("--gpu", help="the GPU type that N counts (a mixed cluster needs it); others keep theirs")
@argument(
    "--on-demand",
    dest="on_demand",
    type=_on_demand,
    metavar="N|TYPE=N,...",
    help="how many of the workers run on demand (a Spot cluster): a number of the type N counts, "
    "or per type such as v100=1 (types left out: none)",
)
def _scale() -> None:
    """Keep N GPU workers (the PS host is extra): ``scale 3``, ``scale 3 --gpu v100`` (3 of that
    type, the other types unchanged), or ``scale k80=2,v100=1`` (the whole mix);
    ``--on-demand 1`` runs one of them on demand (never revoked), the rest Spot."""


@magic_arguments(name="transient_cluster scale-ps")
@argument("n", type=_whole("PS hosts", 1), metavar="N", help="number of PS hosts to keep (1-4)")
def _scale_ps() -> None:
    """Keep N PS hosts, one PS shard each: ``scale-ps 2``. Only grows; a run started without
    ``shards=`` splits its PS onto the new hosts (where fast GPUs saturate one PS)."""


@magic_arguments(name="transient_cluster move-ps")
@argument(
    "zone",
    metavar="ZONE",
    help="zone to move the PS hosts to: the cluster's zone or one of its fallback zones",
)
@argument("--reason", default="", help="said in the ps-move event")
def _move_ps() -> None:
    """Move the PS hosts to ZONE: ``move-ps us-east1-c``. New PS hosts start there, a run moves
    its PS onto them from its own state (a ``ps-moved`` event), and the old hosts are given back."""


@magic_arguments(name="transient_cluster adapt")
@argument(
    "goal",
    metavar="GOAL",
    help="deadline:DURATION (e.g. deadline:2h), budget:DOLLARS, cost-per-step, or off",
)
@argument("--gpus", type=_names, metavar="G1,G2", help="GPU types it may use")
@argument("--max-workers", type=_whole("workers", 1), metavar="N", help="largest cluster")
@argument("--interval", metavar="DURATION", help="how often it decides (default 30s)")
@argument(
    "--spot-only",
    action="store_true",
    help="keep every worker Spot (by default it may run some on demand where the goal needs them)",
)
@argument(
    "--history",
    metavar="PATH",
    help="plan from what earlier runs saw (kept in PATH, and this run added); default: the "
    "configuration's policy.history",
)
def _adapt() -> None:
    """Let the transient-aware policy choose the GPU mix for a goal (``off`` stops it); its
    decisions, with their reasons, are ``policy-decision`` events."""


@magic_arguments(name="transient_cluster preempt")
@argument(
    "target",
    nargs="?",
    default="1",
    metavar="COUNT-OR-NAME",
    help="how many workers (default 1), or a worker name such as w-1",
)
@argument("--no-notice", action="store_true", help="kill at once, without the notice")
def _preempt() -> None:
    """Preempt workers now, as the provider would (they are replaced by themselves)."""


@magic_arguments(name="transient_cluster status")
def _status() -> None:
    """A compact table: workers by state, GPU and zone, $/h now, $ so far, saved."""


@magic_arguments(name="transient_cluster train")
@argument(
    "--model",
    default="resnet32",
    help="resnet32 | resnet32-t2t | resnet20 | resnet8, or your own: a variable of the notebook "
    "(an nn.Module or its factory) or an import path pkg.mod:attr",
)
@argument(
    "--data",
    default="synthetic",
    help="synthetic | digits | cifar10:PATH-OR-URL, or a variable holding a (train, test) pair "
    "of Datasets (or its factory), or an import path",
)
@argument("--loss", help="cross_entropy (default) | mse | a variable or import path of a function")
@argument(
    "--metrics",
    metavar="M1,M2",
    help="accuracy, mse, or variables (functions (output, target) -> float) or import paths",
)
@argument("--optimizer", help="sgd (default) or a variable/import path of a torch.optim factory")
@argument("--stop-at", metavar="METRIC=X", help="stop at a metric's value, e.g. mae=0.3")
@argument("--collate-fn", help="a variable or import path: the DataLoader's collate_fn")
@argument("--num-workers", type=_whole("DataLoader workers", 0), help="DataLoader workers")
@argument("--steps", type=_whole("steps", 1), default=64_000, help="global steps (default 64000)")
@argument("--batch-size", type=_whole("images", 1), default=128, help="images per worker step")
@argument("--lr", type=_positive("learning rate"), default=0.1, help="base learning rate")
@argument(
    "--shards",
    type=_whole("PS shards", 1),
    help="parameter-server shards (default: one per PS host)",
)
@argument("--target-accuracy", type=_fraction, help="stop at this test accuracy, e.g. 0.9")
@argument("--budget", type=_positive("dollars"), help="stop when this many dollars are spent")
@argument("--deadline", metavar="DURATION", help="stop after this long, e.g. 2h")
@argument("--eval-every", type=_whole("steps", 1), help="steps between evaluations")
@argument("--eval-images", type=_whole("images", 1), help="test images per evaluation")
@argument("--checkpoint-every", type=_whole("steps", 1), help="steps between PS checkpoints")
@argument("--checkpoint-url", metavar="URL", help="fsspec URL of the checkpoints")
@argument("--seed", type=_whole("seed", 0), default=0)
@_bind_as("run", "run")
@argument("--no-dashboard", action="store_true", help="do not show the live dashboard")
@argument("--wait", action="store_true", help="block until the run finishes")
def _train() -> None:
    """Start asynchronous PS training in the background, show the live dashboard, return the run."""


@magic_arguments(name="transient_cluster save")
@argument("path", metavar="PATH", help="file (or fsspec URL) to write the state dict to")
@argument("--run", dest="run_var", metavar="VAR", help="the run's variable (default: the latest)")
def _save() -> None:
    """Write the latest run's trained weights (``run.save(PATH)``): the newest of the PS, or of
    its checkpoints once it has ended; ``model.load_state_dict(torch.load(PATH))`` reads them."""


@magic_arguments(name="transient_cluster estimate")
@argument("--model", default="resnet32", help="a built-in name, a variable or an import path")
@argument("--data", default="synthetic", help="a built-in spec, a variable or an import path")
@argument("--loss", help="cross_entropy (default), mse, a variable or an import path")
@argument(
    "--workers",
    type=_workers(1),
    metavar="TYPE=N,...",
    help="GPU types and the largest cluster of each, e.g. t4=4,v100=2",
)
@argument("--steps", type=_whole("steps", 1), default=64_000, help="global steps")
@argument("--batch-size", type=_whole("items", 1), default=128, help="items per worker step")
@argument("--shards", type=_whole("PS shards", 1), default=1, help="PS shards")
@argument("--prices", metavar="CATALOG", help="gce-2025, paper-2019 or a YAML path")
@argument("--measured", metavar="TYPE=STEPS_PER_S", help="measured rates: replace the estimate")
def _estimate() -> None:
    """What a cluster would do for a model before renting anything: time, money and the PS
    bottleneck per GPU type and size (:func:`transient_nb.estimate`)."""


@magic_arguments(name="transient_cluster down")
@argument("name", nargs="?", metavar="NAME", help="cluster to close (default: the current one)")
def _down() -> None:
    """Stop its training runs and close the cluster."""


@magic_arguments(name="transient_cluster list")
def _list() -> None:
    """Every transient cluster this user has running, in this kernel or any other."""


@magic_arguments(name="transient_cluster connect")
@argument("name", metavar="NAME", help="the cluster's name (see %%transient_cluster list)")
@_bind_as("cluster", "handle")
@_NO_PANEL
def _connect() -> None:
    """Attach to a cluster another kernel owns: control (scale, preempt, down) and live views."""


@magic_arguments(name="%transient_cluster")
@argument("--as", dest="var", type=_variable, default="cluster", metavar="VAR")
@argument("--run-as", dest="run_var", type=_variable, default="run", metavar="VAR")
@_NO_PANEL
@argument("--no-dashboard", action="store_true", help="do not show the live dashboard")
def _cell() -> None:
    """Cell form: the body is YAML with a ``cluster:`` mapping (TransientCluster arguments) and an
    optional ``train:`` mapping (train() arguments)."""


SUBCOMMANDS: dict[str, Any] = {
    "up": _up,
    "scale": _scale,
    "scale-ps": _scale_ps,
    "move-ps": _move_ps,
    "adapt": _adapt,
    "preempt": _preempt,
    "status": _status,
    "train": _train,
    "save": _save,
    "estimate": _estimate,
    "down": _down,
    "list": _list,
    "connect": _connect,
}
#: Subcommands that act on the current cluster.
NEEDS_CLUSTER = ("scale", "scale-ps", "move-ps", "adapt", "preempt", "status", "train", "down")


@contextmanager
def _usage_errors(prefix: str = "") -> Iterator[None]:
    """Re-raise the API's input errors as UsageError, with their message."""
    try:
        yield
    except UsageError:
        raise
    except (ValueError, KeyError, TypeError) as e:
        message = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        raise UsageError(f"{prefix}{message}") from None


def _parse(func: Any, argstring: str, command: str) -> argparse.Namespace:
    try:
        return parse_argstring(func, argstring)
    except UsageError as e:
        raise UsageError(
            f"%transient_cluster {command}: {e}; see %transient_cluster? for the options."
        ) from None
    except ValueError as e:  # unbalanced quotes
        raise UsageError(f"%transient_cluster {command}: {e}; check the quotes.") from None


def _kwargs(args: argparse.Namespace, names: tuple[str, ...]) -> dict[str, Any]:
    return {n: getattr(args, n) for n in names if getattr(args, n) is not None}


def _signature_names(func: Any, drop: tuple[str, ...]) -> list[str]:
    return [
        p.name
        for p in inspect.signature(func).parameters.values()
        if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and p.name not in drop
    ]


def _settings(body: Any, what: str, allowed: list[str]) -> dict[str, Any]:
    if body is None:
        return {}
    if not isinstance(body, Mapping):
        raise UsageError(
            f"`{what}:` must be a mapping of settings, e.g. `{what}:` then `  workers: 4` "
            "on the next line."
        )
    out: dict[str, Any] = {}
    for key, value in body.items():
        name = str(key).replace("-", "_")
        if name not in allowed:
            raise UsageError(f"Unknown {what} setting {key!r}: use some of {', '.join(allowed)}.")
        out[name] = value
    return out


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

        kwargs = _kwargs(
            args,
            (
                "workers",
                "gpu",
                "spot",
                "zone",
                "preemption",
                "name",
                "backend",
                "time_scale",
                "provisioning_delay",
                "notice",
                "prices",
                "fallback_zones",
                "fallback_gpus",
                "seed",
                "max_workers",
                "max_hourly_cost",
                "ps_hosts",
            ),
        )
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
            if args.history and goal is not None:
                kwargs["history"] = args.history
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
        kwargs = _kwargs(
            args,
            (
                "model",
                "data",
                "steps",
                "batch_size",
                "lr",
                "shards",
                "target_accuracy",
                "budget",
                "deadline",
                "eval_every",
                "eval_images",
                "checkpoint_every",
                "checkpoint_url",
                "seed",
                "loss",
                "metrics",
                "optimizer",
                "stop_at",
                "collate_fn",
                "num_workers",
            ),
        )
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
        from transient_nb.deploy.settings import ClusterSettings

        args = _parse(_cell, line, "(cell)")
        try:
            spec = yaml.safe_load(cell)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark is not None else ""
            problem = getattr(e, "problem", None) or "not valid YAML"
            raise UsageError(
                f"The cell is not valid YAML{where} ({problem}): write `cluster:` then indented "
                "`key: value` lines."
            ) from None
        if spec is None:
            raise UsageError(
                "The cell is empty: write a `cluster:` mapping (e.g. `workers: 4`) and, "
                "optionally, a `train:` mapping."
            )
        if not isinstance(spec, Mapping):
            raise UsageError(
                "The cell must be a YAML mapping with `cluster:` and, optionally, `train:`."
            )
        unknown = [k for k in spec if k not in ("cluster", "train")]
        if unknown:
            raise UsageError(
                f"Unknown section {unknown[0]!r}: the cell takes `cluster:` and `train:` only."
            )
        allowed = [
            *_signature_names(ClusterSettings.from_arguments, ("cluster_id",)),
            "detached",
        ]
        cluster_kwargs = _settings(spec.get("cluster"), "cluster", [*allowed, *BACKEND_OPTIONS])
        train_kwargs: dict[str, Any] | None = None
        if spec.get("train") is not None or "train" in spec:
            from transient_nb.training.hparams import HParams
            from transient_nb.training.run import check_checkpoint_url, check_train_args, train

            # train()'s own arguments and, through its **hparams, every HParams field.
            hparam_names = [f.name for f in dataclasses.fields(HParams)]
            train_kwargs = _settings(
                spec.get("train") or {},
                "train",
                [*_signature_names(train, ("cluster",)), *hparam_names],
            )
            # Checked before anything starts, as train() checks it (the model built, one batch
            # run, the hyperparameters validated): a typo costs nothing. Names of the notebook's
            # variables stand for what they hold; other text is a built-in name or import path.
            train_kwargs = self._named(train_kwargs)
            with _usage_errors("train: "):
                not_checked = ("budget", "checkpoint_url", "seed", "device", "wait", "resume")
                check_train_args(**{k: v for k, v in train_kwargs.items() if k not in not_checked})
                # On a cloud backend: shared storage, probed with a write, before any VM is made.
                check_checkpoint_url(
                    train_kwargs.get("checkpoint_url"),
                    str(config.get("backend", override_with=cluster_kwargs.get("backend"))),
                )
                limits.dollars(train_kwargs.get("budget"), "budget")
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
